"""Detector configs, the registry of detector names, and the card's pools."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from torch import nn

from zoo.models.sead.detectors.base import StreamDetector
from zoo.models.sead.detectors.hst import HalfSpaceTrees
from zoo.models.sead.detectors.loda import LODA
from zoo.models.sead.detectors.random_scorer import RandomScorer
from zoo.models.sead.detectors.rshash import RSHash
from zoo.models.sead.detectors.window import MADScorer, WindowKNN

DETECTORS: dict[str, type[StreamDetector]] = {
    cls.name: cls for cls in (WindowKNN, RandomScorer, LODA, RSHash, HalfSpaceTrees, MADScorer)
}


def build_detector(config: dict[str, Any], dim: int, seed: int = 0) -> StreamDetector:
    """Build one detector from ``{"name": ..., "params": {...}}`` (``params`` optional).

    Raises:
        ValueError: unknown name (with close matches and every known name) or unknown parameter names.

    Example:
        >>> build_detector({"name": "knn", "params": {"k": 3, "window": 64}}, dim=4).config
        {'name': 'knn', 'params': {'k': 3, 'window': 64, 'dims': None}}
    """
    if not isinstance(config, dict) or "name" not in config:
        raise ValueError(f"A detector config is a dict {{'name': ..., 'params': {{...}}}}, got {config!r}.")
    name, params = config["name"], dict(config.get("params") or {})
    if name not in DETECTORS:
        close = difflib.get_close_matches(str(name), DETECTORS, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown detector {name!r}.{hint} Known detectors: {', '.join(sorted(DETECTORS))}.")
    cls = DETECTORS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "dim", "seed")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"Detector {name!r} got unknown params {unknown}; it accepts {accepted}.")
    return cls(dim, seed, **params)


def build_pool(configs: list[dict[str, Any]], dim: int, seed: int = 0) -> nn.ModuleList:
    """Build the pool; detector i gets seed ``seed + i``.

    Raises:
        ValueError: an empty ``configs`` list, or a bad config (see ``build_detector``).

    Example:
        >>> len(build_pool(default_pool(4), dim=4))
        7
    """
    if not configs:
        raise ValueError("SEAD needs a non-empty pool of detectors, got an empty pool. Try default_pool(dim).")
    return nn.ModuleList([build_detector(c, dim, seed + i) for i, c in enumerate(configs)])


def default_pool(dim: int, num_random: int = 4) -> list[dict[str, Any]]:
    """The card's §6 pool: kNN (k=5, window=256) on the first half of the features, on the second half and on all,
    plus ``num_random`` random scorers. For ``dim=4`` the halves are dims [0, 1] and [2, 3].

    Example:
        >>> [c["params"].get("dims") for c in default_pool(4, num_random=1)]
        [[0, 1], [2, 3], None, None]
    """
    if dim < 2:
        raise ValueError(f"default_pool splits the features in two halves and needs dim >= 2, got {dim}.")
    if num_random < 0:
        raise ValueError(f"default_pool expects num_random >= 0, got {num_random}.")
    half = dim // 2
    knn = [
        {"name": "knn", "params": {"k": 5, "window": 256, "dims": dims}}
        for dims in (list(range(half)), list(range(half, dim)), None)
    ]
    return knn + [{"name": "random", "params": {}} for _ in range(num_random)]


def paper_pool(dim: int) -> list[dict[str, Any]]:
    """The paper's pool shape (card §3, §5 proposal): 3 algorithms × 4 settings + 1 rule = 13 detectors.

    LODA stands in for xStream (both are random-projection density estimators); the settings below are this
    reconstruction's choice (the paper's Table 11 values were not retrieved).

    Example:
        >>> [c["name"] for c in paper_pool(4)].count("hst"), len(paper_pool(4))
        (4, 13)
    """
    if dim < 1:
        raise ValueError(f"paper_pool expects dim >= 1, got {dim}.")
    loda = [(25, 10), (50, 20), (100, 20), (50, 30)]
    rshash = [(25, 128, 2), (50, 256, 4), (100, 256, 4), (50, 512, 6)]
    hst = [(25, 6, 128), (25, 8, 250), (50, 8, 250), (25, 10, 500)]
    return (
        [{"name": "loda", "params": {"num_projections": p, "bins": b}} for p, b in loda]
        + [{"name": "rshash", "params": {"num_components": r, "sample_size": s, "hashes": h}} for r, s, h in rshash]
        + [{"name": "hst", "params": {"num_trees": t, "depth": dp, "window": w}} for t, dp, w in hst]
        + [{"name": "mad", "params": {"window": 256}}]
    )
