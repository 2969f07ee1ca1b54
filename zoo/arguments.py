"""Argument checks for public constructors: refuse an impossible argument in ``__init__``, naming what is accepted.

Lightning and torchmetrics refuse bad arguments where the object is built (``EarlyStopping(mode="maximum")``), not
at the first step an hour later. Every zoo constructor that takes a probability, a count, a weight, a mode string
or a clamp range checks it with these helpers, so the messages read the same everywhere::

    Expected argument `p` to be a finite float in [0, 1], but got 1.5.
    Expected argument `mode` to be one of 'official', 'exact', but got 'Exakt' (did you mean 'exact'?).
    Expected argument `lambda_clamp` to be (low, high) with low <= high, but got (10, 0.1).

``bool`` is refused where a number is expected (``True`` is an ``int`` to Python, never a count to a user), and NaN and
infinities fail every range.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["check_choice", "check_interval", "check_probability", "check_range"]


def _is_number(value: Any, integer: bool) -> bool:
    """A real number (numpy scalars too), an integral one with ``integer``; never a bool."""
    if isinstance(value, bool) or (hasattr(value, "dtype") and value.dtype == bool):
        return False
    return isinstance(value, numbers.Integral if integer else numbers.Real)


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    optional: bool = False,
) -> None:
    """Refuse ``value`` unless it is a number (an ``int`` with ``integer``) within ``[low, high]``.

    Args:
        name: the argument's name, as the user wrote it.
        value: the argument.
        low / high: the bounds (``None``: unbounded on that side).
        low_open / high_open: exclude the bound itself (``low_open=True, low=0``: strictly positive).
        integer: require an ``int``.
        optional: accept ``None`` as well.

    Raises:
        ValueError: ``"Expected argument `name` to be <what>, but got <value>."``

    Example:
        >>> check_range("steps", 10, low=1, integer=True)
        >>> check_range("lr", -1.0, low=0, low_open=True)
        Traceback (most recent call last):
            ...
        ValueError: Expected argument `lr` to be a finite float > 0, but got -1.0.
    """
    if optional and value is None:
        return
    ok = _is_number(value, integer) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if ok:
        return
    kind = "an int" if integer else "a finite float"
    if low is not None and high is not None:
        what = f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        what = f"{kind} {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        what = f"{kind} {'<' if high_open else '<='} {high:g}"
    else:
        what = kind
    raise ValueError(f"Expected argument `{name}` to be {what}{' or None' if optional else ''}, but got {value!r}.")


def check_probability(name: str, value: Any, *, open_low: bool = False, open_high: bool = False) -> None:
    """Refuse ``value`` unless it is a float in ``[0, 1]`` (ends excluded with ``open_low`` / ``open_high``).

    Example:
        >>> check_probability("fpr", 0.01, open_low=True)
        >>> check_probability("fpr", 0.0, open_low=True)
        Traceback (most recent call last):
            ...
        ValueError: Expected argument `fpr` to be a finite float in (0, 1], but got 0.0.
    """
    check_range(name, value, 0.0, 1.0, low_open=open_low, high_open=open_high)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (compared exactly: ``"Exact"`` is not ``"exact"``).

    Example:
        >>> check_choice("alpha_ddof", "exact", ("official", "exact"))
        >>> check_choice("alpha_ddof", "Exakt", ("official", "exact"))
        Traceback (most recent call last):
            ...
        ValueError: Expected argument `alpha_ddof` to be one of 'official', 'exact', but got 'Exakt' (did you ...
    """
    choices = tuple(choices)
    if any(value == c and type(value) is type(c) for c in choices):
        return
    close = []
    if isinstance(value, str):
        import difflib

        close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"Expected argument `{name}` to be one of {', '.join(repr(c) for c in choices)}, but got {value!r}{hint}."
    )


def check_interval(name: str, value: Any, low: float | None = None, high: float | None = None) -> None:
    """Refuse ``value`` unless it is a pair ``(lo, hi)`` of numbers with ``lo <= hi``, both within ``[low, high]``.

    Example:
        >>> check_interval("lambda_clamp", (0.1, 10.0), low=0)
        >>> check_interval("lambda_clamp", (10, 0.1))
        Traceback (most recent call last):
            ...
        ValueError: Expected argument `lambda_clamp` to be (low, high) with low <= high, but got (10, 0.1).
    """
    pair = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    ok = (
        pair is not None
        and len(pair) == 2
        and all(_is_number(v, False) and math.isfinite(v) for v in pair)
        and pair[0] <= pair[1]
    )
    if ok and low is not None:
        ok = pair[0] >= low
    if ok and high is not None:
        ok = pair[1] <= high
    if ok:
        return
    within = ""
    if low is not None or high is not None:
        within = f", both within [{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
    raise ValueError(f"Expected argument `{name}` to be (low, high) with low <= high{within}, but got {value!r}.")
