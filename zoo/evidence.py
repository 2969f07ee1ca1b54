"""The evidence standard's verdict table, and the recorded full runs that paper pages and model cards open with.

A reproduction at the evidence standard defines, at module level, ``CLAIMS`` (each naming its stand-ins by kind),
``CHECKS`` (among them a :class:`~zoo.claims.TaskCheck`: the embedded task needs the method) and ``HEADLINES`` (the
paper's headline claims in the card's words). :func:`verdict_markdown` turns evaluated results into the verdict
table: each headline, its verdict at this scale, the method's number beside the best stand-in of each kind, and the
diagnosis of a headline that does not reproduce.

The full run of each such paper is recorded in the repository, ``docs/reproductions/<slug>/`` (written by
``zoo reproduce <slug> --out docs/reproductions/<slug>``): its results JSON, figure, claims and verdict tables, and
``<slug>.meta.json`` (command, date, commit, seconds, threads, library versions). The paper's page and its model
cards render their verdict table from that record's numbers and the code's words (:func:`recorded_verdict`), so the
numbers cannot drift from the run; the contract tests check that the record still matches the code's claims.
A paper whose reproduction defines no ``HEADLINES`` is *pending*: its page says so.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from zoo._layout import REPO_DIR
from zoo.claims import KINDS, Check, Claim, TaskCheck, _check_name, describe

__all__ = [
    "Headline",
    "RECORDS",
    "at_standard",
    "best_stand_in",
    "headline_verdict",
    "judge",
    "load_record",
    "recorded_verdict",
    "reproduction_module",
    "verdict_markdown",
    "write_meta",
]

RECORDS = REPO_DIR / "docs" / "reproductions"
VERDICTS = {1.0: "reproduced", 0.0: "not reproduced", -1.0: "contradicted"}
PENDING = (
    "Evidence standard: pending. This paper's reproduction does not yet run its claims against the paper's "
    "baselines, an ablation and the cheapest practical alternative, so its claims table below cannot say whether "
    "the method works."
)


@dataclass(frozen=True)
class Headline:
    """One of the paper's headline claims, in the card's words, and the claims that test it at this scale.

    Its verdict (:func:`headline_verdict`): *contradicted* when a claim in ``contradicted_by`` holds (a stand-in
    meets the reverse bound), else *reproduced* when every claim in ``claims`` is asserted and holds, else *not
    reproduced*. A headline that does not reproduce carries a ``diagnosis``: what the scale sweep and, where official
    code exists, the official implementation on the same task say about the cause.

    Args:
        name: one path segment.
        text: the paper's claim in the card's words.
        claims: names of the :class:`Claim` s that test it here (the first one's numbers go in the verdict table).
        contradicted_by: names of claims whose holding contradicts it (the baseline ahead of the method).
        paper: the paper's own number for it, e.g. ``"24.8 % vs 8.3 %"``.
        diagnosis: why it does not reproduce here, and where the evidence is (sweep, official code).
    """

    name: str
    text: str
    claims: Sequence[str] = ()
    contradicted_by: Sequence[str] = ()
    paper: str = ""
    diagnosis: str = ""

    def __post_init__(self) -> None:
        _check_name(self.name, "a headline")
        if isinstance(self.claims, str) or isinstance(self.contradicted_by, str):
            raise ValueError(f"headline {self.name!r}: claims and contradicted_by are sequences of claim names")
        if not self.claims and not self.contradicted_by:
            raise ValueError(f"headline {self.name!r} names no claim: a headline is judged by the claims that test it")


def headline_verdict(results: Mapping[str, Any], headline: Headline) -> str:
    """``"reproduced"``, ``"not reproduced"`` or ``"contradicted"`` from evaluated results (see :class:`Headline`)."""

    def held(name: str, asserted_only: bool) -> bool:
        if results.get(f"claims/{name}") == 1.0:
            return True
        return not asserted_only and results.get(f"reported/{name}") == 1.0

    if any(held(n, asserted_only=False) for n in headline.contradicted_by):
        return "contradicted"
    if headline.claims and all(held(n, asserted_only=True) for n in headline.claims):
        return "reproduced"
    return "not reproduced"


def judge(results: Mapping[str, Any], headlines: Sequence[Headline], claims: Sequence[Claim]) -> dict[str, float]:
    """Each headline's verdict on evaluated ``results``: ``headlines/<name>`` = 1.0 reproduced, 0.0 not reproduced,
    -1.0 contradicted (the keys to add).

    Raises:
        ValueError: a headline names a claim that is not among ``claims``.
    """
    names = {c.name for c in claims}
    out: dict[str, float] = {}
    for h in headlines:
        unknown = [n for n in (*h.claims, *h.contradicted_by) if n not in names]
        if unknown:
            raise ValueError(f"headline {h.name!r} names {unknown}, which are not among the claims evaluated")
        verdict = headline_verdict(results, h)
        out[f"headlines/{h.name}"] = next(code for code, text in VERDICTS.items() if text == verdict)
    return out


def best_stand_in(results: Mapping[str, Any], claim: Claim, kind: str) -> tuple[str, float] | None:
    """The stand-in of ``kind`` that came closest to the claim's bound (or passed it), with its number.

    Example:
        >>> c = Claim("c", lambda r, a: r[a], at_least=0.5, method="m", baselines={"b1": "", "b2": ""},
        ...           why_none={"ablations": "-", "alternatives": "-"})
        >>> best_stand_in({"values/c/b1": 0.2, "values/c/b2": 0.4}, c, "baselines")
        ('b2', 0.4)
    """
    arms = getattr(claim, kind)
    if not arms:
        return None
    numbers = {arm: float(results[f"values/{claim.name}/{arm}"]) for arm in arms}
    arm = min(numbers, key=lambda a: claim.distance(numbers[a]))
    return arm, numbers[arm]


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _verdict(results: Mapping[str, Any], headline: Headline) -> str:
    code = results.get(f"headlines/{headline.name}")
    return VERDICTS[float(code)] if code is not None else headline_verdict(results, headline)


def verdict_markdown(
    results: Mapping[str, Any],
    headlines: Sequence[Headline],
    claims: Sequence[Claim],
    checks: Sequence[Check | TaskCheck] = (),
) -> str:
    """The verdict table of evaluated ``results`` as Markdown: one row per headline, then the task checks.

    Each row: the headline in the card's words (and the paper's number), its verdict at this scale, the claim that
    tests it with its bound, the method's number, the best stand-in of each kind (``x`` rejected, ``!`` passes too),
    and the diagnosis (required where it does not reproduce).

    Example:
        >>> from zoo.claims import evaluate
        >>> c = Claim("acc_at_least_0.8", lambda r, a: r[f"{a}/acc"], at_least=0.8, method="m",
        ...           baselines={"b": "the paper's baseline"}, ablations={"a": "its key part removed"},
        ...           alternatives={"h": "a heuristic"})
        >>> h = Headline("accurate", "The method is accurate.", claims=["acc_at_least_0.8"], paper="0.95")
        >>> r = {"m/acc": 0.9, "b/acc": 0.7, "a/acc": 0.6, "h/acc": 0.5}
        >>> r.update(evaluate(r, [c]))
        >>> r.update(judge(r, [h], [c]))
        >>> print(verdict_markdown(r, [h], [c]).splitlines()[2].replace(" | ", "|"))
        | The method is accurate. (paper: 0.95)|reproduced|`acc_at_least_0.8` >= 0.8|m 0.9|b 0.7 x|a 0.6 x|h 0.5 x| |
    """
    by_name = {c.name: c for c in claims}
    lines = [
        "| the paper's claim | verdict here | tested by | method | best baseline | best ablation | best alternative "
        "| diagnosis |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in headlines:
        verdict = _verdict(results, h)
        claim = by_name[(list(h.claims) or list(h.contradicted_by))[0]]
        cells = []
        for kind in KINDS:
            best = best_stand_in(results, claim, kind)
            if best is None:
                cells.append(f"none: {_escape(claim.why_none[kind])}" if claim.classified else "unclassified")
            else:
                arm, value = best
                cells.append(f"{arm} {value:.4g} {'!' if claim.meets(value) else 'x'}")
        more = len(h.claims) + len(h.contradicted_by) - 1
        tested = f"`{claim.name}` {describe(claim)}" + (f" (+{more} more)" if more > 0 else "")
        method = f"{claim.method} {results[f'values/{claim.name}/{claim.method}']:.4g}"
        diagnosis = h.diagnosis or ("" if verdict == "reproduced" else "**no diagnosis yet**")
        text = _escape(h.text) + (f" (paper: {_escape(h.paper)})" if h.paper else "")
        cells = [text, verdict, tested, method, *cells, _escape(diagnosis)]
        lines.append("| " + " | ".join(cells) + " |")
    for c in checks:
        if isinstance(c, TaskCheck):
            ok = results.get(f"checks/{c.name}") == 1.0
            heuristics = ", ".join(f"{arm} {results[f'values/{c.name}/{arm}']:.4g}" for arm in c.heuristics)
            lines += [
                "",
                f"The task needs the method (`{c.name}`, {'holds' if ok else 'FAILS'}): {c.method} "
                f"{results[f'values/{c.name}/{c.method}']:.4g} against the non-learned heuristics {heuristics} "
                f"(margin {results[f'values/{c.name}']:.4g}, required {c.margin:g}).",
            ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------- records


def reproduction_module(slug: str) -> ModuleType | None:
    """The ``reproduce`` module of the paper ``slug`` (``None`` when it has none)."""
    import importlib

    from zoo.registry import ENTRIES

    for entry in ENTRIES:
        if entry.module.split(".")[2] == slug.replace("-", "_") and entry.reproduce:
            return importlib.import_module(entry.reproduce.rsplit(".", 1)[0])
    return None


def at_standard(slug: str) -> bool:
    """Whether the paper's reproduction is at the evidence standard (its module defines ``HEADLINES``)."""
    module = reproduction_module(slug)
    return bool(getattr(module, "HEADLINES", None))


