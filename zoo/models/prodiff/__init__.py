"""ProDiff: prototype-guided diffusion for trajectory imputation from two endpoints (Bu et al., ICML 2025)."""

from zoo.models.prodiff.baselines import linear_interpolation
from zoo.models.prodiff.diffusion import EndpointDiffusion, hold_endpoints
from zoo.models.prodiff.module import ProDiff
from zoo.models.prodiff.prototypes import (
    IterativeKMeans,
    TrajectoryTransformer,
    cluster_consistency_loss,
    match_prototypes,
    prototype_triplet_loss,
)
from zoo.models.prodiff.unet import GuidedUNet1D, WideAndDeep

__all__ = [
    "EndpointDiffusion",
    "GuidedUNet1D",
    "IterativeKMeans",
    "ProDiff",
    "TrajectoryTransformer",
    "WideAndDeep",
    "cluster_consistency_loss",
    "hold_endpoints",
    "linear_interpolation",
    "match_prototypes",
    "prototype_triplet_loss",
]
