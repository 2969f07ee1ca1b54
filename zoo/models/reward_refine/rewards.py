"""Rewards over token sequences: the interface the samplers call, the card's motif reward, and a trained oracle.

A reward is any callable from tokens ``(N, L)`` to a float tensor ``(N,)``. :class:`CountedReward` wraps one: it
checks what comes back (shape, NaN, infinities) with a clear error and counts the sequences scored, which is the
budget every comparison is matched on (the card's pitfall: RERD spends far more reward calls than one SVDD pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from zoo.datamodules.dna import decode, encode, read_sequences

__all__ = ["ActivityOracle", "CountedReward", "MotifReward", "motif_counts"]


def motif_counts(x: Tensor, motif: Sequence[int]) -> Tensor:
    """Occurrences (overlapping) of ``motif`` in every row of ``x`` ``(N, L)``: one window comparison, no strings.

    Example:
        >>> motif_counts(torch.tensor([[2, 0, 3, 0, 2, 0, 3, 0]]), [2, 0, 3, 0])  # GATAGATA
        tensor([2])
    """
    k = len(motif)
    windows = x.unfold(1, k, 1)  # (N, L - k + 1, k)
    return (windows == torch.as_tensor(motif, device=x.device)).all(-1).sum(1)


class MotifReward:
    """The card's cell-type specificity analogue: ``act_A − 2·max(0, act_B − 1) − 0.5·|GC − 0.5|``.

    ``act_A = #GATA + #CCAT`` (shared + target-specific motif), ``act_B = #GATA + #TTGC`` (shared + off-target);
    the constraint is ``act_B ≤ 1``. Computable and non-differentiable, as the card asks.

    Example:
        >>> from datamodules.dna import encode
        >>> r = MotifReward()
        >>> x = encode(["CCATCCATGCGCGCGC", "GATATTGCTTGCAAAA"])
        >>> r(x), r.satisfied(x)
        (tensor([ 1.8750, -3.0938]), tensor([ True, False]))
    """

    shared, target, off_target = (2, 0, 3, 0), (1, 1, 0, 3), (3, 3, 2, 1)  # GATA, CCAT, TTGC

    def activities(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(act_A, act_B)``, the on- and off-target activities."""
        shared = motif_counts(x, self.shared)
        return shared + motif_counts(x, self.target), shared + motif_counts(x, self.off_target)

    def satisfied(self, x: Tensor) -> Tensor:
        """Whether the off-target constraint ``act_B ≤ 1`` holds."""
        return self.activities(x)[1] <= 1

    def __call__(self, x: Tensor) -> Tensor:
        act_a, act_b = self.activities(x)
        gc = ((x == 1) | (x == 2)).float().mean(1)
        return act_a.float() - 2 * (act_b - 1).clamp_min(0).float() - 0.5 * (gc - 0.5).abs()


class CountedReward:
    """A reward with its budget: validated outputs and a count of the sequences scored.

    Args:
        fn: tokens ``(N, L)`` -> scores ``(N,)`` (a tensor, array or list); with ``on_text`` it takes a list of
            strings instead (e.g. a wrapper around an external oracle).
        on_text: give ``fn`` the sequences as letters.
        allow_nan: let NaN through (the samplers then never select a NaN candidate and give it weight 0 in
            resampling, as the official code does); by default a NaN is an error.

    Example:
        >>> reward = CountedReward(MotifReward())
        >>> _ = reward(torch.zeros(5, 16, dtype=torch.long))
        >>> reward.calls
        5
    """

    def __init__(self, fn: Callable[[Any], Any], on_text: bool = False, allow_nan: bool = False) -> None:
        if isinstance(fn, CountedReward):  # re-wrapping keeps the inner settings (and counts afresh)
            fn, on_text, allow_nan = fn.fn, on_text or fn.on_text, allow_nan or fn.allow_nan
        if not callable(fn):
            raise TypeError(f"a reward must be callable (tokens -> scores), got {type(fn).__name__}")
        self.fn, self.on_text, self.allow_nan, self.calls = fn, on_text, allow_nan, 0

    def __call__(self, x: Tensor) -> Tensor:
        out = self.fn(decode(x) if self.on_text else x)
        out = torch.as_tensor(np.asarray(out.detach().cpu() if isinstance(out, Tensor) else out, dtype=np.float64))
        if out.shape != (len(x),):
            raise ValueError(
                f"the reward returned shape {tuple(out.shape)} for {len(x)} sequences; it must return one score "
                f"per sequence, shape ({len(x)},)"
            )
        if torch.isinf(out).any():
            raise ValueError(f"the reward returned ±inf for {int(torch.isinf(out).sum())} sequences; clip it")
        if not self.allow_nan and torch.isnan(out).any():
            raise ValueError(
                f"the reward returned NaN for {int(torch.isnan(out).sum())} of {len(x)} sequences (first: "
                f"{decode(x[torch.isnan(out)][:1])[0]}); fix the reward, or pass allow_nan=True to give them weight 0"
            )
        self.calls += len(x)
        return out.float().to(x.device)


