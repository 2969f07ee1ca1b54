"""Metrics shared by the zoo's papers: torchmetrics ``Metric`` classes (fixed-size sum states) and functionals."""

from zoo.metrics.anomaly import anomaly_ap_metric, average_precision
from zoo.metrics.dead_atoms import DeadAtomFraction
from zoo.metrics.dictionary_stability import (
    DictionaryStability,
    dictionary_stability,
    matched_permutation,
    stability_floor_gaussian,
    stability_floor_points,
)
from zoo.metrics.energy_distance import EnergyDistance, energy_distance
from zoo.metrics.grounding import GroundingIoU, mask_iou
from zoo.metrics.imitation import ImitationMetrics, goal_fraction, longest_increasing, w_min
from zoo.metrics.pair_saving import AnnotationSaving
from zoo.metrics.precipitation import EnsembleCRPS, LeadTimeMAE, PrecipVerification, contingency, crps_ensemble
from zoo.metrics.reconstruction import ReconstructionR2
from zoo.metrics.trajectory import (
    FlowCorrelation,
    TrajectoryCoverage,
    TrajectoryError,
    haversine,
    trajectory_correlation,
)
from zoo.metrics.win_rate import (
    ControlVariatesWinRate,
    HumanWinRate,
    SyntheticWinRate,
    WinRateEstimate,
    bootstrap_mse,
    control_variates_win_rate,
    human_win_rate,
    ppi_win_rate,
    subset_estimates,
    synthetic_win_rate,
)

__all__ = [
    "AnnotationSaving",
    "anomaly_ap_metric",
    "average_precision",
    "ControlVariatesWinRate",
    "DeadAtomFraction",
    "DictionaryStability",
    "EnergyDistance",
    "EnsembleCRPS",
    "FlowCorrelation",
    "GroundingIoU",
    "HumanWinRate",
    "ImitationMetrics",
    "LeadTimeMAE",
    "PrecipVerification",
    "ReconstructionR2",
    "SyntheticWinRate",
    "TrajectoryCoverage",
    "TrajectoryError",
    "WinRateEstimate",
    "bootstrap_mse",
    "subset_estimates",
    "contingency",
    "control_variates_win_rate",
    "crps_ensemble",
    "dictionary_stability",
    "energy_distance",
    "goal_fraction",
    "haversine",
    "human_win_rate",
    "longest_increasing",
    "mask_iou",
    "matched_permutation",
    "ppi_win_rate",
    "stability_floor_gaussian",
    "stability_floor_points",
    "synthetic_win_rate",
    "trajectory_correlation",
    "w_min",
]
