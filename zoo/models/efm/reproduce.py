"""``zoo reproduce efm``: a learned electrostatic field carries P to a bimodal Q; the paper's choices against their
ablations, and EFM against Flow Matching, its own baseline.

The EFM card's §6 experiment, as a plain loop over the pure-torch parts (``experiment.py``; no Trainer):

* P = N(0, I₂) on the plate z = 0, Q = ½N((−4, 0), 0.25 I) + ½N((4, 0), 0.25 I) on the plate z = L = 6;
  fresh samples every step; held-out samples of P and Q for evaluation, drawn anew for every seed. The geometry
  matters here: about 30 % of the ground-truth field's lines cross the Q plate between the modes, loop behind it and
  land on its back side, so what a sampler does with them shows in the result;
* ``efm``: the card's MLP (3 × 256, SiLU, 16 Fourier features of z/L), 512 field points per step (segment + 0.5
  noise, 15 % outer points), 1024 charges per plate, the paper's normalised-field target, Adam 1e-3 with cosine
  decay; transport: Euler in z, 100 steps, f_z clamped at 1e-3 (clamped steps counted), lines stopped at z = L
  (the paper's Algorithm 2);
* baseline: ``flow_matching`` (independent coupling, the paper's comparison; the same MLP with t as its height
  input, the same batches, steps and schedule, Euler 100);
* ablations: ``efm_code_target`` (the official code's per-plate target), ``efm_uniform_sampler`` (the official
  ``Uniform`` field-point sampler: the segment without the card's noise and outer points), the behind-plate
  continuation off (``efm_behind_plate_stopped``: the field of ``efm_behind_plate``, trained with twice the outer
  points over a wider box, every line stopped at z = L), ``efm_init`` (the network untrained);
* alternatives: ``identity`` (no transport), ``affine`` (the optimal-transport map between Gaussian fits of P and
  Q), ``assignment`` (each particle sent to its partner in the exact assignment to as many fresh samples of Q), and
  for the behind-plate claims ``efm_snap`` / ``oracle_snap`` (lines stopped at z = L; those the continuation would
  follow sent to the nearest of 2,048 fresh samples of Q instead);
* the oracles: the same integrator on the Monte-Carlo field of fresh charges, with the paper's target
  (``oracle_paper``), the code's (``oracle_code_per_plate``), and the paper's with the lines followed behind the
  plate (``oracle_behind_plate``);
* full run only: the 8-Gaussians target (seed 0; identity, affine, oracle, EFM, Flow Matching; lines stopped at L);
* metrics: energy distance to held-out Q (``ed``; outputs beyond |x| = 20 held there and counted as ``diverged``),
  mode balance (share of outputs with x₁ > 0), ``mode_min`` (the smaller of the two shares of outputs within 1.5 of
  a mode centre), ``off_modes`` (farther than 1.5 from every centre), ``oracle_gap`` (the median distance between
  where a particle's line ends and where the oracle's line from the same start ends), clamped steps, lines followed
  behind / lost, POT's sliced W2, training steps/s.

The claims, their stand-ins by kind and their calibration are in ``CLAIMS`` and ``CHECKS``; the headlines and their
diagnoses (``zoo reproduce efm --diagnose``: the plate distance, the budget, the field-point sampler, the dimension) in
``HEADLINES`` and ``diagnosis.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.claims import Check, Claim, TaskCheck
from zoo.evidence import Headline
from zoo.models.efm.diagnosis import DIAGNOSIS_FLOW_MATCHING, diagnose
from zoo.models.efm.experiment import ARMS, ARMS_8G, SEEDS, L, TwoModesExperiment, oracle_transport, trajectories
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "HEADLINES", "diagnose", "oracle_transport", "run"]

METRICS = (
    "ed", "mode_min", "off_modes", "oracle_gap", "diverged", "clamped", "lines_behind", "lines_lost", "steps_per_s"
)  # fmt: skip
LABELS = {
    "identity": "identity (no transport)",
    "affine": "affine map (Gaussian OT)",
    "assignment": "assignment to fresh Q samples",
    "efm_init": "EFM, untrained field",
    "efm": "EFM (paper target)",
    "efm_code_target": "EFM, code target",
    "efm_uniform_sampler": "EFM, official Uniform sampler",
    "flow_matching": "Flow Matching",
    "efm_behind_plate": "EFM + behind-plate lines",
    "efm_behind_plate_stopped": "  same field, stopped at L",
    "efm_snap": "  same field, crossing lines snapped to Q",
    "oracle_paper": "oracle, paper target",
    "oracle_code_per_plate": "oracle, code target",
    "oracle_behind_plate": "oracle + behind-plate lines",
    "oracle_snap": "oracle, crossing lines snapped to Q",
}

_FM = "Flow Matching, independent coupling: the paper's baseline, on the same MLP, batches, steps and schedule"
_IDENTITY = "no transport: the samples of P left where they are"
_AFFINE = "the optimal-transport map between Gaussian fits of P and Q (4,096 samples each): no learning"
_ASSIGNMENT = "each particle sent to its partner in the exact assignment to as many fresh samples of Q"
_UNTRAINED = "the same network at its initialisation (no training): the field it would follow without learning"
_CODE_TARGET = "EFM trained on the official code's per-plate target (card §2.2, §6 ablation d)"
_UNIFORM = "EFM trained on the official Uniform sampler's field points (no noise, no outer points)"
_SNAP = (
    "the same field's lines stopped at z = L, and those the continuation would follow (f_z > 0 just past the "
    "plate) sent to the nearest of 2,048 fresh samples of Q: the cheap fix instead of following them"
)

_WHY_NONE_TARGET = {
    "baselines": "Flow Matching has no field target: the claim compares EFM's two targets (card §2.2)",
    "alternatives": "no non-learned rule stands in for a field target; the non-learned maps are scored in the "
    "transport claim",
}
_WHY_NONE_LINES = {"baselines": "Flow Matching has no field lines to continue: the claim is about EFM's own theorem"}

def _ed(arm: str) -> Callable[[Mapping[str, Any], str], float]:
    """``value(r, a) = ED(a) / ED(arm)``: the energy distance relative to another arm's."""
    return lambda r, a: r[f"{a}/ed"] / r[f"{arm}/ed"]


