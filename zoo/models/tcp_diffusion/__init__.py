"""TCP-Diffusion: tropical cyclone precipitation forecasting by multi-modal conditional diffusion over adjacent
residuals (Huang, Mu, Bai & Watson, ICML 2025; test code xiaochengfuhuo/TCP-Diffusion)."""

from zoo.models.tcp_diffusion.encoders import FieldStackEncoder, ScalarSequenceEncoder
from zoo.models.tcp_diffusion.forecaster import TCPForecaster, ensemble_mean, persistence
from zoo.models.tcp_diffusion.module import TCPDiffusion
from zoo.nn.residual_target import AdjacentResidualTarget

__all__ = [
    "AdjacentResidualTarget",
    "FieldStackEncoder",
    "ScalarSequenceEncoder",
    "TCPDiffusion",
    "TCPForecaster",
    "ensemble_mean",
    "persistence",
]
