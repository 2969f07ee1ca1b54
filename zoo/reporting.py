"""The harness every ``zoo reproduce`` run shares: the arms × seeds loop, the table, the claims, the JSON and PNG.

A paper's ``reproduce.py`` keeps only its experiment: a function ``arm(name, seed) -> {metric: value}``, its
:class:`~zoo.claims.Claim` and :class:`~zoo.claims.Check` lists, and a plot. The harness does the rest:

>>> from zoo.claims import Claim
>>> def arm(name, seed):
...     return {"acc": {"method": 0.9, "random": 0.5}[name] + 0.01 * seed}
>>> r = run_arms(["method", "random"], [0, 1, 2], arm, log=None)
>>> round(r["method/acc"], 3), r["method/acc/seed2"]
(0.91, 0.92)
>>> claim = Claim("beats_random_by_0.2", lambda r, a: r[f"{a}/acc"] - r["random/acc"], method="method",
...               stand_ins={"random": "a random score in the method's place"}, at_least=0.2)
>>> r = conclude("toy", r, [claim], console=None)
>>> r["claims/beats_random_by_0.2"], r["seeds_held/beats_random_by_0.2"]
(1.0, 1.0)
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zoo.claims import Check, Claim, describe, evaluate

__all__ = ["run_arms", "mean_over_seeds", "arm_table", "print_claims", "write_results", "conclude"]


def mean_over_seeds(results: dict[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """Add ``<key>`` = the mean of ``<key>/seed<s>`` over ``seeds`` for every key that has all of them; in place."""
    bases = {k.rsplit("/seed", 1)[0] for k in results if "/seed" in k and k.rsplit("/seed", 1)[1].isdigit()}
    for base in sorted(bases):
        values = [results.get(f"{base}/seed{s}") for s in seeds]
        if all(isinstance(v, (int, float)) for v in values):
            results[base] = sum(values) / len(values)
    return results


def run_arms(
    arms: Sequence[str],
    seeds: Sequence[int],
    fn: Callable[[str, int], Mapping[str, float]],
    prefix: str = "",
    results: dict[str, Any] | None = None,
    log: Callable[[str], Any] | None = print,
) -> dict[str, Any]:
    """Run ``fn(arm, seed)`` for every seed and arm (seed-major, so one seed's data is made once by ``fn``'s cache).

    Writes ``<prefix><arm>/<metric>/seed<s>`` and the means ``<prefix><arm>/<metric>`` into ``results`` (a new
    dict by default), with the seconds each arm took (``<prefix><arm>/seconds``); ``log`` gets one progress line
    per run (``None``: silent).
    """
    r: dict[str, Any] = {} if results is None else results
    start = time.perf_counter()
    for seed in seeds:
        for arm in arms:
            t0 = time.perf_counter()
            metrics = dict(fn(arm, seed))
            metrics.setdefault("seconds", time.perf_counter() - t0)
            for metric, value in metrics.items():
                r[f"{prefix}{arm}/{metric}/seed{seed}"] = float(value)
            if log is not None:
                shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != "seconds")
                log(f"  {prefix}{arm:<18} seed {seed}: {shown}  ({time.perf_counter() - start:.0f} s)")
    return mean_over_seeds(r, seeds)


def _spread(results: Mapping[str, Any], key: str) -> float | None:
    values = [v for k, v in results.items() if k.startswith(f"{key}/seed") and k[len(key) + 5 :].isdigit()]
    return statistics.stdev(values) if len(values) > 1 else None


def arm_table(
    results: Mapping[str, Any],
    arms: Sequence[str],
    metrics: Sequence[str],
    title: str,
    labels: Mapping[str, str] | None = None,
    prefix: str = "",
    fmt: str = "{:.3f}",
) -> Any:
    """A rich ``Table``: one row per arm, one column per metric, ``mean ± std`` over seeds where there are seeds."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("arm")
    for metric in metrics:
        table.add_column(metric, justify="right")
    for arm in arms:
        cells = []
        for metric in metrics:
            key = f"{prefix}{arm}/{metric}"
            if key not in results:
                cells.append("–")
                continue
            spread = _spread(results, key)
            cells.append(fmt.format(results[key]) + (f" ± {fmt.format(spread)}" if spread is not None else ""))
        table.add_row((labels or {}).get(arm, arm), *cells)
    return table


