"""Lightning callbacks that work with any zoo module exposing the documented properties."""

from zoo.callbacks.diffusion_samples import DiffusionSamples
from zoo.callbacks.images import log_figure
from zoo.callbacks.robust_eval import RobustEvaluation
from zoo.callbacks.sae_stability import SAEStability
from zoo.callbacks.snn_conversion import SNNConversion
from zoo.callbacks.streaming_ap import StreamingAveragePrecision
from zoo.callbacks.timestep_experts import TimestepExpertsSchedule
from zoo.callbacks.training_dynamics import TrainingDynamics
from zoo.callbacks.transport import TransportSamples
from zoo.callbacks.weight_trace import WeightTrace

__all__ = [
    "DiffusionSamples",
    "RobustEvaluation",
    "SAEStability",
    "SNNConversion",
    "StreamingAveragePrecision",
    "TimestepExpertsSchedule",
    "TrainingDynamics",
    "TransportSamples",
    "WeightTrace",
    "log_figure",
]