class ActivityOracle(nn.Module):
    """A trained activity model as the reward of the real path: a small CNN over one-hot DNA, fit to measurements.

    The card's DNA task scores designs with an oracle trained on measured enhancer activity (Enformer-style models
    on the Gosai et al. MPRA data); this is that role at small scale, fit to any ``(sequence, activity)`` CSV.

    Args:
        length: letters per sequence.
        channels: convolution channels.
        kernel: convolution width (motif length scale).

    Example:
        >>> from datamodules.dna import MarkovDNA
        >>> x = MarkovDNA(16).sample(512, generator=torch.Generator().manual_seed(0))
        >>> oracle = ActivityOracle(16).fit(x, MotifReward()(x), steps=50)
        >>> oracle(x[:3]).shape
        torch.Size([3])
    """

    def __init__(self, length: int = 32, channels: int = 64, kernel: int = 4) -> None:
        super().__init__()
        self.length = length
        self.conv = nn.Conv1d(4, channels, kernel)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(2 * channels, channels), nn.ReLU(), nn.Linear(channels, 1))
        self.register_buffer("scale", torch.ones(2))  # target mean and std, so training sees a unit-scale target

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"expected tokens (N, {self.length}), got {tuple(x.shape)}")
        h = self.conv(nn.functional.one_hot(x.long(), 4).float().transpose(1, 2))
        # Motif counts are sums and presence is a max: pool both.
        pooled = torch.cat([h.relu().mean(-1), h.amax(-1)], 1)
        return self.head(pooled).squeeze(-1) * self.scale[1] + self.scale[0]

    def fit(self, x: Tensor, y: Tensor, steps: int = 500, lr: float = 3e-3, batch_size: int = 256,
            seed: int = 0) -> ActivityOracle:  # fmt: skip
        """Least-squares fit to measured activities ``y`` (a few hundred Adam steps; a regression this small needs no
        Trainer). Returns ``self`` in eval mode."""
        y = torch.as_tensor(y, dtype=torch.float)
        if len(x) != len(y) or not torch.isfinite(y).all():
            raise ValueError(f"need one finite activity per sequence, got {len(y)} for {len(x)} sequences")
        self.scale.copy_(torch.stack([y.mean(), y.std().clamp_min(1e-6)]))
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        self.train()
        for _ in range(steps):
            idx = torch.randint(len(x), (min(batch_size, len(x)),), generator=g)
            loss = ((self.forward(x[idx]) - y[idx]) / self.scale[1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return self.eval()

    @classmethod
    def from_csv(cls, path: str | Path, activity: str = "activity", column: str = "sequence",
                 **fit_kwargs: Any) -> ActivityOracle:  # fmt: skip
        """Fit an oracle to a CSV of sequences and a measured ``activity`` column."""
        seqs, values = read_sequences(path, column)
        if activity not in values:
            raise ValueError(f"{path}: no numeric {activity!r} column (numeric columns: {sorted(values)})")
        x = encode(seqs, where=f"{path}: sequence")
        return cls(x.shape[1]).fit(x, torch.tensor(values[activity]), **fit_kwargs)

    @torch.no_grad()
    def __call__(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return super().__call__(x)
