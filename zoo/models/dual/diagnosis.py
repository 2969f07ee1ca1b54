"""``zoo reproduce dual --diagnose``: why DUAL + β is not ahead of the paper's baselines here, along three axes.

Seeds 0-2 of the full run's task (quick: seed 0, fewer cells), both label settings, r = 0.5-0.9 (the budget at
r = 0.7 and 0.9):

* **subset budget**: every subset trained for 40, 100, 200 (the reproduction's, the paper's CIFAR protocol) and 400
  epochs, for random, class-balanced random, entropy, TDDS, CCS (100 and 30 epochs), DUAL top-k, DUAL + β without
  σ and DUAL + β. The card's §6 trained subsets for 40 epochs, where DUAL + β fell 2 points below random at r = 0.9;
* **scoring length T**: DUAL + β scored from the first 10, 20, 30 (the paper's) and 60 epochs of the full run's
  record (same schedule, same seed);
* **CCS's hard cut**: the fraction of lowest-margin samples CCS drops before stratifying, 0-0.4 (the CCS paper tunes
  it per ratio; the reproduction's cuts were tuned on held-out seeds 10-13, ``experiment.CCS_HARD_CUT``).

The headlines' diagnoses below (``DIAGNOSIS_*``) quote this sweep (``docs/reproductions/dual/dual.diagnose.json``),
the full run, and the official code's DUAL score and Beta sampling run on the same digits records in a scratch
folder (behaapyy/dual-pruning at 4ab525d: ``dual()`` from ``exp_cifar/importance_evaluation.py`` and
``beta_sampling()`` from ``exp_cifar/data_subset.py``, verbatim; never committed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from zoo.models.dual.experiment import (
    CCS_HARD_CUT,
    LABELS,
    NOISE,
    RATIOS,
    SCORE_EPOCHS,
    prepare,
    select,
    train_subsets,
)
from zoo.models.dual.scores import beta_select, ccs_select, dual_score
from zoo.reporting import arm_table, conclude

__all__ = ["BUDGET_ARMS", "DIAGNOSIS_CLEAN", "DIAGNOSIS_MATCH", "DIAGNOSIS_NOISE", "DIAGNOSIS_RESCUE", "diagnose"]

BUDGET_ARMS = ("random", "balanced", "entropy", "tdds", "ccs", "ccs_30", "dual", "dual_beta_no_unc", "dual_beta")
BUDGET_RATIOS = (0.7, 0.9)
CUTS = (0.0, 0.1, 0.2, 0.3, 0.4)  # CCS's hard-cut grid

_OFFICIAL = (
    "Not the code: the official dual() and beta_sampling() (behaapyy/dual-pruning 4ab525d) give the same scores (to "
    "3e-7) and sampling weights (to 1e-8) on these digits records (pinned by tests/fixtures/reference/dual), and the "
    "subsets they draw train to the same accuracy (seeds 0-2, 200 epochs, official vs zoo: clean r = 0.7 / 0.9 97.3 / "
    "91.3 vs 97.5 / 91.3, noisy 95.6 / 89.4 vs 95.7 / 89.7)."
)
DIAGNOSIS_MATCH = (
    _OFFICIAL + " DUAL + β's worst cells are noisy r = 0.5, 2.4 points behind CCS from 30 epochs (at r = 0.5 the "
    "Beta mode still sits on the hard side and 9 % of what it keeps is mislabelled, against CCS's 3 %), and clean "
    "r = 0.8, 1.1 behind TDDS. The scoring length does not close them (seeds 0-2, T = 10 / 20 / 30 / 60: noisy r = "
    "0.5 94.5 / 95.0 / 94.4 / 82.1, clean r = 0.8 94.7 / 95.7 / 96.7 / 97.1), nor does the subset budget (see the "
    "high-ratio headline). CCS comes closer to the best everywhere only with its hard cut set per noise level (0 "
    "on clean labels, 0.2-0.4 on noisy ones, tuned on held-out seeds); with one cut per ratio it is 4 points "
    "behind on clean labels at r = 0.7-0.8. The paper's CIFAR and ImageNet runs are out of reach of 2 CPU cores."
)
DIAGNOSIS_CLEAN = (
    "The subset budget decides r = 0.9, not r = 0.7-0.8 (seeds 0-2, subsets trained 40 / 100 / 200 / 400 epochs): "
    "at the card's 40 epochs DUAL + β fell below random at r = 0.9 (82.9 vs 87.6), from 100 epochs it is above it "
    "(90.9 / 91.3 / 91.5 vs 89.3 / 89.1 / 90.2), which is why the reproduction trains subsets for the paper's 200. "
    "At r = 0.7 entropy top-k (97.8 / 98.1 / 97.9 from 100 epochs on) and TDDS (98.0 / 97.9 / 97.9) stay ahead of "
    "DUAL + β (97.7 / 97.5 / 97.3) at every budget, and a later scoring window does not reverse r = 0.8 (T = 60: "
    "97.1, TDDS 97.8). "
    + _OFFICIAL
    + " What differs from CIFAR-10 is the data: a 100-epoch run learns nearly every digit, so the full-training "
    "difficulty scores keep informative subsets down to r = 0.8 and collapse only at 0.9 (entropy 90.5, TDDS 87.0 "
    "on the 8-seed means), where on CIFAR-10 Dyn-Unc is 8 points behind DUAL already at r = 0.8. A larger dataset "
    "is beyond the embedded data."
)
DIAGNOSIS_NOISE = (
    "On the 8-seed means DUAL + β is ahead of every baseline at noisy r = 0.7, 0.8 and 0.9, but on 8 of 10 "
    "calibration seeds a baseline leads it in one of the three cells: CCS's hard cut by AUM removes the mislabelled "
    "samples about as well as the Beta density does (CCS from 30 epochs keeps 4-7 % mislabelled, DUAL + β 0-2 %), so "
    "the two trade places seed by seed (r = 0.7: 95.8 vs 95.5; r = 0.9: 89.5 vs 88.0 and tuned CCS 88.8). The budget "
    "does not separate them (seeds 0-2, 40 / 100 / 200 / 400 epochs at r = 0.7: DUAL + β 95.5-95.8, CCS from 30 "
    "epochs 94.9-95.2, while random falls from 90.9 to 79.9 as longer training fits the flipped labels). " + _OFFICIAL
)
DIAGNOSIS_RESCUE = (
    "The Beta sampling does lift DUAL's collapsed top-k subset above random at r = 0.9 (8-seed means: clean 91.6 "
    "against DUAL top-k 82.6 and random 89.3; noisy 89.5 against 66.2 and 71.4), and the same sampling over a random "
    "score (86.7 clean) or over EL2N (87.9) does not. But CCS, which never keeps only the hard tail, clears random by "
    "about as much (clean 91.1, noisy 88.5), so at this scale the claim does not single out the Beta sampling. With "
    "the card's 40-epoch subset budget the lift over random vanished on clean labels (seeds 0-2: 82.9 vs 87.6) and "
    "it returns from 100 epochs on (90.9 vs 89.3); the official Beta sampling at 40 epochs does no better over 30 "
    "draws (85.6 ± 4.2 against the zoo's 86.7 ± 3.6). " + _OFFICIAL
)


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the three sweeps and (with ``out``) write ``dual.diagnose.json`` / ``.png``.

    Returns:
        flat results, each per seed and as the mean over seeds: ``budget/e<E>/<setting>/<arm>/r<ratio>`` (test
        accuracy %), ``T/T<T>/<setting>/dual_beta/r<ratio>``, ``ccs_cut/c<cut>/<setting>/ccs/r<ratio>``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64-256-128-10 MLP on batches of 64: extra threads only add overhead
    try:
        return _diagnose(quick, out)
    finally:
        torch.set_num_threads(threads)


def _diagnose(quick: bool, out: Path | str | None) -> dict[str, Any]:
    start = time.perf_counter()
    seeds = (0,) if quick else (0, 1, 2)
    budgets = (40, 200) if quick else (40, 100, 200, 400)
    lengths = (10, 30) if quick else (10, 20, 30, 60)
    cuts = (0.0, 0.2, 0.4) if quick else CUTS
    r: dict[str, Any] = {"seeds": list(seeds)}
    for seed in seeds:
        for tag, noise in (("clean", 0.0), ("noisy", NOISE)):
            data = prepare(noise, seed)
            x, y, test = data.dm.train_set.x, data.dm.train_set.y, data.dm.test_set
            tp, aum = data.full_target_probs, data.scores["aum"]  # CCS's AUM: the full run's, as in the grid
            for ratio in RATIOS:
                batch = 32 if ratio >= 0.9 else 64
                keep = torch.stack([select(a, data, ratio, seed) for a in BUDGET_ARMS])
                for epochs in budgets if ratio in BUDGET_RATIOS else ():
                    acc = train_subsets(x[keep], y[keep], test.x, test.y, epochs, batch, seed)
                    for arm, value in zip(BUDGET_ARMS, acc.tolist()):
                        r[f"budget/e{epochs}/{tag}/{arm}/r{ratio}/seed{seed}"] = 100 * value
                # The scoring length and the hard cut, trained together at the reproduction's 200 epochs.
                variants: dict[str, torch.Tensor] = {}
                for t in lengths:
                    g = torch.Generator().manual_seed(seed)
                    score = dual_score(tp, epochs=t, window=min(10, t))
                    variants[f"T/T{t}/{tag}/dual_beta"] = beta_select(score, tp, ratio, epochs=t, generator=g)
                for cut in cuts:
                    g = torch.Generator().manual_seed(seed)
                    variants[f"ccs_cut/c{cut}/{tag}/ccs"] = ccs_select(aum, ratio, hard_cut=cut, generator=g)
                keep = torch.stack(list(variants.values()))
                acc = train_subsets(x[keep], y[keep], test.x, test.y, 200, batch, seed)
                for name, value in zip(variants, acc.tolist()):
                    r[f"{name}/r{ratio}/seed{seed}"] = 100 * value
            print(f"  seed {seed} {tag}: done ({time.perf_counter() - start:.0f} s)")
    bases = {k.rsplit("/seed", 1)[0] for k in r if "/seed" in k}
    for base in sorted(bases):
        r[base] = sum(r[f"{base}/seed{s}"] for s in seeds) / len(seeds)
    r["seconds"] = time.perf_counter() - start
    tables = []
    for tag in ("clean", "noisy"):
        metrics = [f"e{e}/r{x}" for x in BUDGET_RATIOS for e in budgets]
        budget = {f"{arm}": {m: r[f"budget/{m.split('/')[0]}/{tag}/{arm}/{m.split('/')[1]}"] for m in metrics}
                  for arm in BUDGET_ARMS}  # fmt: skip
        flat = {f"{arm}/{m}": v for arm, row in budget.items() for m, v in row.items()}
        tables.append(arm_table(flat, BUDGET_ARMS, metrics, f"subset budget, {tag}: test accuracy %", LABELS, "",
                                "{:.1f}"))  # fmt: skip
    notes = [
        "scoring length T (DUAL + β, 200 epochs): "
        + "; ".join(
            f"{tag} r{x}: " + " ".join(f"T{t} {r[f'T/T{t}/{tag}/dual_beta/r{x}']:.1f}" for t in lengths)
            for tag in ("clean", "noisy")
            for x in RATIOS
        ),
        "CCS hard cut (200 epochs; the reproduction's: "
        + ", ".join(f"r{x} {CCS_HARD_CUT[x]}" for x in RATIOS)
        + "): "
        + "; ".join(
            f"{tag} r{x}: " + " ".join(f"c{c} {r[f'ccs_cut/c{c}/{tag}/ccs/r{x}']:.1f}" for c in cuts)
            for tag in ("clean", "noisy")
            for x in RATIOS
        ),
        f"{len(seeds)} seed(s); T = {SCORE_EPOCHS} is the reproduction's; total {r['seconds']:.0f} s",
    ]
    plot = lambda results, path: _plot(results, path, budgets)  # noqa: E731 - conclude takes (results, path)
    return conclude("dual.diagnose", r, out=out, plot=plot, tables=tables, notes=notes)


def _plot(r: dict[str, Any], path: Path, budgets: tuple[int, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, (tag, ratio) in zip(axes, [(t, x) for t in ("clean", "noisy") for x in BUDGET_RATIOS]):
        for arm in BUDGET_ARMS:
            values = [r[f"budget/e{e}/{tag}/{arm}/r{ratio}"] for e in budgets]
            style = {"lw": 2.5, "color": "k"} if arm == "dual_beta" else {}
            ax.plot(budgets, values, marker="o", label=LABELS[arm], **style)
        ax.set_xscale("log")
        ax.set_xticks(budgets, [str(e) for e in budgets])
        ax.set_xlabel("subset training epochs")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{tag}, r = {ratio}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
