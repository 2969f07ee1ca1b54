"""``zoo reproduce pap``: do phase- and amplitude-aware prompts make an adversarially trained classifier more robust
than it is alone, than the paper's prompt baselines, and than a standard input transformation, under attacks at the
field's strength?

The card's §6 experiment on scikit-learn's digits, arms and attacks in :mod:`~zoo.models.pap.experiment`. Every arm is
scored by its worst case per image over APGD-CE, targeted APGD-DLR and Square, end to end (straight-through on PAP's
label-driven selection), through the fixed true-class prompt and the expectation over prompts, and on the bare base's
examples transferred (:func:`callbacks.robust_eval.robust_accuracies`, 100 steps, 3 restarts, 9 targets and 1,000
Square queries in the full run); the paper's own number, PGD-10 crafted on the bare base, is kept beside it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zoo.claims import Check, Claim
from zoo.datamodules.images import ImageDataModule
from zoo.models.pap.experiment import (
    ALPHA,
    ARMS,
    EPS,
    LABELS,
    SETTINGS,
    PapExperiment,
    fit_base,
)
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "fit_base", "run"]

METRICS = ("natural", "nonadaptive", "worst", "oracle")


def _gain(metric: str):
    """``value(r, a)``: arm ``a``'s ``metric`` minus the bare AT base's (points)."""
    return lambda r, a: r[f"{a}/{metric}"] - r[f"bare/{metric}"]


_BASELINES = {
    "natural": LABELS["natural"],
    "cavp": LABELS["cavp"] + ", same loss, budget and selection rule",
    "freq": LABELS["freq"] + " (the card's proxy), same loss and budget",
}
_ABLATIONS = {
    "phase-only": "PAP without its amplitude prompt",
    "amplitude-only": "PAP without its phase prompt",
    "fixed-lambda": "PAP with λ fixed at 1 (no robustness-driven weighting), at lr 0.1 where it trains",
    "random": "random prompts with PAP's per-class norms: any input change, nothing learned",
}
_ALTERNATIVES = {
    "squeeze": "bit-depth reduction to 2 bits on the same AT base (feature squeezing), attacked with BPDA",
    "mean": "a 3×3 mean filter on the same AT base",
}

# Calibration (``OMP_NUM_THREADS=1 zoo reproduce pap --quick``, seed 0, 250 test images, the suite's attack strength):
# worst-case robust accuracy, %: bare 56.6, PAP 24.8, C-AVP 57.4, Freq 57.8, phase-only 55.6, amplitude-only 20.0,
# fixed λ 51.8, random 0.0, squeeze 67.0, mean 26.8, natural (undefended) 45.8. The full run's record (3 seeds, the
# field's strength) re-calibrates these bounds before PAP leaves the pending set.
CLAIMS = (
    Claim(
        "pap_robust_gain_worst_case",
        _gain("worst"),
        at_least=0.5,
        method="pap",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="PAP's worst-case robust accuracy is ≥ 0.5 points above the adversarially trained base's (card §1: PAP "
        "improves robust accuracy over the base model); did not reproduce: PAP is far below it",
    ),
    Claim(
        "pap_costs_at_15_worst_case",
        lambda r, a: r["bare/worst"] - r[f"{a}/worst"],
        at_least=15.0,
        method="pap",
        baselines={"cavp": _BASELINES["cavp"], "freq": _BASELINES["freq"]},
        ablations={"phase-only": _ABLATIONS["phase-only"], "fixed-lambda": _ABLATIONS["fixed-lambda"]},
        alternatives={"squeeze": _ALTERNATIVES["squeeze"]},
        text="PAP's prompts lower the AT base's worst-case robust accuracy by ≥ 15 points, while the paper's other "
        "prompts, PAP without its amplitude prompt or without λ's update, and bit-depth reduction do not: it "
        "contradicts the paper's central claim on this task",
    ),
    Claim(
        "pap_robust_gain_nonadaptive",
        _gain("nonadaptive"),
        at_least=0.5,
        method="pap",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="PAP's robust accuracy is ≥ 0.5 points above the base's under the paper's own non-adaptive attack "
        "(PGD-10 crafted on the bare base; card §6 assertion 1); did not reproduce",
    ),
    Claim(
        "adaptive_lambda_beats_fixed_lambda",
        lambda r, a: r[f"{a}/worst"] - r["fixed-lambda/worst"],
        at_least=0.5,
        method="pap",
        ablations={"phase-only": "λ → 0: the amplitude prompt dropped altogether"},
        why_none={"baselines": "a model without λ has no weighting to compare: the fixed-λ arm is the reference",
                  "alternatives": "no cheaper rule weighs two prompts"},
        asserted=False,
        text="the robustness-driven λ (λ ← λ·acc_A/acc_Φ every 5 epochs) gives more worst-case robust accuracy than "
        "λ fixed at 1 (card §2.3 and §6 ablation); did not reproduce",
    ),
    Claim(
        "oracle_prompts_robust_10_above_bare",
        lambda r, a: r[f"{a}/oracle"] - r["bare/nonadaptive"],
        at_least=10.0,
        method="pap",
        baselines={"cavp": _BASELINES["cavp"], "freq": _BASELINES["freq"]},
        ablations={"random": _ABLATIONS["random"], "phase-only": _ABLATIONS["phase-only"]},
        why_none={"alternatives": "an input transformation has no class-conditional part to give the true label"},
        asserted=False,
        text="with the true label's prompts, robust accuracy on the non-adaptive examples is ≥ 10 points above the "
        "bare model's: the prompts hold class-conditional robust information (card §6 assertion 3, diagnostic)",
    ),
)
CHECKS = (
    Check("bare_base_is_robust_above_chance", lambda r: r["bare/worst"], at_least=15.0,
          text="the adversarially trained base keeps ≥ 15 % worst-case robust accuracy (chance is 10 %)"),
    Check("pap_natural_within_6_of_bare", lambda r: r["pap/natural"] - r["bare/natural"], at_least=-6.0,
          text="PAP's prompted natural accuracy is within 6 points of the base's (card §6 assertion 2; a check: "
          "doing nothing passes it)"),
    Check("nonadaptive_overstates_pap_by_15", lambda r: r["pap/nonadaptive"] - r["pap/worst"], at_least=15.0,
          text="the paper's non-adaptive attack overstates PAP's robust accuracy by ≥ 15 points against the worst "
          "case (card §4 and §9: non-adaptive numbers alone overstate robustness)"),
)  # fmt: skip


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms over 3 seeds, print the tables and claims, and (with ``out``) write ``pap.json`` and
    ``pap.png``. ``quick``: seed 0, bases and prompts at half the epochs, 250 test images, the suite's attack
    strength (:data:`callbacks.robust_eval.QUICK`), without the naturally trained base's report-only arms.

    Returns:
        flat results: ``<arm>/<metric>`` test accuracy in % for the metrics ``natural``, ``nonadaptive`` (PGD-10 on
        the bare base), ``worst`` (the worst case over every attack) and ``oracle`` (prompt arms), each also per
        seed (``.../seed<s>``); the per-attack table of the bare base and PAP (``per_attack/...``, full run); the
        final λ, the seconds, and the verdicts ``claims/...``, ``reported/...``, ``checks/...``, ``values/...``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an 8×8 CNN on batches of 128: extra threads only add overhead
    try:
        start = time.perf_counter()
        dm = ImageDataModule()
        dm.setup("fit")
        settings = SETTINGS["quick" if quick else "full"]
        n = settings["test_images"]
        data = (dm.train_set.x, dm.train_set.y, dm.test_set.x[:n], dm.test_set.y[:n])
        seeds, arms = settings["seeds"], list(settings["arms"])
        r: dict[str, Any] = {k: v for k, v in settings.items() if k.endswith("epochs")} | {"num_seeds": len(seeds)}
        r |= {f"strength/{k}": v for k, v in settings["strength"].items()} | {"test_images": len(data[3])}
        run_arms(arms, seeds, PapExperiment(settings, data, r), results=r)
        r["seconds"] = time.perf_counter() - start
        table = arm_table(
            r, arms, list(METRICS),
            f"PAP on digits: test accuracy %, ε = {EPS} (α = {ALPHA}), mean ± std of {len(seeds)} seeds",
            labels=LABELS, fmt="{:.1f}",
        )  # fmt: skip
        gain = r["pap/nonadaptive"] - r["bare/nonadaptive"], r["pap/worst"] - r["bare/worst"]
        notes = [
            (
                f"final λ (mean over seeds): PAP {r.get('lambda/pap', float('nan')):.2f}; PAP's robust gain over the "
                f"AT base, the paper's non-adaptive PGD-10 / the worst case: {gain[0]:+.1f} / {gain[1]:+.1f} points; "
                f"total {r['seconds']:.0f} s"
            )
        ]
        if "per_attack/natural/pap" in r:
            keys = sorted(k.removeprefix("per_attack/") for k in r if k.startswith("per_attack/robust/"))
            notes.append("each attack alone, seed 0 (%): " + "; ".join(f"{k} {r['per_attack/' + k]:.1f}" for k in keys))
        return conclude("pap", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[table], notes=notes)
    finally:
        torch.set_num_threads(threads)


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if f"{a}/natural" in r]
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(METRICS)
    for i, metric in enumerate(METRICS):
        ax.bar([j + i * width for j in range(len(arms))], [r.get(f"{a}/{metric}", float("nan")) for a in arms], width, label=metric)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(arms))], arms, fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("PAP on digits: natural, non-adaptive PGD-10, worst-case and oracle-prompt accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