def write_meta(folder: Path | str, name: str, *, command: str, quick: bool, seconds: float) -> Path:
    """Write ``<folder>/<name>.meta.json``: how, when and where a reproduction ran."""
    import torch

    from zoo.publish import library_versions

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD") or None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "zoo", "datamodules", "callbacks")
    if commit and changed:
        commit += "+uncommitted changes"  # the run's code is not exactly that commit's
    meta = {
        "command": command,
        "quick": quick,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M", time.gmtime()) + " UTC",
        "commit": commit,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "versions": library_versions(),
    }
    path = Path(folder) / f"{name}.meta.json"
    path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def load_record(slug: str, folder: Path | str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The recorded full run of ``slug``: ``(results, meta)``, or ``None`` when nothing is recorded."""
    folder = Path(folder) if folder is not None else RECORDS / slug
    results, meta = folder / f"{slug}.json", folder / f"{slug}.meta.json"
    if not (results.is_file() and meta.is_file()):
        return None
    return json.loads(results.read_text()), json.loads(meta.read_text())


def recorded_verdict(slug: str, folder: Path | str | None = None) -> str | None:
    """The verdict section that paper pages and model cards open with, rendered from the recorded full run.

    ``None`` for a paper at the standard with no recorded run; the pending note for a paper not at the standard.
    """
    module = reproduction_module(slug)
    if module is None:
        return None
    if not getattr(module, "HEADLINES", None):
        return PENDING
    record = load_record(slug, folder)
    if record is None:
        return None
    results, meta = record
    threads = meta["torch_threads"]
    table = verdict_markdown(results, module.HEADLINES, module.CLAIMS, getattr(module, "CHECKS", ()))
    how = (
        f"From the full run `{meta['command']}` of {meta['finished']} "
        f"(commit {meta.get('commit') or 'unknown'}, "
        f"{meta['seconds']:.0f} s, {meta['cpu_count']} cores, {threads} torch thread{'s' * (threads != 1)}). "
        "Verdicts are judged at this scale: the method beside the stand-in of each kind that came closest to the claim's bound "
        "(x: it misses the bound, !: it passes too)."
    )
    return f"{how}\n\n{table}"
