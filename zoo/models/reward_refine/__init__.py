"""Reward-guided iterative refinement in masked diffusion at test time (RERD; Uehara, Su et al., ICML 2025)."""

from zoo.datamodules.dna import ALPHABET, MarkovDNA, decode, encode, read_sequences
from zoo.models.reward_refine.denoiser import MaskedDenoiser
from zoo.models.reward_refine.metrics import diversity, population_metrics, pseudo_log_likelihood
from zoo.models.reward_refine.module import MaskedDiffusion
from zoo.models.reward_refine.rewards import ActivityOracle, CountedReward, MotifReward, motif_counts
from zoo.models.reward_refine.samplers import (
    Design,
    best_of_n,
    guided_unmask,
    refine,
    refine_budget,
    remask,
    resample,
    rounds_for_budget,
    svdd,
    unguided,
)

__all__ = [
    "ALPHABET",
    "ActivityOracle",
    "CountedReward",
    "Design",
    "MarkovDNA",
    "MaskedDenoiser",
    "MaskedDiffusion",
    "MotifReward",
    "best_of_n",
    "decode",
    "diversity",
    "encode",
    "guided_unmask",
    "motif_counts",
    "population_metrics",
    "pseudo_log_likelihood",
    "read_sequences",
    "refine",
    "refine_budget",
    "remask",
    "resample",
    "rounds_for_budget",
    "svdd",
    "unguided",
]
