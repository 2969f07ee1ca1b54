"""State-only demonstrations to imitate: goal sequences [N, goal_dim], a start pose and a step budget (ZILOT's §5).

Each shape is a polyline from a start pose; the car starts on its first vertex heading along its first segment, and the
goals are the remaining vertices (``sparse``) or points every 0.1 along it (``dense``). The budget is twice the steps
the polyline takes at the car's speed (the card's "2x (polyline length / speed)").

* ``zigzag``: five segments of 0.45 whose heading alternates between +65° and -65° (130° turns at every goal);
* ``u``: the four corners of a square of side 0.8, entered from above (90° turns);
* ``zigzag-heldout``: a zig-zag rotated by 90°, the held-out demonstration on which Pi+Cls's threshold is chosen.

Example:
    >>> demo = make_demo("zigzag", dense=False)
    >>> demo["goals"].shape, demo["budget"]
    (torch.Size([5, 2]), 113)
    >>> [d["name"] for d in demo_set("card")]
    ['zigzag-sparse', 'zigzag-sparse-mirror', 'zigzag-dense', 'zigzag-dense-mirror', 'u-sparse', 'u-sparse-mirror']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["demo_set", "make_demo", "polyline"]

SPEED = 0.04


def polyline(shape: str) -> np.ndarray:
    """The vertices [V, 2] of a named shape, the start first."""
    if shape in ("zigzag", "zigzag-heldout"):
        angles = np.radians([65, -65, 65, -65, 65])
        steps = 0.45 * np.stack([np.cos(angles), np.sin(angles)], axis=1)
        start = np.array([-0.5, -0.25])
        points = np.vstack([start, start + np.cumsum(steps, 0)])
        if shape == "zigzag-heldout":  # rotated by 90° about the origin
            points = points @ np.array([[0.0, 1.0], [-1.0, 0.0]])
        return points
    if shape == "u":
        return np.array([[-0.4, 0.65], [-0.4, 0.4], [-0.4, -0.4], [0.4, -0.4], [0.4, 0.4]])
    raise KeyError(f"unknown demonstration shape {shape!r}; the shapes are 'zigzag', 'u', 'zigzag-heldout'")


def _resample(points: np.ndarray, spacing: float) -> np.ndarray:
    """Points every ``spacing`` along the polyline after its start, ending on its last vertex."""
    seg = np.diff(points, axis=0)
    cum = np.r_[0.0, np.cumsum(np.linalg.norm(seg, axis=1))]
    at = np.r_[np.arange(spacing, cum[-1] - spacing / 2, spacing), cum[-1]]
    return np.stack([np.interp(at, cum, points[:, d]) for d in range(2)], axis=1)


def make_demo(shape: str, dense: bool = False, mirror: bool = False, spacing: float = 0.1) -> dict[str, Any]:
    """One demonstration: ``name``, ``goals`` [N, 2], ``start`` (x, y, θ) and ``budget`` (steps)."""
    points = polyline(shape)
    if mirror:
        points = points * np.array([1.0, -1.0])
    goals = _resample(points, spacing) if dense else points[1:]
    first = points[1] - points[0]
    length = float(np.linalg.norm(np.diff(points, axis=0), axis=1).sum())
    name = f"{shape}-{'dense' if dense else 'sparse'}{'-mirror' if mirror else ''}"
    return {
        "name": name,
        "goals": torch.tensor(goals, dtype=torch.float32),
        "start": torch.tensor([*points[0], math.atan2(first[1], first[0])], dtype=torch.float32),
        "budget": int(math.ceil(2 * length / SPEED)),
    }


def demo_set(name: str = "card") -> list[dict[str, Any]]:
    """``"card"``: zig-zag sparse and dense and U sparse, each with its mirror image (six); ``"quick"``: the three
    shapes once; ``"heldout"``: the zig-zag rotated by 90° (for choosing thresholds)."""
    if name == "card":
        return [
            make_demo(s, d, m) for s, d in (("zigzag", False), ("zigzag", True), ("u", False)) for m in (False, True)
        ]
    if name == "quick":
        return [make_demo(s, d) for s, d in (("zigzag", False), ("zigzag", True), ("u", False))]
    if name == "heldout":
        return [make_demo("zigzag-heldout")]
    raise KeyError(f"unknown demonstration set {name!r}; the sets are 'card', 'quick', 'heldout'")