def _claim_row(
    results: Mapping[str, Any], c: Claim, verdicts: tuple[str, str], rejected: tuple[str, str]
) -> tuple[str, ...]:
    """A claim's cells: verdict, name, bound, the method's number, each stand-in's (marked), the share of seeds held."""
    held = results.get(f"{c.prefix}/{c.name}") == 1.0
    verdict = verdicts[0] if held else verdicts[1]
    if not c.asserted:
        verdict = f"reported: {'held' if held else 'did not hold'}"
    stand_ins = "; ".join(
        f"{arm} {results[f'values/{c.name}/{arm}']:.4g} {rejected[0 if results[f'rejects/{c.name}/{arm}'] else 1]}"
        for arm in c.stand_ins
    )
    seeds = results.get(f"seeds_held/{c.name}")
    method = f"{c.method} {results[f'values/{c.name}/{c.method}']:.4g}"
    return verdict, c.name, describe(c), method, stand_ins, "" if seeds is None else f"{seeds:.0%}"


def print_claims(
    console: Any, results: Mapping[str, Any], claims: Sequence[Claim] = (), checks: Sequence[Check] = ()
) -> None:
    """One table of the claims (the method's number, each stand-in's, the seeds it held on) and one of the checks."""
    from rich.table import Table

    if claims:
        table = Table(title="claims: the method meets the bound, every stand-in misses it")
        for column in ("", "claim", "bound", "method", "stand-ins (x: rejected)", "seeds held"):
            table.add_column(column)
        for c in claims:
            table.add_row(*_claim_row(results, c, ("PASS", "FAIL"), ("x", "PASSES")))
        console.print(table)
    if checks:
        table = Table(title="checks (sanity: no stand-in fails these)")
        for column in ("", "check", "bound", "value"):
            table.add_column(column)
        for c in checks:
            ok = results.get(f"checks/{c.name}") == 1.0
            table.add_row("ok" if ok else "FAIL", c.name, describe(c), f"{results[f'values/{c.name}']:.4g}")
        console.print(table)


def claims_markdown(
    results: Mapping[str, Any], claims: Sequence[Claim] = (), checks: Sequence[Check] = ()
) -> str:
    """The claims and checks of :func:`print_claims` as Markdown tables (the documentation site shows them).

    Example:
        >>> from zoo.claims import Claim, evaluate
        >>> r = {"m/acc": 0.9, "base/acc": 0.5}
        >>> c = Claim("acc_above_0.8", lambda r, arm: r[f"{arm}/acc"], at_least=0.8, method="m",
        ...           stand_ins={"base": "the baseline"})
        >>> print(claims_markdown({**r, **evaluate(r, [c])}, [c]).splitlines()[2])
        | holds | `acc_above_0.8` | >= 0.8 | m 0.9 | base 0.5 (rejected) |  |
    """
    lines = []
    if claims:
        lines += [
            "| verdict | claim | bound | method | stand-ins | seeds held |",
            "|---|---|---|---|---|---|",
        ]
        for c in claims:
            verdict, name, *cells = _claim_row(results, c, ("holds", "fails"), ("(rejected)", "(passes too)"))
            lines.append(f"| {verdict} | `{name}` | " + " | ".join(cells) + " |")
    if checks:
        lines += ([""] if lines else []) + ["| check | | bound | value |", "|---|---|---|---|"]
        for c in checks:
            ok = results.get(f"checks/{c.name}") == 1.0
            value = results[f"values/{c.name}"]
            lines.append(f"| {'ok' if ok else 'fails'} | `{c.name}` | {describe(c)} | {value:.4g} |")
    return "\n".join(lines) + "\n"


def write_results(
    r: Mapping[str, Any], out: Path | str, name: str, plot: Callable[[Mapping[str, Any], Path], None] | None = None
) -> Path:
    """Write ``<out>/<name>.json`` (and, with ``plot``, ``<out>/<name>.png``); returns the folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(r, indent=2, sort_keys=True))
    if plot is not None:
        plot(r, folder / f"{name}.png")
    return folder


def conclude(
    name: str,
    results: dict[str, Any],
    claims: Sequence[Claim] = (),
    checks: Sequence[Check] = (),
    out: Path | str | None = None,
    plot: Callable[[Mapping[str, Any], Path], None] | None = None,
    tables: Iterable[Any] = (),
    notes: Iterable[str] = (),
    console: Any | str = "default",
) -> dict[str, Any]:
    """Evaluate the claims and checks into ``results``, print the tables, notes and claims, write JSON and PNG.

    ``console``: a rich ``Console``, ``"default"`` for a 200-column one, or ``None`` to print nothing.
    """
    results.update(evaluate(results, claims, checks))
    if console == "default":
        from rich.console import Console

        console = Console(width=200)
    if console is not None:
        for table in tables:
            console.print(table)
        for note in notes:
            console.print(note)
        print_claims(console, results, claims, checks)
    if out is not None:
        folder = write_results(results, out, name, plot)
        (folder / f"{name}.claims.md").write_text(claims_markdown(results, claims, checks))
        if console is not None:
            console.print(f"Wrote {folder / f'{name}.json'}" + (f" and {folder / f'{name}.png'}" if plot else ""))
    return results
