"""DUAL: dataset pruning from early training dynamics, difficulty × uncertainty (Cho et al., ICML 2025).

Work in progress (issue 5): the scores and selections are here; the classifier, DataModule, conf, hub entry and
reproduction follow.
"""

from zoo.models.dual.scores import (
    aum_score,
    beta_select,
    ccs_select,
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
    "aum_score",
    "beta_select",
    "ccs_select",
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
