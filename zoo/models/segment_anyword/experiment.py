"""The arms of ``zoo reproduce segment-anyword`` on the frozen toy text-to-image model: the pipeline, its baselines
and ablations, and the non-learned heuristics, all scored on the same scenes.

The test scenes (``SCENES``) are textured captioned shapes: half *shared-colour* (every object in one colour, so the
colour word cannot tell the named object from the others and only the shape word can), a quarter *hard* (two named
objects of one shape, told apart by colour), a quarter easy. One seed = new scenes and new pipeline noise.

The attention maps of a scene are computed once per map setting and shared by the arms that read them:

* ``tuned``: test-time textual inversion + DDIM inversion with Direct Inversion (the paper's);
* ``untuned``: the inversion without textual inversion;
* ``raw_tuned``: textual inversion, maps from the noised image (no inversion);
* ``raw``: neither (DAAM-style: the image noised at 10 timesteps over [50, 600], one forward each);
* ``random``: a random smooth map (a stand-in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.datamodules.shapes import captioned_shapes
from zoo.metrics.grounding import GroundingIoU
from zoo.models.segment_anyword.heuristics import (
    colour_component,
    colour_match,
    random_component,
    shape_template,
    texture_component,
)

__all__ = ["ARMS", "HEURISTIC_ARMS", "METRICS", "PIPELINE_ARMS", "SCENES", "SUBSETS", "Experiment"]

SCENES = {"hard_fraction": 0.25, "shared_colour_fraction": 0.5, "textured": True}
SUBSETS = ("shared", "hard", "easy")
METRICS = tuple(f"{s}_{m}" for s in SUBSETS for m in ("miou", "giou")) + ("miou", "ciou", "giou")
MAP_SETTINGS = {
    "tuned": {},
    "untuned": {"tuning_steps": 0},
    "raw_tuned": {"mode": "raw"},
    "raw": {"mode": "raw", "tuning_steps": 0},
}
# arm -> (map setting, pipeline overrides)
PIPELINE_ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("tuned", {}),
    "raw": ("raw", {"refiner": None, "r1": False, "r2": False}),
    "raw_refined": ("raw", {}),
    "m1": ("tuned", {"refiner": None, "r1": False, "r2": False}),
    "no_tuning": ("untuned", {}),
    "no_inversion": ("raw_tuned", {}),
    "no_r1": ("tuned", {"r1": False}),
    "no_r2": ("tuned", {"r2": False}),
    "no_refiner": ("tuned", {"refiner": None}),
    "random_map": ("random", {}),
}
HEURISTIC_ARMS: dict[str, Callable[..., Tensor]] = {
    "colour_match": colour_match,
    "colour_component": colour_component,
    "random_object": random_component,
    "texture_component": texture_component,
    "shape_template": shape_template,
}
ARMS = (*PIPELINE_ARMS, *HEURISTIC_ARMS)


def _random_maps(k: int, size: int, generator: torch.Generator) -> Tensor:
    """``k`` random smooth maps ``(k, S, S)`` in [0, 1] (4 × 4 uniform noise, bilinearly upsampled, min-max scaled)."""
    noise = torch.rand(1, k, 4, 4, generator=generator)
    smooth = F.interpolate(noise, size=(size, size), mode="bilinear", align_corners=False)[0]
    lo, hi = smooth.amin((1, 2), keepdim=True), smooth.amax((1, 2), keepdim=True)
    return (smooth - lo) / (hi - lo)


class Experiment:
    """``experiment(arm, seed) -> metrics`` on one seed's scenes; a seed's scenes and maps are computed once.

    Args:
        model: a ``SegmentAnyword`` module (the frozen toy model).
        scenes: test scenes per seed.
        arms: the arms that will be asked for (only their map settings are computed).
        pipeline: settings for every pipeline arm (e.g. ``tuning_steps`` in the diagnosis's sweep).
    """

    def __init__(self, model: Any, scenes: int, arms: tuple[str, ...], **pipeline: Any) -> None:
        unknown = sorted(set(arms) - set(ARMS))
        if unknown:
            raise ValueError(f"unknown arms {unknown}; the arms are {ARMS}")
        self.model, self.scenes, self.arms, self.settings, self.seed = model, scenes, arms, pipeline, -1
        self.panels: dict[str, list[list[Tensor]]] = {}

    def scenes_of(self, seed: int) -> dict[str, Any]:
        return captioned_shapes(self.scenes, size=self.model.hparams.size, seed=10_000 + seed, **SCENES)

    def _prepare(self, seed: int) -> None:
        if seed == self.seed:
            return
        self.seed, self.data = seed, self.scenes_of(seed)
        needed = {PIPELINE_ARMS[a][0] for a in self.arms if a in PIPELINE_ARMS}
        self.maps: dict[str, list[Tensor]] = {k: [] for k in needed}
        pipe = self.model.pipeline(**self.settings)
        self.targets = [pipe.targets(caption) for caption in self.data["caption"]]
        with torch.inference_mode(False), torch.enable_grad():  # textual inversion needs autograd
            for i, (image, ids) in enumerate(zip(self.data["image"], self.data["tokens"])):
                positions = pipe.flat_positions(self.targets[i][1])
                for setting in sorted(needed):
                    g = torch.Generator().manual_seed(1000 * seed + i)
                    if setting == "random":
                        self.maps[setting].append(_random_maps(len(positions), image.shape[-1], g))
                        continue
                    settings = self.settings | MAP_SETTINGS[setting]
                    self.maps[setting].append(self.model.pipeline(**settings).attention_maps(image, ids, positions, g))

    def masks(self, arm: str, i: int, seed: int) -> list[Tensor]:
        """The arm's mask of every named phrase of scene ``i``."""
        image, caption = self.data["image"][i], self.data["caption"][i]
        phrases, tokens = self.targets[i]
        g = torch.Generator().manual_seed(1000 * seed + i)
        if arm in HEURISTIC_ARMS:
            words = caption.split()
            out = []
            for p in phrases:
                colour, shape = words[p.modifiers[0]], words[p.noun]
                kwargs = {"generator": g} if arm == "random_object" else {}
                out.append(HEURISTIC_ARMS[arm](image, colour, shape, **kwargs))
            return out
        setting, overrides = PIPELINE_ARMS[arm]
        pipe = self.model.pipeline(**(self.settings | overrides))
        return pipe.masks_from_maps(image, self.maps[setting][i], phrases, tokens, g)

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
        self._prepare(seed)
        every = GroundingIoU(3)
        subsets = {s: GroundingIoU(3) for s in SUBSETS}
        shown = []
        for i in range(self.scenes):
            masks = self.masks(arm, i, seed)
            subset = (
                "hard" if bool(self.data["hard"][i]) else "shared" if bool(self.data["shared_colour"][i]) else "easy"
            )
            for k, mask in enumerate(masks[:2]):
                obj = int(self.data["phrase_object"][i, k])
                target, cls = self.data["masks"][i, obj][None], self.data["phrase_class"][i, k][None]
                every.update(mask[None], target, cls)
                subsets[subset].update(mask[None], target, cls)
            if len(shown) < 4 and subset == "shared" and len(masks) == 2:
                shown.append(masks)
        self.panels.setdefault(arm, shown)
        out = {k: float(v) for k, v in every.compute().items()}
        for s, metric in subsets.items():
            out |= {f"{s}_{k}": float(v) for k, v in metric.compute().items() if k != "ciou"}
        return out
