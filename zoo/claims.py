"""Claims that can fail: a paper's assertion, the arm that makes it, and the stand-in arms it must reject.

A reproduction runs named *arms* (the method, the paper's baselines, ablations, cheap alternatives) and collects
their results in one flat ``dict``. A :class:`Claim` is a bound on one number computed from those results with an
arm in the method's place: ``value(results, arm) >= at_least`` (or ``<= at_most``). It is evaluated for the method
and for every stand-in arm; it *holds* when the method meets the bound and every stand-in misses it. A claim that a
stand-in passes too says nothing about the paper.

Stand-ins come in three kinds (the evidence standard), each run in the method's place:

* ``baselines``: the methods the paper compares against for this claim (its tables' rows that fit the task);
* ``ablations``: the method with its distinguishing component removed or switched to the plain choice;
* ``alternatives``: the cheapest thing a practitioner would try first (a non-learned heuristic, a standard trick).

A kind may be empty only with a one-line reason (``why_none={"ablations": "..."}``), printed with the claim. An
untrained model or a random score is a fine extra stand-in, never the only one. Reproductions not yet brought up to
the standard name unclassified ``stand_ins`` instead (their pages say "evidence standard: pending").

A comparison that no stand-in can fail (the baseline is in range, the loss went down) is a :class:`Check`: reported
under ``checks/...``, never ``claims/...``. A :class:`TaskCheck` is the check that the embedded task needs the method:
every non-learned heuristic stays clearly below it. A claim that holds on some seeds only is built with
``asserted=False`` and reported under ``reported/...``, so the tests do not assert it. The paper's headline claims,
judged by the claims that test them, are :class:`zoo.evidence.Headline` s.

What :func:`evaluate` adds to the results (all numbers, 1.0 = true):

* ``claims/<name>`` (or ``reported/<name>``): the method meets the bound *and* every stand-in misses it;
* ``values/<name>/<arm>``: the claim's number for the method and each stand-in;
* ``rejects/<name>/<stand-in>``: the stand-in misses the bound;
* ``bounds/<name>/at_least`` / ``bounds/<name>/at_most``: the bound the run judged against;
* ``seeds_held/<name>``: with per-seed results, the share of seeds on which the method meets the bound;
* ``checks/<name>`` and ``values/<name>``: a check's verdict and number (a task check's: the method's margin over
  the best heuristic, with ``values/<name>/<arm>`` for the method and each heuristic).

Example:
    >>> r = {"cv/saving": 0.21, "ppi/saving": 0.02, "human/saving": 0.0, "strat/saving": 0.12, "rand/saving": 0.0}
    >>> claim = Claim(
    ...     "cv_saves_at_least_0.15",
    ...     lambda r, arm: r[f"{arm}/saving"],
    ...     at_least=0.15,
    ...     method="cv",
    ...     baselines={"human": "human labels only", "ppi": "prediction-powered inference (alpha = 1)"},
    ...     ablations={"rand": "a random score as the control"},
    ...     alternatives={"strat": "post-stratification on the score"},
    ... )
    >>> out = evaluate(r, [claim])
    >>> out["claims/cv_saves_at_least_0.15"], out["rejects/cv_saves_at_least_0.15/strat"]
    (1.0, 1.0)
    >>> weak = Claim("weak", claim.value, at_least=0.1, method="cv", baselines={"human": "human only"},
    ...              alternatives={"strat": "post-stratification"}, why_none={"ablations": "nothing to remove"})
    >>> evaluate(r, [weak])["claims/weak"]  # the alternative passes too, so the claim fails
    0.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KINDS",
    "Check",
    "Claim",
    "TaskCheck",
    "describe",
    "evaluate",
    "seed_views",
    "verdicts",
]

KINDS = ("baselines", "ablations", "alternatives")

_SEED_KEY = re.compile(r"^(?P<base>.+)/seed(?P<seed>\d+)$")
_NAME = re.compile(r"[\w.+\-=<>]+")


def _bounds_text(at_least: float | None, at_most: float | None) -> str:
    parts = [f">= {at_least:g}"] if at_least is not None else []
    parts += [f"<= {at_most:g}"] if at_most is not None else []
    return " and ".join(parts)


def _meets(value: float, at_least: float | None, at_most: float | None) -> bool:
    if math.isnan(value):
        return False
    return (at_least is None or value >= at_least) and (at_most is None or value <= at_most)


def _check_name(name: str, what: str = "a claim or check") -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r}: {what} name is one path segment (letters, digits, _ . + - = < >)")


def _check_bounds(name: str, at_least: float | None, at_most: float | None) -> None:
    if at_least is None and at_most is None:
        raise ValueError(f"{name!r}: give `at_least` or `at_most` (the bound the value must meet)")
    if at_least is not None and at_most is not None and at_least > at_most:
        raise ValueError(f"{name!r}: at_least {at_least:g} is above at_most {at_most:g}; no value could meet both")
    _check_name(name)


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
class TaskCheck:
    """The embedded task needs the method: the method beats every non-learned heuristic by at least ``margin``.

    If a heuristic solves the embedded task, the task changes, not the claim. The margin is calibrated like a
    claim's: set below the smallest gap measured over the seeds.

    Args:
        value: ``value(results, arm) -> float``: the task's metric with ``arm`` in the method's place.
        method: the arm of the paper's method.
        heuristics: arm -> what the non-learned heuristic is (at least one).
        margin: how far the method must be ahead of the best heuristic, in the metric's units (>= 0).
        higher_is_better: the metric's direction (``False`` for an error or an MSE).
        name: one path segment starting with ``task_needs_the_method``.
        text: the check in words.

    Example:
        >>> c = TaskCheck(lambda r, a: r[f"{a}/mse"], method="cv", heuristics={"human": "the label mean"},
        ...               margin=0.0005, higher_is_better=False)
        >>> out = evaluate({"cv/mse": 0.0016, "human/mse": 0.0025}, checks=[c])
        >>> out["checks/task_needs_the_method"], round(out["values/task_needs_the_method"], 4)
        (1.0, 0.0009)
    """

    value: Callable[[Mapping[str, Any], str], float]
    method: str
    heuristics: Mapping[str, str]
    margin: float
    higher_is_better: bool = True
    name: str = "task_needs_the_method"
    text: str = ""

    def __post_init__(self) -> None:
        _check_name(self.name, "a task check")
        if not self.name.startswith("task_needs_the_method"):
            raise ValueError(f"{self.name!r}: a task check's name starts with 'task_needs_the_method'")
        if not self.heuristics:
            raise ValueError(f"task check {self.name!r} names no heuristic: run at least one non-learned one")
        if self.method in self.heuristics:
            raise ValueError(f"task check {self.name!r}: the method arm {self.method!r} cannot be a heuristic")
        if not isinstance(self.margin, (int, float)) or isinstance(self.margin, bool) or not self.margin >= 0:
            raise ValueError(f"task check {self.name!r}: expected `margin` >= 0 but got {self.margin!r}")

    @property
    def at_least(self) -> float:
        return float(self.margin)

    at_most = None

    def gap(self, results: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
        """(the method's lead over the best heuristic, each arm's number)."""
        numbers = {arm: float(self.value(results, arm)) for arm in (self.method, *self.heuristics)}
        sign = 1.0 if self.higher_is_better else -1.0
        best = max(sign * numbers[arm] for arm in self.heuristics)
        return sign * numbers[self.method] - best, numbers

    def meets(self, value: float) -> bool:
        return _meets(value, self.margin, None)


@dataclass(frozen=True)
class Claim:
    """A paper's assertion as a bound on a number computed with an arm in the method's place.

    Args:
        name: one path segment, e.g. ``"cv_saves_at_least_0.15"``.
        value: ``value(results, arm) -> float``: the number the claim bounds, read with ``arm`` where the method's
            results would be (``lambda r, a: r[f"{a}/acc"] - r["random/acc"]``).
        method: the arm of the paper's method.
        baselines / ablations / alternatives: arm -> why it stands in (see the module docstring). Each kind is
            non-empty, or named in ``why_none``.
        why_none: kind -> a one-line reason why that kind has no arm here.
        stand_ins: unclassified stand-ins, for reproductions not yet brought up to the evidence standard; not mixed
            with the kinds.
        at_least / at_most: the bound(s) the method meets and every stand-in misses.
        asserted: ``False`` for a claim that holds on some seeds only, or did not reproduce: reported under
            ``reported/...`` and not asserted by the tests.
        text: the claim in the card's words.

    Raises:
        ValueError: no bound, no stand-in, the method among its own stand-ins, an arm in two kinds, a kind empty
            without a reason, a reason for a kind that has arms, or kinds mixed with unclassified stand-ins.
    """

    name: str
    value: Callable[[Mapping[str, Any], str], float]
    method: str
    baselines: Mapping[str, str] = field(default_factory=dict)
    ablations: Mapping[str, str] = field(default_factory=dict)
    alternatives: Mapping[str, str] = field(default_factory=dict)
    why_none: Mapping[str, str] = field(default_factory=dict)
    stand_ins: Mapping[str, str] = field(default_factory=dict)
    at_least: float | None = None
    at_most: float | None = None
    asserted: bool = True
    text: str = ""

    def __post_init__(self) -> None:
        _check_bounds(self.name, self.at_least, self.at_most)
        unknown = sorted(set(self.why_none) - set(KINDS))
        if unknown:
            raise ValueError(f"claim {self.name!r}: why_none names {unknown}; the kinds are {list(KINDS)}")
        if self.stand_ins and (self.classified or self.why_none):
            raise ValueError(
                f"claim {self.name!r}: name its stand-ins by kind ({', '.join(KINDS)}) or as unclassified "
                "`stand_ins`, not both"
            )
        if not self.all_stand_ins:
            raise ValueError(
                f"claim {self.name!r} names no stand-in arm: a comparison no stand-in can fail is a Check"
            )
        if self.method in self.all_stand_ins:
            raise ValueError(f"claim {self.name!r}: the method arm {self.method!r} cannot be its own stand-in")
        seen: dict[str, str] = {}
        for kind in KINDS:
            arms, reason = getattr(self, kind), self.why_none.get(kind)
            for arm in arms:
                if arm in seen:
                    raise ValueError(f"claim {self.name!r}: arm {arm!r} is in both {seen[arm]} and {kind}")
                seen[arm] = kind
            if not self.stand_ins and not arms and not (isinstance(reason, str) and reason.strip()):
                raise ValueError(
                    f"claim {self.name!r} has no {kind}: name at least one, or say why in why_none={{{kind!r}: ...}}"
                )
            if arms and reason is not None:
                raise ValueError(f"claim {self.name!r}: why_none gives a reason for {kind}, which has arms")

    @property
    def classified(self) -> bool:
        """The stand-ins are named by kind (the evidence standard), not as unclassified ``stand_ins``."""
        return any(getattr(self, kind) for kind in KINDS)

    @property
    def all_stand_ins(self) -> dict[str, str]:
        """Every stand-in arm -> why, baselines first, then ablations, alternatives and unclassified ones."""
        return {**self.baselines, **self.ablations, **self.alternatives, **self.stand_ins}

    def kind_of(self, arm: str) -> str:
        """The kind of a stand-in arm (``"stand_ins"`` for an unclassified one)."""
        return next(kind for kind in (*KINDS, "stand_ins") if arm in getattr(self, kind))

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

    def distance(self, value: float) -> float:
        """How far ``value`` lies outside the bound (0 inside, inf for NaN): ranks stand-ins by how close they came."""
        if math.isnan(value):
            return math.inf
        below = self.at_least - value if self.at_least is not None else 0.0
        above = value - self.at_most if self.at_most is not None else 0.0
        return max(0.0, below, above)


class _SeedView(dict):
    """A seed's view of the results that notes whether a read found a per-seed number (``seeded``)."""

    def __init__(self, data: Mapping[str, Any], own: set[str]) -> None:
        super().__init__(data)
        self.own, self.seeded = own, False

    def __getitem__(self, key: str) -> Any:
        self.seeded |= key in self.own
        return super().__getitem__(key)


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
    return {s: _SeedView({**shared, **per_seed.get(s, {})}, set(per_seed.get(s, {}))) for s in wanted}


