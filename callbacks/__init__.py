"""Lightning callbacks that work with any zoo module exposing the documented properties."""

from callbacks.diffusion_samples import DiffusionSamples
from callbacks.images import log_figure
from callbacks.robust_eval import RobustEvaluation
from callbacks.sae_stability import SAEStability
from callbacks.snn_conversion import SNNConversion
from callbacks.streaming_ap import StreamingAveragePrecision
from callbacks.timestep_experts import TimestepExpertsSchedule
from callbacks.training_dynamics import TrainingDynamics
from callbacks.transport import TransportSamples
from callbacks.weight_trace import WeightTrace

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
