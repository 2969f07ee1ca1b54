"""Verifier-assisted generation: tokenwise rejection sampling with backtracking (Botta, Li, Mehta et al., ICML 2025)."""

from zoo.datamodules.dyck import BOS, EOS, PAD, VOCAB, DyckGrammar, to_text
from zoo.models.backtrack_sampling.lm import CachedLM, FullSequenceLM, HFCausalLM, TinyCausalLM
from zoo.models.backtrack_sampling.module import DyckLM
from zoo.models.backtrack_sampling.probe import VerifierProbe
from zoo.models.backtrack_sampling.samplers import Generation, block_best_of_n, draw, generate, rejection_sample

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "VOCAB",
    "CachedLM",
    "DyckGrammar",
    "DyckLM",
    "FullSequenceLM",
    "Generation",
    "HFCausalLM",
    "TinyCausalLM",
    "VerifierProbe",
    "block_best_of_n",
    "draw",
    "generate",
    "rejection_sample",
    "to_text",
]