def _best_efm(r: Mapping[str, Any]) -> float:
    """The better EFM's energy distance: lines stopped at z = L, or followed behind the plate."""
    return min(r["efm/ed"], r["efm_behind_plate/ed"])


# Calibration (``OMP_NUM_THREADS=1``; full: 3000 steps, 2000 particles, 2048 charges, seeds 0 / 1 / 2, the recorded
# run and /tmp/efm-calib; quick: 1000 steps, 1000 particles, 1024 charges, seed 0). Each asserted claim's value for the
# method | its nearest stand-in; the bound sits between them with room on both sides:
# efm − efm_code_target: −0.220 / −0.225 / −0.200 (quick −0.210) | 0, bound −0.08;
# oracle_paper − oracle_code_per_plate: −0.193 / −0.177 / −0.159 (quick −0.198) | 0, bound −0.08;
# oracle_behind_plate / oracle_paper: 0.071 / 0.086 / 0.117 (quick 0.148) | oracle_snap 0.292 / 0.266 / 0.295 (quick
#   0.282), bound 0.2;
# efm_behind_plate / efm_snap: 0.744 / 0.861 / 0.893 (quick 0.81) | efm_behind_plate_stopped 1.53 / 1.66 / 1.67,
#   bound 0.95;
# flow_matching − min(efm, efm_behind_plate): −0.055 / −0.060 / −0.039 (quick −0.056) | efm_code_target +0.25 or
#   more, bound −0.02;
# task check, min(affine, identity) − efm: 0.373 / 0.385 / 0.358 (quick 0.355), margin 0.2.
# Reported: efm / identity 0.053 / 0.054 / 0.047, passed by Flow Matching (−0.001 / −0.001 / 0.006) and the assignment
# (0.006); efm − oracle_paper −0.006 / −0.046 / −0.028, passed by Flow Matching (−0.13) and on seeds 1 and 2 by the
# Uniform-sampler field (+0.218 / −0.001 / +0.038).
CLAIMS = (
    Claim(
        "efm_transports_p_to_q",
        _ed("identity"),
        at_most=0.15,
        method="efm",
        baselines={"flow_matching": _FM},
        ablations={"efm_code_target": _CODE_TARGET, "efm_uniform_sampler": _UNIFORM, "efm_init": _UNTRAINED},
        alternatives={"affine": _AFFINE, "assignment": _ASSIGNMENT, "identity": _IDENTITY},
        asserted=False,
        text="the learned field transports P to Q: ED(EFM) ≤ 0.15·ED(identity) (card §6: 0.25, tightened below the "
        "affine map's ≈ 0.24). Reported: Flow Matching and the assignment to fresh samples of Q pass it too, so it "
        "says a learned transport works here, not that EFM's is needed",
    ),
    Claim(
        "efm_within_0.1_of_oracle",
        lambda r, a: r[f"{a}/ed"] - r["oracle_paper/ed"],
        at_most=0.1,
        method="efm",
        baselines={"flow_matching": _FM},
        ablations={"efm_code_target": _CODE_TARGET, "efm_uniform_sampler": _UNIFORM, "efm_init": _UNTRAINED},
        alternatives={"affine": _AFFINE, "identity": _IDENTITY},
        asserted=False,
        text="the learned field transports about as well as the ground-truth field it regresses: ED(EFM) ≤ ED(oracle, "
        "same integrator) + 0.1 (card: +0.3, tightened so that the code-target ablation fails it). Reported: Flow "
        "Matching and, on some seeds, the field trained on the official Uniform field points pass it too; the end "
        "points (oracle_gap, the median distance to where the oracle's line from the same start ends) do not "
        "separate them either",
    ),
    Claim(
        "paper_target_beats_code_target",
        lambda r, a: r[f"{a}/ed"] - r["efm_code_target/ed"],
        at_most=-0.08,
        method="efm",
        ablations={"efm_code_target": "the official code's per-plate target in the paper target's place"},
        why_none=_WHY_NONE_TARGET,
        text="the paper's normalised total field trains a better transport than the official code's sum of "
        "per-plate unit fields: ED(EFM) ≤ ED(EFM, code target) − 0.08",
    ),
    Claim(
        "oracle_paper_target_beats_code_target",
        lambda r, a: r[f"{a}/ed"] - r["oracle_code_per_plate/ed"],
        at_most=-0.08,
        method="oracle_paper",
        ablations={"oracle_code_per_plate": "the official code's target in the paper target's place"},
        why_none=_WHY_NONE_TARGET,
        text="the same on the ground-truth fields (no learning): ED(oracle, paper) ≤ ED(oracle, code) − 0.08",
    ),
    Claim(
        "behind_plate_lines_cut_oracle_ed_to_a_fifth",
        _ed("oracle_paper"),
        at_most=0.2,
        method="oracle_behind_plate",
        ablations={"oracle_paper": "the same oracle field with every line stopped at z = L (continuation off)"},
        alternatives={"oracle_snap": _SNAP},
        why_none=_WHY_NONE_LINES,
        text="the theorem's other half: lines that cross the plate between the modes come back onto Q from behind, "
        "ED ≤ 0.2·ED(lines stopped at z = L), which snapping the crossing lines to Q's samples does not reach",
    ),
    Claim(
        "learned_behind_plate_lines_beat_snapping",
        _ed("efm_snap"),
        at_most=0.95,
        method="efm_behind_plate",
        ablations={
            "efm": "the card's EFM, lines stopped at z = L",
            "efm_behind_plate_stopped": "the same wider-trained field with every line stopped at z = L "
            "(continuation off)",
        },
        alternatives={"efm_snap": _SNAP},
        why_none=_WHY_NONE_LINES,
        text="following the learned lines behind the plate is the better fix for the lines that cross it: ED ≤ "
        "0.95·ED(the same field's crossing lines snapped to the nearest samples of Q); stopping them at z = L is "
        "worse still",
    ),
    Claim(
        "efm_ahead_of_flow_matching",
        lambda r, a: r[f"{a}/ed"] - r["flow_matching/ed"],
        at_most=-0.005,
        method="efm_behind_plate",
        ablations={"efm": "EFM with its lines stopped at z = L (the paper's Algorithm 2)"},
        alternatives={"affine": _AFFINE},
        why_none={"baselines": "Flow Matching is this claim's reference: the value is the lead over it"},
        asserted=False,
        text="EFM (the better of its two samplers, lines followed behind the plate) transports closer to Q than "
        "Flow Matching at the same budget: ED(EFM) ≤ ED(Flow Matching) − 0.005 (the paper's comparison)",
    ),
    Claim(
        "flow_matching_ahead_of_efm",
        lambda r, a: r[f"{a}/ed"] - _best_efm(r),
        at_most=-0.02,
        method="flow_matching",
        alternatives={"affine": _AFFINE, "identity": _IDENTITY},
        why_none={
            "baselines": "Flow Matching is the paper's baseline and this claim's method; the EFM arms are its "
            "reference",
            "ablations": "the claim asks whether the paper's baseline, as the paper runs it, is ahead of EFM; a "
            "weakened Flow Matching would answer another question",
        },
        text="Flow Matching at the same budget is ahead of the better EFM by ≥ 0.02 energy distance: it "
        "contradicts the paper's comparison at this scale. The assignment to fresh samples of Q is ahead too; it "
        "is not a stand-in here, since a lead over EFM is what this claim asserts",
    ),
)
CHECKS = (
    TaskCheck(
        lambda r, a: r[f"{a}/ed"],
        method="efm",
        heuristics={"affine": _AFFINE, "identity": _IDENTITY},
        margin=0.2,
        higher_is_better=False,
        text="the task needs a learned transport: EFM's energy distance is ≥ 0.2 below the Gaussian OT map's (which "
        "cannot split P into two modes) and the identity's. Resampling Q solves every sampling task; it is the "
        "transport claim's alternative, where it passes",
    ),
    Check(
        "efm_clamped_steps_below_1pct",
        lambda r: r["efm/clamped"],
        at_most=0.01,
        text="z stays a valid clock along the learned lines (f_z > 0): ≤ 1 % clamped steps",
    ),
    Check(
        "efm_mode_balance_within_0.35_0.65",
        lambda r: r["efm/balance"],
        at_least=0.35,
        at_most=0.65,
        text="the card's mode balance (share with x₁ > 0); the identity map passes it too (≈ 0.5), so a check",
    ),
    Check(
        "oracle_behind_plate_lines_lost_at_most_1pct",
        lambda r: r["oracle_behind_plate/lines_lost"],
        at_most=0.01,
        text="the oracle's lines followed behind the plate come back within the step budget",
    ),
    Check(
        "efm_behind_plate_lines_lost_at_most_5pct",
        lambda r: r["efm_behind_plate/lines_lost"],
        at_most=0.05,
        text="the learned lines followed behind the plate come back within the step budget",
    ),
    Check(
        "oracle_clamped_steps_below_1pct",
        lambda r: r["oracle_paper/clamped"],
        at_most=0.01,
        text="the ground-truth field keeps f_z > 0 along the lines (the card's check: no clamped step)",
    ),
)
HEADLINES = [
    Headline(
        "lines_carry_p_to_q",
        "Following the field lines from P ends on the other plate with distribution Q, counting the lines that leave "
        "the capacitor and come back to the back side of the Q plate",
        claims=["behind_plate_lines_cut_oracle_ed_to_a_fifth", "learned_behind_plate_lines_beat_snapping"],
        paper="the paper's theorem (card §1); toy figures, no number",
    ),
    Headline(
        "paper_target",
        "The field to learn is the normalised total Coulomb field E/‖E‖ (the paper's loss; the official code sums the "
        "two plates' unit fields instead)",
        claims=["paper_target_beats_code_target", "oracle_paper_target_beats_code_target"],
        paper="the paper's Algorithm 1 (poster); the card's oracle check: 0.11-0.16 against 0.27-0.32",
    ),
    Headline(
        "ahead_of_flow_matching",
        "EFM generates and translates better than Flow Matching",
        claims=["efm_ahead_of_flow_matching"],
        contradicted_by=["flow_matching_ahead_of_efm"],
        paper="CIFAR-10 FID 2.62 vs 2.99; CMNIST '2'→'3' CMMD 0.93 vs 1.06 (secondhand: the follow-up paper)",
        diagnosis=DIAGNOSIS_FLOW_MATCHING,
    ),
]


