"""Control-variates evaluation: unbiased win rates from human + synthetic feedback (Zhou, Song, Zanette, ICML 2025)."""

from zoo.models.cv_winrate.module import PairwiseRewardModel
from zoo.models.cv_winrate.scorer import HFScorer, MLPScorer, bradley_terry_loss, preference_probability

__all__ = ["PairwiseRewardModel", "MLPScorer", "HFScorer", "bradley_terry_loss", "preference_probability"]
