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
from typing import TYPE_CHECKING, Any

from zoo.claims import KINDS, Check, Claim, TaskCheck, describe, evaluate

if TYPE_CHECKING:
    from zoo.evidence import Headline

__all__ = ["run_arms", "mean_over_seeds", "arm_table", "print_claims", "plot_sweep", "write_results", "conclude"]


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
    written: dict[str, None] = {}
    for seed in seeds:
        for arm in arms:
            t0 = time.perf_counter()
            metrics = dict(fn(arm, seed))
            metrics.setdefault("seconds", time.perf_counter() - t0)
            for metric, value in metrics.items():
                r[f"{prefix}{arm}/{metric}/seed{seed}"] = float(value)
                written[f"{prefix}{arm}/{metric}"] = None
            if log is not None:
                shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != "seconds")
                log(f"  {prefix}{arm:<18} seed {seed}: {shown}  ({time.perf_counter() - start:.0f} s)")
    # A second call on the same results with other seeds (a 1-seed side experiment after a 3-seed run) must not
    # overwrite the first call's means with means over its own seeds: a mean that exists is replaced only for the
    # keys this call returned; keys an arm wrote into ``results`` itself get their mean when they have none yet.
    bases = {k.rsplit("/seed", 1)[0] for k in r if "/seed" in k and k.rsplit("/seed", 1)[1].isdigit()}
    for base in sorted(bases):
        values = [r.get(f"{base}/seed{s}") for s in seeds]
        if (base in written or base not in r) and all(isinstance(v, (int, float)) for v in values):
            r[base] = sum(values) / len(values)
    return r


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


def _stand_in_cell(results: Mapping[str, Any], c: Claim, rejected: tuple[str, str]) -> str:
    """Each stand-in's number, marked rejected or passing, grouped by kind (an empty kind shows its reason)."""

    def arms(mapping: Mapping[str, str]) -> str:
        return ", ".join(
            f"{arm} {results[f'values/{c.name}/{arm}']:.4g} {rejected[0 if results[f'rejects/{c.name}/{arm}'] else 1]}"
            for arm in mapping
        )

    if not c.classified:
        return arms(c.stand_ins)
    parts = []
    for kind in KINDS:
        mapping = getattr(c, kind)
        parts.append(f"{kind}: {arms(mapping)}" if mapping else f"{kind}: none ({c.why_none[kind]})")
    return "; ".join(parts)


def _claim_row(
    results: Mapping[str, Any], c: Claim, verdicts: tuple[str, str], rejected: tuple[str, str]
) -> tuple[str, ...]:
    """A claim's cells: verdict, name, bound, the method's number, each stand-in's (marked), the share of seeds held."""
    held = results.get(f"{c.prefix}/{c.name}") == 1.0
    verdict = verdicts[0] if held else verdicts[1]
    if not c.asserted:
        meets = c.meets(results[f"values/{c.name}/{c.method}"])
        verdict = "reported: " + ("held" if held else "a stand-in passes too" if meets else "the method misses")
    seeds = results.get(f"seeds_held/{c.name}")
    method = f"{c.method} {results[f'values/{c.name}/{c.method}']:.4g}"
    stand_ins = _stand_in_cell(results, c, rejected)
    return verdict, c.name, describe(c), method, stand_ins, "" if seeds is None else f"{seeds:.0%}"


def _check_value(results: Mapping[str, Any], c: Check | TaskCheck) -> str:
    value = f"{results[f'values/{c.name}']:.4g}"
    if isinstance(c, TaskCheck):
        arms = ", ".join(f"{arm} {results[f'values/{c.name}/{arm}']:.4g}" for arm in (c.method, *c.heuristics))
        value += f" ({arms})"
    return value


def print_claims(
    console: Any, results: Mapping[str, Any], claims: Sequence[Claim] = (), checks: Sequence[Check | TaskCheck] = ()
) -> None:
    """One table of the claims (the method's number, each stand-in's, the seeds it held on) and one of the checks."""
    from rich.table import Table

    if claims:
        table = Table(title="claims: the method meets the bound, every stand-in misses it")
        for column in ("", "claim", "bound", "method", "stand-ins by kind (x: rejected)", "seeds held"):
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
            table.add_row("ok" if ok else "FAIL", c.name, describe(c), _check_value(results, c))
        console.print(table)