def _bounds(out: dict[str, float], name: str, item: Claim | Check | TaskCheck) -> None:
    if item.at_least is not None:
        out[f"bounds/{name}/at_least"] = float(item.at_least)
    if item.at_most is not None:
        out[f"bounds/{name}/at_most"] = float(item.at_most)


def evaluate(
    results: Mapping[str, Any],
    claims: Sequence[Claim] = (),
    checks: Sequence[Check | TaskCheck] = (),
    per_seed: bool = True,
) -> dict[str, float]:
    """Evaluate claims (method and every stand-in) and checks on ``results``; returns the keys to add.

    With ``per_seed`` and ``<key>/seed<s>`` results present, each claim is also evaluated seed by seed
    (``seeds_held/<name>``) on the seeds that have its numbers (experiments of one run may use different seeds); a
    claim whose numbers have no per-seed form is read from the means on every view.
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
        for arm in claim.all_stand_ins:
            value = claim.value_for(results, arm)
            out[f"values/{claim.name}/{arm}"] = value
            out[f"rejects/{claim.name}/{arm}"] = float(not claim.meets(value))
            rejected.append(not claim.meets(value))
        out[f"{claim.prefix}/{claim.name}"] = float(claim.meets(method_value) and all(rejected))
        _bounds(out, claim.name, claim)
        if len(views) > 1:
            held, seeded = [], []
            for view in views.values():
                view.seeded = False
                held.append(claim.meets(claim.value_for(view, claim.method)))
                seeded.append(view.seeded)
            if any(seeded):  # only the seeds that ran the claim's experiment
                held = [h for h, s in zip(held, seeded) if s]
            out[f"seeds_held/{claim.name}"] = sum(held) / len(held)
    for check in checks:
        if isinstance(check, TaskCheck):
            value, numbers = check.gap(results)
            out.update({f"values/{check.name}/{arm}": v for arm, v in numbers.items()})
        else:
            value = float(check.value(results))
        out[f"values/{check.name}"] = value
        out[f"checks/{check.name}"] = float(check.meets(value))
        _bounds(out, check.name, check)
    return out


def verdicts(results: Mapping[str, Any]) -> dict[str, list[str]]:
    """What failed in evaluated results: ``{"claims": [...], "stand_ins_passed": [...], "checks": [...]}`` (stand-ins
    of asserted claims only).

    A claim with no ``rejects/`` entry is listed under ``"no_stand_in"``: the contract tests require one.
    """
    claims = [k[7:] for k in results if k.startswith("claims/")]
    passed = [k[8:] for k, v in results.items() if k.startswith("rejects/") and v != 1.0]
    return {
        "claims": [n for n in claims if results[f"claims/{n}"] != 1.0],
        # a reported claim may have stand-ins that pass (that is why it is reported); asserted ones may not
        "stand_ins_passed": [k for k in passed if any(k.startswith(f"{n}/") for n in claims)],
        "checks": [k[7:] for k, v in results.items() if k.startswith("checks/") and v != 1.0],
        "no_stand_in": [n for n in claims if not any(k.startswith(f"rejects/{n}/") for k in results)],
    }


def describe(claim: Claim | Check | TaskCheck) -> str:
    """The bound in words, e.g. ``">= 0.2"``; a task check's: the method's lead over the best heuristic."""
    if isinstance(claim, TaskCheck):
        return f"method {'above' if claim.higher_is_better else 'below'} every heuristic by >= {claim.margin:g}"
    return _bounds_text(claim.at_least, claim.at_most)
