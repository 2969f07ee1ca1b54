"""DUAL: dataset pruning from early training dynamics, difficulty × uncertainty (Cho et al., ICML 2025)."""

from zoo.models.dual.data import PrunableImageDataModule
from zoo.models.dual.module import DualClassifier, build_backbone
from zoo.models.dual.scores import (
    aum_score,
    balanced_random_select,
    beta_select,
    ccs_select,
    check_probabilities,
    dual_score,
    dyn_unc_score,
    el2n_score,
    entropy_score,
    forgetting_score,
    keep_count,
    random_select,
    tdds_score,
    topk_select,
)

__all__ = [
    "DualClassifier",
    "PrunableImageDataModule",
    "build_backbone",
    "aum_score",
    "balanced_random_select",
    "beta_select",
    "ccs_select",
    "check_probabilities",
    "dual_score",
    "dyn_unc_score",
    "el2n_score",
    "entropy_score",
    "forgetting_score",
    "keep_count",
    "random_select",
    "tdds_score",
    "topk_select",
]
