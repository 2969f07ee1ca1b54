"""``SEADEnsemble``: multiplicative weights with fixed share over normalised streaming-detector scores (plain torch).

Shah et al. (ICML 2025), as the card reconstructs Algorithm 1 (SEAD) and Algorithm 2 (SEAD++). For each point x_t:

1. every detector i gives a raw score s_i (score before learn);
2. ŝ_i = normalised s_i against detector i's own past scores (quantile min–max), with the sketch *before* s_i;
3. s_i enters the sketch;
4. the ensemble emits S_t = Σ_i w_i ŝ_i;
5. Hedge: log w_i ← log w_i − η ŝ_i, renormalise, then fixed share w ← (1 − 1/λ) w + π/λ (weights frozen during the
   warm-up, §2.4);
6. every detector learns x_t.

SEAD++ (``sample_k``): only a random subset of detectors scores x_t (independent draws with inclusion min(1, k p_i),
p = (1 − γ) w + γ π); the output is the renormalised weighted mean over the drawn set and the Hedge loss is the capped
importance-weighted ŝ. All detectors still learn x_t.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from zoo.models.sead.detectors import build_pool, score_learn_many
from zoo.models.sead.hedge import Hedge, SEADPlusPlusSampler
from zoo.models.sead.normalize import QuantileNormalizer

__all__ = ["SEADEnsemble"]


class SEADEnsemble(nn.Module):
    """Unsupervised, streaming ensemble of anomaly detectors (SEAD / SEAD++).

    All state (detector windows, sketches, log-weights, sampler counter, step) is in buffers, so a ``state_dict``
    checkpoints a warmed-up ensemble and a restored one continues the stream exactly.

    Args:
        detectors: detector configs ``[{"name": "knn", "params": {...}}, ...]`` (``zoo.models.sead.detectors``).
        dim: feature width of the stream.
        eta: Hedge learning rate η (paper: 1).
        share: fixed-share rate 1/λ (paper: λ = 10⁶); 0 is the no-share ablation.
        normalizer: ``"quantile_minmax"`` (default) or ``"cdf"`` (ablation: every detector looks alike).
        q_lo: low quantile of the min–max map.
        q_hi: high quantile of the min–max map.
        capacity: sketch size per detector (bounded memory); ``None``: the exact history (memory grows with t).
        warmup: points during which weights stay at the prior (the paper warms up on 100 points).
        sample_k: SEAD++: expected number of detectors scored per point (``None``: SEAD, all of them).
        gamma: SEAD++ exploration γ.
        seed: seed of the detectors' randomness and of SEAD++'s draws.
        clip_output: emit S_t from the clipped normalised scores (the card's reconstruction, default); ``False``
            emits it from the unclipped ones (review note: the clip ties every score above a detector's running
            q_hi at 1, which lowers average precision). The Hedge loss is clipped either way.
        chunked: score each chunk with batched detector and normaliser ops (default); ``False`` steps row by row,
            the same results more slowly (the per-point reference, and SEAD++'s fair speed comparison).

    Example:
        >>> from zoo.models.sead.detectors import default_pool
        >>> ens = SEADEnsemble(default_pool(4), dim=4, warmup=10)
        >>> out = ens(torch.randn(20, 4))
        >>> out["score"].shape, out["weights"].shape
        (torch.Size([20]), torch.Size([20, 7]))
    """

    def __init__(
        self,
        detectors: list[dict],
        dim: int,
        eta: float = 1.0,
        share: float = 1e-6,
        normalizer: Literal["quantile_minmax", "cdf"] = "quantile_minmax",
        q_lo: float = 0.01,
        q_hi: float = 0.99,
        capacity: int | None = 1024,
        warmup: int = 100,
        sample_k: float | None = None,
        gamma: float = 0.05,
        seed: int = 0,
        clip_output: bool = True,
        chunked: bool = True,
    ) -> None:
        super().__init__()
        if not detectors:
            raise ValueError("SEADEnsemble needs at least one detector: the pool is empty.")
        self.dim, self.warmup, self.chunked, self.clip_output = dim, warmup, chunked, bool(clip_output)
        self.pool = build_pool(detectors, dim, seed)
        m = len(self.pool)
        self.normalizer = QuantileNormalizer(m, mode=normalizer, q_lo=q_lo, q_hi=q_hi, capacity=capacity)
        self.hedge = Hedge(m, eta=eta, share=share)
        self.sampler = SEADPlusPlusSampler(sample_k, gamma=gamma, seed=seed) if sample_k else None
        self.register_buffer("t", torch.zeros((), dtype=torch.long))

    @property
    def num_detectors(self) -> int:
        return len(self.pool)

    def weights(self) -> Tensor:
        """Current detector weights ``(M,)``, summing to 1."""
        return self.hedge.weights()

    def _check(self, x: Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"SEAD expects stream rows of shape (B, {self.dim}), got {tuple(x.shape)}.")
        bad = ~torch.isfinite(x).all(dim=1)
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise ValueError(
                f"Stream row {row} of this batch holds NaN or inf: {x[row].tolist()}. Clean or drop it; the "
                "ensemble's state was left unchanged."
            )

    @torch.no_grad()
    def step(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Process one point ``(dim,)`` (already checked): returns ``(score, normalised (M,), raw (M,))``."""
        w = self.hedge.weights()
        if self.sampler is None:
            raw = torch.stack([d.score(x) for d in self.pool]).float()
            emitted = self.normalizer.normalize(raw, clip=self.clip_output)
            s_hat = emitted.clamp(0.0, 1.0)  # the clipped value: clip(unclipped) is the clipped map
            score = self.hedge.combine(emitted)
            loss = s_hat
        else:
            mask, inclusion = self.sampler.draw(w)
            raw = torch.full((len(self.pool),), float("nan"))
            for i in torch.nonzero(mask).flatten().tolist():  # only drawn detectors score: SEAD++'s saving
                raw[i] = self.pool[i].score(x)
            s_hat = self.normalizer.normalize(raw)  # NaN (not drawn) -> 0.5, never used below
            score = self.sampler.combine(s_hat, mask, w)
            loss = self.sampler.importance_loss(s_hat, mask, inclusion)
        self.normalizer.insert(raw)  # non-finite (undrawn) scores are not inserted
        if int(self.t) >= self.warmup:
            self.hedge.update(loss)
        for detector in self.pool:
            detector.learn(x)
        self.t += 1
        return score, s_hat, raw

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        """Process a chunk of the stream in order, ``(B, dim)``.

        SEAD runs chunked: every detector scores and learns the chunk in batched ops (row b scored by the state that
        learnt rows < b), the normaliser does the same, and only the Hedge recursion steps row by row; the results
        equal ``B`` calls of :meth:`step` (tested). SEAD++ steps row by row, because which detectors score a row
        depends on the weights after the row before, and skipping detectors is its whole point.

        Returns:
            ``score`` ``(B,)``, ``normalized`` and ``raw`` detector scores ``(B, M)``, and ``weights`` ``(B, M)``
            after each point's update.

        Raises:
            ValueError: a row of the wrong width, or with NaN/inf; checked before any state changes.
        """
        self._check(x)
        if self.sampler is None and self.chunked:
            return self._forward_chunk(x)
        scores, normalized, raws, weights = [], [], [], []
        for row in x:  # a stream is sequential: point t+1 is scored by the state that learned point t
            score, s_hat, raw = self.step(row)
            scores.append(score)
            normalized.append(s_hat)
            raws.append(raw)
            weights.append(self.hedge.weights())
        return {
            "score": torch.stack(scores),
            "normalized": torch.stack(normalized),
            "raw": torch.stack(raws),
            "weights": torch.stack(weights),
        }

    @torch.no_grad()
    def _forward_chunk(self, x: Tensor) -> dict[str, Tensor]:
        x = x.float()
        raw = score_learn_many(self.pool, x)  # (B, M), each family's settings stacked
        emitted = self.normalizer.forward_chunk(raw, clip=self.clip_output)
        s_hat = emitted.clamp(0.0, 1.0)  # the clipped value: clip(unclipped) is the clipped map
        active = self.t + torch.arange(len(x), device=x.device) >= self.warmup
        before, after = self.hedge.update_many(s_hat, active)
        self.t += len(x)
        return {"score": (before * emitted).sum(1), "normalized": s_hat, "raw": raw, "weights": after}
