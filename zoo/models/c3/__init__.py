"""C³R: causal complete cause regularisation for multi-modal learning (Wang et al., ICML 2025; the official code
WangJingyao07/Multi-Modal-Base is a non-runnable sketch, so the regulariser follows the card's reconstruction)."""

from zoo.models.c3.mixin import C3Regularized
from zoo.models.c3.module import C3Classifier
from zoo.models.c3.regularizer import C3Regularizer, counterfactual, counterfactual_risks

__all__ = ["C3Classifier", "C3Regularized", "C3Regularizer", "counterfactual", "counterfactual_risks"]
