"""SEAD: unsupervised ensemble of streaming anomaly detectors (Shah et al., ICML 2025)."""

from zoo.models.sead.detectors import DETECTORS, StreamDetector, build_detector, build_pool, default_pool, paper_pool
from zoo.models.sead.ensemble import SEADEnsemble
from zoo.models.sead.hedge import Hedge, SEADPlusPlusSampler
from zoo.models.sead.module import SEAD
from zoo.models.sead.normalize import QuantileNormalizer

__all__ = [
    "SEAD",
    "SEADEnsemble",
    "Hedge",
    "SEADPlusPlusSampler",
    "QuantileNormalizer",
    "StreamDetector",
    "DETECTORS",
    "build_detector",
    "build_pool",
    "default_pool",
    "paper_pool",
]
