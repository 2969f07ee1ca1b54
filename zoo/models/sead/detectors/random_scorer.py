"""The random scorer: a hash of (seed, time) in [0, 1), the pool's uninformative detectors (card §6)."""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.models.sead.detectors.base import StreamDetector


def _signed(c: int) -> int:
    return c - 2**64 if c >= 2**63 else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _uniform_hash(key: Tensor) -> Tensor:
    """Counter-based U[0, 1) draws: the SplitMix64 finaliser of each int64 ``key``, top 24 bits (float32-exact).

    int64 products wrap modulo 2**64 in torch, which is the arithmetic SplitMix64 needs; a batch of keys is hashed
    in a few tensor ops, so a chunk of the stream gets its random scores without a generator per point.
    """
    z = key + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) / float(1 << 24)


class RandomScorer(StreamDetector):
    """Uniform(0, 1) scores independent of x (the paper's robustness test, card §4): a pool member to be ignored.

    The score at step t is a counter-based hash of ``(seed, t)`` (SplitMix64), so the state is the counter t alone;
    ``score`` twice without ``learn`` repeats the same value, and a chunk draws all its scores at once.

    Example:
        >>> det = RandomScorer(dim=3, seed=7)
        >>> a = det.score_learn(torch.zeros(3)); b = det.score_learn(torch.zeros(3))
        >>> bool(0 <= a < 1), bool(a != b)
        (True, True)
    """

    name = "random"

    def __init__(self, dim: int, seed: int = 0) -> None:
        super().__init__(dim, seed)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        t = self.n + torch.arange(len(X), device=X.device)
        out = _uniform_hash(self.rng_seed * 1_000_003 + t) if score else X.new_zeros(len(X))
        if learn:
            self.n += len(X)
        return out
