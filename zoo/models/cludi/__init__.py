"""CLUDI: clustering via self-supervised diffusion (Uziel, Chelly, Freifeld & Pakman, ICML 2025)."""

from zoo.models.cludi.denoiser import AssignmentDenoiser, MPSiLU
from zoo.models.cludi.diffusion import ClusterDiffusion, sqrt_schedule_betas
from zoo.models.cludi.losses import perturb_features, row_column_ce
from zoo.models.cludi.module import CLUDIModule

__all__ = [
    "AssignmentDenoiser",
    "CLUDIModule",
    "ClusterDiffusion",
    "MPSiLU",
    "perturb_features",
    "row_column_ce",
    "sqrt_schedule_betas",
]