def run(
    quick: bool = False, out: Path | str | None = None, *, seeds: Sequence[int] | None = None
) -> dict[str, Any]:
    """Run the arms, print the tables and claims, and (with ``out``) write ``efm.json`` and ``efm.png``.

    ``quick``: 1000 training steps, 1000 particles, 1024 oracle charges, seed 0, no 8 Gaussians; full: the card's
    3000 steps, 2000 particles, 2048 oracle charges, seeds 0, 1, 2, and the 8 Gaussians (seed 0). ``seeds``
    overrides the seeds (calibration).

    Returns:
        flat results: ``<arm>/<metric>`` (means over seeds) and ``<arm>/<metric>/seed<s>``, ``8g/<arm>/<metric>``,
        the settings, seconds, and the verdicts ``claims/...``, ``reported/...``, ``checks/...``, ``values/...``,
        ``headlines/...``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 3 × 256 MLP on 512 points and 512 × 2048 distances: extra threads only add overhead
    try:
        return _run(quick, out, seeds)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, out: Path | str | None, seeds: Sequence[int] | None) -> dict[str, Any]:
    start = time.perf_counter()
    steps, particles, charges = (1000, 1000, 1024) if quick else (3000, 2000, 2048)
    seeds = tuple(SEEDS["quick" if quick else "full"] if seeds is None else seeds)
    experiment = TwoModesExperiment(steps, particles, charges, plot_seed=seeds[0])
    r: dict[str, Any] = {"steps": steps, "particles": particles, "oracle_charges": charges, "num_seeds": len(seeds)}
    run_arms(ARMS, seeds, experiment.two_modes, results=r)
    tables = [
        arm_table(
            r,
            ARMS,
            METRICS,
            f"EFM on N(0, I) -> two modes (L = {L}): {steps} steps, {particles} particles, seeds {list(seeds)}",
            LABELS,
            fmt="{:.4g}",
        )
    ]
    if not quick:
        run_arms(ARMS_8G, seeds[:1], experiment.eight_gaussians, prefix="8g/", results=r)
        tables.append(
            arm_table(r, ARMS_8G, METRICS, f"8 Gaussians (seed {seeds[0]}, lines stopped at z = L)", LABELS,
                      prefix="8g/", fmt="{:.4g}")
        )
    r["seconds"] = time.perf_counter() - start
    notes = [
        f"training: EFM {r['efm/steps_per_s']:.0f} steps/s, Flow Matching {r['flow_matching/steps_per_s']:.0f} "
        f"steps/s; total {r['seconds']:.0f} s."
    ]

    def plot(results: Mapping[str, Any], path: Path) -> None:
        shown = {"P (identity)": "identity", "affine map": "affine", "EFM": "efm"}
        shown |= {"EFM + behind-plate": "efm_behind_plate", "Flow Matching": "flow_matching"}
        samples = {name: experiment.samples[arm] for name, arm in shown.items()}
        lines = trajectories(experiment.efm, experiment.samples["identity"][:40])
        ed = {name: results[f"{arm}/ed/seed{seeds[0]}"] for name, arm in shown.items()}
        _plot(samples, experiment.plot_q, lines, ed, path)

    return conclude("efm", r, CLAIMS, CHECKS, out=out, plot=plot, tables=tables, notes=notes, headlines=HEADLINES)


def _plot(samples: dict[str, Tensor], q: Tensor, lines: Tensor, ed: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(samples) + 1, figsize=(4 * (len(samples) + 1), 4))
    for ax, (name, x) in zip(axes, samples.items()):
        ax.scatter(q[:, 0], q[:, 1], s=2, c="0.75", label="Q (held out)")
        ax.scatter(x[:, 0], x[:, 1], s=2, c="C0", label=name)
        ax.set_title(f"{name}: ED {ed[name]:.3f}")
        ax.set_xlim(-7, 7)
        ax.set_ylim(-4, 4)
        ax.legend(loc="upper right", fontsize=7, markerscale=4)
    ax = axes[-1]
    for k in range(lines.shape[1]):
        ax.plot(lines[:, k, 0], lines[:, k, 2], lw=0.8, c="C1")
    ax.axhline(0, c="k", lw=1)
    ax.axhline(L, c="k", lw=1)
    ax.set_xlabel("x₁")
    ax.set_ylabel("z")
    ax.set_title("learned field lines (x₁, z): P plate z=0 → Q plate z=L")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
