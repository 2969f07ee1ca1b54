"""Claims that can fail: a paper's assertion, the arm that makes it, and the stand-in arms it must reject.

A reproduction runs named *arms* (the method, its baselines, ablations, a random score, the untrained model) and
collects their results in one flat ``dict``. A :class:`Claim` is a bound on one number computed from those results
with an arm in the method's place: ``value(results, arm) >= at_least`` (or ``<= at_most``). It is evaluated for
the method and for every stand-in arm; it *holds* when the method meets the bound and every stand-in misses it. A
claim that a stand-in passes too says nothing about the paper, so each claim names at least one stand-in, and the
stand-in's results must be in the run (a missing one is an error, not a silent pass).

A comparison that no stand-in can fail (the baseline is in range, the loss went down) is a :class:`Check`: reported
under ``checks/...``, never ``claims/...``. A claim that holds on some seeds only is built with ``asserted=False``
and reported under ``reported/...``, so the tests do not assert it.

What :func:`evaluate` adds to the results (all numbers, 1.0 = true):

* ``claims/<name>`` (or ``reported/<name>``): the method meets the bound *and* every stand-in misses it;
* ``values/<name>/<arm>``: the claim's number for the method and each stand-in;
* ``rejects/<name>/<stand-in>``: the stand-in misses the bound;
* ``seeds_held/<name>``: with per-seed results, the share of seeds on which the method meets the bound;
* ``checks/<name>`` and ``values/<name>``: a check's verdict and number.

Example:
    >>> r = {"ra/stability": 0.41, "ra-init/stability": 0.97, "topk/stability": 0.18, "topk/r2": 0.66}
    >>> claim = Claim(
    ...     "ra_more_stable_than_topk_by_0.2",
    ...     lambda r, arm: r[f"{arm}/stability"] - r["topk/stability"],
    ...     at_least=0.2,
    ...     method="ra",
    ...     stand_ins={"topk": "the baseline in the method's place"},
    ... )
    >>> out = evaluate(r, [claim])
    >>> out["claims/ra_more_stable_than_topk_by_0.2"], out["rejects/ra_more_stable_than_topk_by_0.2/topk"]
    (1.0, 1.0)
    >>> weak = Claim("weak", claim.value, at_least=0.2, method="ra", stand_ins={"ra-init": "untrained"})
    >>> evaluate(r, [weak])["claims/weak"]  # the untrained stand-in passes too, so the claim fails
    0.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Claim", "Check", "describe", "evaluate", "seed_views", "verdicts"]

_SEED_KEY = re.compile(r"^(?P<base>.+)/seed(?P<seed>\d+)$")


def _bounds_text(at_least: float | None, at_most: float | None) -> str:
    parts = [f">= {at_least:g}"] if at_least is not None else []
    parts += [f"<= {at_most:g}"] if at_most is not None else []
    return " and ".join(parts)


def _meets(value: float, at_least: float | None, at_most: float | None) -> bool:
    if math.isnan(value):
        return False
    return (at_least is None or value >= at_least) and (at_most is None or value <= at_most)


def _check_bounds(name: str, at_least: float | None, at_most: float | None) -> None:
    if at_least is None and at_most is None:
        raise ValueError(f"{name!r}: give `at_least` or `at_most` (the bound the value must meet)")
    if not re.fullmatch(r"[\w.+\-=<>]+", name):
        raise ValueError(f"{name!r}: a claim or check name is one path segment (letters, digits, _ . + - = < >)")


@dataclass(frozen=True)
class Check:
    """A sanity comparison no stand-in fails: the baseline behaves, the run converged. Reported, asserted by tests.

    Args:
        name: one path segment, e.g. ``"plain_in_distribution_at_least_0.85"``.
        value: ``value(results) -> float``, the number bounded.
        at_least / at_most: the bound(s).
        text: the check in words (printed beside the verdict).
    """

    name: str
    value: Callable[[Mapping[str, Any]], float]
    at_least: float | None = None
    at_most: float | None = None
    text: str = ""

    def __post_init__(self) -> None:
        _check_bounds(self.name, self.at_least, self.at_most)

    def meets(self, value: float) -> bool:
        return _meets(value, self.at_least, self.at_most)


@dataclass(frozen=True)
class Claim:
    """A paper's assertion as a bound on a number computed with an arm in the method's place.

    Args:
        name: one path segment, e.g. ``"ra_more_stable_than_topk_by_0.20"``.
        value: ``value(results, arm) -> float``: the number the claim bounds, read with ``arm`` where the method's
            results would be (``lambda r, a: r[f"{a}/acc"] - r["random/acc"]``).
        method: the arm of the paper's method.
        stand_ins: arm -> why it is a stand-in (the baseline in the method's place, the key component off, a random
            score, the model at initialisation). At least one; each must be among the run's arms.
        at_least / at_most: the bound(s) the method meets and every stand-in misses.
        asserted: ``False`` for a claim that holds on some seeds only, or did not reproduce: reported under
            ``reported/...`` and not asserted by the tests.
        text: the claim in the card's words.

    Raises:
        ValueError: no bound, no stand-in, or the method listed among its own stand-ins.
    """

    name: str
    value: Callable[[Mapping[str, Any], str], float]
    method: str
    stand_ins: Mapping[str, str]
    at_least: float | None = None
    at_most: float | None = None
    asserted: bool = True
    text: str = ""

    def __post_init__(self) -> None:
        _check_bounds(self.name, self.at_least, self.at_most)
        if not self.stand_ins:
            raise ValueError(
                f"claim {self.name!r} names no stand-in arm: a comparison no stand-in can fail is a Check"
            )
        if self.method in self.stand_ins:
            raise ValueError(f"claim {self.name!r}: the method arm {self.method!r} cannot be its own stand-in")

    @property
    def prefix(self) -> str:
        return "claims" if self.asserted else "reported"

    def value_for(self, results: Mapping[str, Any], arm: str) -> float:
        """The claim's number with ``arm`` in the method's place; a clear error when that arm was not run."""
        try:
            return float(self.value(results, arm))
        except KeyError as err:
            role = "method" if arm == self.method else "stand-in"
            raise KeyError(
                f"claim {self.name!r}: no result {err.args[0]!r} for its {role} arm {arm!r}; the reproduction must "
                "run every arm its claims name"
            ) from None

    def meets(self, value: float) -> bool:
        return _meets(value, self.at_least, self.at_most)


def seed_views(results: Mapping[str, Any], seeds: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
    """One view of the results per seed: each ``<key>/seed<s>`` read as ``<key>``; keys without seeds kept.

    Example:
        >>> seed_views({"a/acc": 0.5, "a/acc/seed0": 0.4, "a/acc/seed1": 0.6, "n": 3})[1]
        {'a/acc': 0.6, 'n': 3}
    """
    per_seed: dict[int, dict[str, Any]] = {}
    for key, value in results.items():
        m = _SEED_KEY.match(key)
        if m:
            per_seed.setdefault(int(m["seed"]), {})[m["base"]] = value
    wanted = sorted(per_seed) if seeds is None else list(seeds)
    shared = {k: v for k, v in results.items() if not _SEED_KEY.match(k)}
    return {s: {**shared, **per_seed.get(s, {})} for s in wanted}


def evaluate(
    results: Mapping[str, Any], claims: Sequence[Claim] = (), checks: Sequence[Check] = (), per_seed: bool = True
) -> dict[str, float]:
    """Evaluate claims (method and every stand-in) and checks on ``results``; returns the keys to add (see above).

    With ``per_seed`` and ``<key>/seed<s>`` results present, each claim is also evaluated seed by seed
    (``seeds_held/<name>``); a claim whose numbers have no per-seed form is read from the means on every view.
    """
    names = [c.name for c in claims] + [c.name for c in checks]
    if len(set(names)) != len(names):
        raise ValueError(f"claim and check names must be unique, got {sorted(names)}")
    out: dict[str, float] = {}
    views = seed_views(results) if per_seed else {}
    for claim in claims:
        method_value = claim.value_for(results, claim.method)
        out[f"values/{claim.name}/{claim.method}"] = method_value
        rejected = []
        for arm in claim.stand_ins:
            value = claim.value_for(results, arm)
            out[f"values/{claim.name}/{arm}"] = value
            out[f"rejects/{claim.name}/{arm}"] = float(not claim.meets(value))
            rejected.append(not claim.meets(value))
        out[f"{claim.prefix}/{claim.name}"] = float(claim.meets(method_value) and all(rejected))
        if len(views) > 1:
            held = [claim.meets(claim.value_for(view, claim.method)) for view in views.values()]
            out[f"seeds_held/{claim.name}"] = sum(held) / len(held)
    for check in checks:
        value = float(check.value(results))
        out[f"values/{check.name}"] = value
        out[f"checks/{check.name}"] = float(check.meets(value))
    return out


def verdicts(results: Mapping[str, Any]) -> dict[str, list[str]]:
    """What failed in evaluated results: ``{"claims": [...], "stand_ins_passed": [...], "checks": [...]}``.

    A claim with no ``rejects/`` entry is listed under ``"no_stand_in"``: the contract tests require one.
    """
    claims = [k[7:] for k in results if k.startswith("claims/")]
    return {
        "claims": [n for n in claims if results[f"claims/{n}"] != 1.0],
        "stand_ins_passed": [k[8:] for k, v in results.items() if k.startswith("rejects/") and v != 1.0],
        "checks": [k[7:] for k, v in results.items() if k.startswith("checks/") and v != 1.0],
        "no_stand_in": [n for n in claims if not any(k.startswith(f"rejects/{n}/") for k in results)],
    }


def describe(claim: Claim | Check) -> str:
    """The bound in words, e.g. ``">= 0.2"``."""
    return _bounds_text(claim.at_least, claim.at_most)