def claims_markdown(
    results: Mapping[str, Any], claims: Sequence[Claim] = (), checks: Sequence[Check | TaskCheck] = ()
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
            "| verdict | claim | bound | method | stand-ins by kind | seeds held |",
            "|---|---|---|---|---|---|",
        ]
        for c in claims:
            verdict, name, *cells = _claim_row(results, c, ("holds", "fails"), ("(rejected)", "(passes too)"))
            lines.append(f"| {verdict} | `{name}` | " + " | ".join(cells) + " |")
    if checks:
        lines += ([""] if lines else []) + ["| check | | bound | value |", "|---|---|---|---|"]
        for c in checks:
            ok = results.get(f"checks/{c.name}") == 1.0
            lines.append(f"| {'ok' if ok else 'fails'} | `{c.name}` | {describe(c)} | {_check_value(results, c)} |")
    return "\n".join(lines) + "\n"


def plot_sweep(
    ax: Any,
    results: Mapping[str, Any],
    sizes: Sequence[str],
    x: Sequence[float],
    series: Mapping[str, str],
    xlabel: str,
    ylabel: str,
    title: str = "",
    log_x: bool = False,
    reference: float | None = None,
) -> None:
    """Draw a diagnosis sweep on a matplotlib ``ax``: one line per series, its mean over seeds ± one std per size.

    Args:
        ax: the matplotlib Axes to draw on (the caller makes the figure and saves it).
        results: results of a sweep (e.g. :func:`run_arms` with the sizes as arms), with ``/seed<s>`` keys.
        sizes: the sizes' names, in order; ``x``: their positions on the x axis.
        series: label -> key template with ``{size}`` (``"{size}/cv/saving"``).
        reference: a horizontal line (the paper's number, a bound).
    """
    for label, template in series.items():
        keys = [template.format(size=size) for size in sizes]
        mean = [float(results.get(k, float("nan"))) for k in keys]
        spread = [_spread(results, k) or 0.0 for k in keys]
        ax.errorbar(list(x), mean, yerr=spread, marker="o", capsize=3, label=label)
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle=":", linewidth=1)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


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
    checks: Sequence[Check | TaskCheck] = (),
    out: Path | str | None = None,
    plot: Callable[[Mapping[str, Any], Path], None] | None = None,
    tables: Iterable[Any] = (),
    notes: Iterable[str] = (),
    console: Any | str = "default",
    headlines: Sequence["Headline"] = (),
) -> dict[str, Any]:
    """Evaluate the claims, checks and headlines into ``results``, print the tables, notes, claims and verdicts, and
    with ``out`` write ``<name>.json``, ``<name>.png``, ``<name>.claims.md`` and (with headlines) ``<name>.verdict.md``.

    ``console``: a rich ``Console``, ``"default"`` for a 200-column one, or ``None`` to print nothing.
    """
    from zoo.evidence import judge, verdict_markdown

    results.update(evaluate(results, claims, checks))
    results.update(judge(results, headlines, claims))
    verdict = verdict_markdown(results, headlines, claims, checks) if headlines else None
    if console == "default":
        from rich.console import Console

        console = Console(width=200)
    if console is not None:
        for table in tables:
            console.print(table)
        for note in notes:
            console.print(note)
        print_claims(console, results, claims, checks)
        if verdict is not None:
            from rich.markdown import Markdown

            console.print(Markdown("## Verdict at this scale\n\n" + verdict))
    if out is not None:
        folder = write_results(results, out, name, plot)
        (folder / f"{name}.claims.md").write_text(claims_markdown(results, claims, checks))
        if verdict is not None:
            (folder / f"{name}.verdict.md").write_text(verdict)
        if console is not None:
            console.print(f"Wrote {folder / f'{name}.json'}" + (f" and {folder / f'{name}.png'}" if plot else ""))
    return results
