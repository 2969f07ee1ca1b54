"""Metrics shared by the zoo's papers: torchmetrics ``Metric`` classes (fixed-size sum states) and functionals."""

from zoo.metrics.dead_atoms import DeadAtomFraction
from zoo.metrics.dictionary_stability import (
    DictionaryStability,
    dictionary_stability,
    matched_permutation,
    stability_floor_gaussian,
    stability_floor_points,
)
from zoo.metrics.reconstruction import ReconstructionR2

__all__ = [
    "DeadAtomFraction",
    "DictionaryStability",
    "ReconstructionR2",
    "dictionary_stability",
    "matched_permutation",
    "stability_floor_gaussian",
    "stability_floor_points",
]
