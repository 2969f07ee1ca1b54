"""``zoo reproduce segment-anyword``: the training-free pipeline against raw cross-attention, its own components
removed, and the non-learned heuristics, on the frozen toy text-to-image model (the hub entry).

The task (``experiment.SCENES``): textured captioned shapes, half of them *shared-colour* (every object in one colour:
colour matching, per pixel, cannot pick the named object; only the shape word can). The claims are judged there; the
hard scenes (two named objects of one shape, the card's §6 subset) and the easy ones are reported beside them.

Arms (``experiment``), each on the same scenes and noise:

* **full** (M2): test-time textual inversion (40 steps), DDIM inversion with Direct Inversion, R1 (noun ⊙ adjective
  map), R2 (the other phrase's points as negatives), 3 positive points, background seeds and the random-walker refiner;
* baselines: **raw** (B0, DAAM-style cross-attention: the image noised at 10 timesteps, thresholded, largest
  component) and **raw_refined** (DAAM's maps through the pipeline's points, R1, R2 and refiner);
* ablations: **m1** (maps only, no regularisation or refiner), **no_tuning**, **no_inversion**, **no_r1**, **no_r2**,
  **no_refiner**, and **random_map** (the post-processing on a random smooth map, a stand-in);
* alternatives (``heuristics``): **colour_match**, **colour_component**, **random_object**; and **shape_template**, the
  ceiling of hand-built rules (it draws the generator's own shapes), reported, not a stand-in.

Metrics (``zoo.metrics.grounding``): mIoU over the three shape classes and gIoU (the mean IoU per phrase) of each named
phrase's mask against its object, per subset, and mIoU / cIoU / gIoU over all scenes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zoo.claims import Check, Claim
from zoo.models.segment_anyword.diagnosis import diagnose
from zoo.models.segment_anyword.experiment import ARMS, METRICS, Experiment
from zoo.models.segment_anyword.report import plot
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "SETTINGS", "diagnose", "run"]

SETTINGS = {"full": {"seeds": (0, 1, 2), "scenes": 64}, "quick": {"seeds": (0,), "scenes": 24}}

BASELINES = {
    "raw": "raw cross-attention (DAAM-style B0: noised image, 10 timesteps), thresholded, largest component",
    "raw_refined": "raw cross-attention through the pipeline's points, R1, R2 and refiner (DAAM maps + refinement)",
}
ABLATIONS = {
    "m1": "textual inversion and inversion, no prompt regularisation or refiner (M1)",
    "no_tuning": "the full pipeline without test-time textual inversion",
    "no_inversion": "the full pipeline on maps of the noised image (no DDIM / Direct inversion)",
    "no_r1": "the full pipeline without R1 (the noun's map alone)",
    "no_r2": "the full pipeline without R2 (no negatives from the other phrase)",
    "no_refiner": "the regularised map thresholded, no point-prompt refiner",
    "random_map": "the full post-processing on a random smooth map (a stand-in)",
}
ALTERNATIVES = {
    "colour_match": "every pixel nearest in colour to the phrase's colour word",
    "colour_component": "the largest connected component of the phrase's colour",
    "random_object": "a random object (a connected non-background component)",
    "texture_component": "the colour's component whose stripes fit the word's texture (a two-tap filter, given the "
    "generator's texture key)",
}


def _metric(name: str) -> Any:
    return lambda r, a: r[f"{a}/{name}"]


def _gain(name: str, over: str) -> Any:
    return lambda r, a: r[f"{a}/{name}"] - r[f"{over}/{name}"]


# Every claim is reported, none asserted: on the hub model (seeds 0-2 of 64 scenes and the quick run) the full pipeline
# clears two bounds (gIoU over raw attention, shared-colour and hard) but stand-ins of every kind clear them too, and it
# misses the others (docs/papers/segment-anyword.md).
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "shared_giou_at_least_0.55",
        _metric("shared_giou"),
        at_least=0.55,
        method="full",
        baselines=BASELINES,
        ablations=ABLATIONS,
        alternatives=ALTERNATIVES,
        asserted=False,
        text="the task needs grounding: on the shared-colour scenes the full pipeline's per-phrase IoU is at least "
        "0.55, above what colour matching, the largest component of the colour and a random object reach (0.44-0.51)",
    ),
    Claim(
        "shared_giou_above_raw_attention_by_0.10",
        _gain("shared_giou", "raw"),
        at_least=0.10,
        method="full",
        baselines=BASELINES,
        ablations=ABLATIONS,
        alternatives=ALTERNATIVES,
        asserted=False,
        text="paper: training-free grounding beats raw cross-attention; here on the shared-colour scenes (only the "
        "shape word names the object) the full pipeline's per-phrase IoU is 0.10 above raw attention's, and no "
        "baseline, ablation or heuristic gets there",
    ),
    Claim(
        "shared_miou_above_raw_attention_by_0.10",
        _gain("shared_miou", "raw"),
        at_least=0.10,
        method="full",
        baselines=BASELINES,
        ablations=ABLATIONS,
        alternatives=ALTERNATIVES,
        asserted=False,
        text="the same on the per-class mIoU of the shared-colour scenes",
    ),
    *(
        Claim(
            f"{what}_adds_0.02_shared_miou",
            _gain("shared_miou", arm),
            at_least=0.02,
            method="full",
            ablations={arm: ABLATIONS[arm]},
            why_none={
                "baselines": "a component's worth is the method against itself less that component",
                "alternatives": "as for baselines: the comparison is within the pipeline",
            },  # fmt: skip
            asserted=False,
            text=f"paper Table 6: {text} helps (shared-colour mIoU, full minus the ablation)",
        )
        for what, arm, text in (
            ("textual_inversion", "no_tuning", "test-time textual inversion"),
            ("inversion", "no_inversion", "recording the maps along the inverted trajectory"),
            ("r1", "no_r1", "R1, positive adjective prompt clustering"),
            ("r2", "no_r2", "R2, negative mutual-exclusive prompt binding"),
            ("refiner", "no_refiner", "point-prompt refinement (SAM there, the random walker here)"),
        )
    ),
    Claim(
        "hard_giou_above_raw_attention_by_0.10",
        _gain("hard_giou", "raw"),
        at_least=0.10,
        method="full",
        baselines=BASELINES,
        ablations={k: ABLATIONS[k] for k in ("m1", "no_r1", "no_r2", "random_map")},
        alternatives=ALTERNATIVES,
        asserted=False,
        text="card §6: on the hard scenes (two named objects of one shape, told apart by colour) the full pipeline "
        "beats raw attention; colour matching solves these scenes, so this says nothing about grounding",
    ),
)
# No TaskCheck and no HEADLINES yet (the paper stays "evidence standard: pending"): on the shared-colour scenes the full
# pipeline does not beat the per-pixel heuristics (seeds 0-2: see docs/papers/segment-anyword.md), so every claim is
# reported, none asserted, and the task check would fail.
CHECKS: tuple[Check, ...] = ()


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Every arm over 3 seeds of 64 scenes (``quick``: seed 0, 24 scenes) on the hub model; print the table and the
    claims, and (with ``out``) write ``segment-anyword.json``, ``segment-anyword.png`` (scores) and
    ``segment-anyword-masks.png`` (shared-colour scenes).

    Returns:
        flat results ``<arm>/<metric>`` (``experiment.METRICS``), each also per seed, and the verdicts.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny UNet at batch 1: one thread is fastest and does not stall on a shared CPU
    try:
        return _run(quick, out)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, out: Path | str | None) -> dict[str, Any]:
    import zoo

    settings = SETTINGS["quick" if quick else "full"]
    arms = ARMS
    start = time.perf_counter()
    model = zoo.load("segment-anyword")
    experiment = Experiment(model, settings["scenes"], arms)
    r: dict[str, Any] = {"num_seeds": len(settings["seeds"]), "scenes": settings["scenes"]}
    run_arms(list(arms), settings["seeds"], experiment, results=r)
    r["seconds"] = time.perf_counter() - start
    n = len(settings["seeds"])
    title = (f"grounding on {settings['scenes']} textured shape scenes per seed (1/2 shared-colour, 1/4 hard, 1/4 "
             f"easy), {n} seed(s)")  # fmt: skip
    tables = [arm_table(r, arms, METRICS, title)]

    def draw(results: Mapping[str, Any], path: Path) -> None:
        plot(results, experiment, arms, path)

    return conclude("segment-anyword", r, CLAIMS, CHECKS, out=out, plot=draw, tables=tables,
                    notes=[f"total {r['seconds']:.0f} s"])  # fmt: skip
