"""Hedge with fixed share over M detectors, and the SEAD++ detector sampler (SEAD, ICML 2025, §2.3 and §2.5).

Card symbols: ``eta`` is η, ``share`` is 1/λ (paper: λ = 10⁶), ``prior`` is π, ``gamma`` is γ, ``k`` the expected
number of detectors scored per point. Everything lives in registered buffers, so ``state_dict`` checkpoints the
weights and the sampler's random stream.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["Hedge", "SEADPlusPlusSampler"]


def _splitmix64(x: int) -> int:
    """SplitMix64 finaliser: nearby (seed, step) pairs get unrelated seeds (the Mersenne Twister keeps 32 bits)."""
    x = (x + 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) & 0xFFFFFFFF


def _logsumexp(x: np.ndarray) -> float:
    return np.logaddexp.reduce(x)  # one ufunc call: half the time of max/exp/sum/log on vectors of M numbers


class Hedge(nn.Module):
    """Exponential weights (Hedge) with a fixed-share step, in log space.

    One update with loss vector ℓ (card §2.3, the share step is the card's reconstruction [R] of λ):

    1. ``log w̃ = log w − η ℓ``, renormalised with log-sum-exp;
    2. ``w = (1 − share) · w̃ + share · π``, computed as ``logaddexp(log(1 − share) + log w̃, log(share) + log π)``.

    Step 2 keeps every ``w_i ≥ share · π_i``, so a detector that was bad before a drift wins back weight in about
    ``ln(1 / (share · π_i)) / (η Δ)`` steps (Δ: its per-step loss advantage). ``share=0`` is pure Hedge (the "no share"
    ablation), whose regret against the best fixed detector is at most ``ln M / η + η T / 8`` for losses in [0, 1].
    Working in log space avoids the underflow that linear weights hit after a few hundred steps with η = 1.

    Args:
        num_detectors: number of detectors M.
        eta: learning rate η > 0 (paper: 1).
        share: fixed-share rate 1/λ in [0, 1) (paper: 1e-6); 0 disables the share step.
        prior: π, M positive numbers (normalised here); ``None`` is uniform.

    Attributes:
        log_w: ``(M,)`` float64 log-weights, log-sum-exp 0.
        log_prior: ``(M,)`` float64 log π.

    Raises:
        ValueError: on a bad argument, or from :meth:`update` on a non-finite or mis-shaped loss.

    Example:
        >>> hedge = Hedge(num_detectors=3, eta=1.0, share=0.0)
        >>> hedge.update(torch.tensor([0.0, 1.0, 1.0]))
        >>> hedge.weights()
        tensor([0.5761, 0.2119, 0.2119])
        >>> hedge.combine(torch.tensor([0.0, 1.0, 1.0]))
        tensor(0.4239)
    """

    log_w: Tensor
    log_prior: Tensor

    def __init__(
        self, num_detectors: int, eta: float = 1.0, share: float = 1e-6, prior: list[float] | None = None
    ) -> None:
        super().__init__()
        if num_detectors < 1:
            raise ValueError(f"Expected `num_detectors` >= 1, got {num_detectors}.")
        if not (eta > 0 and math.isfinite(eta)):
            raise ValueError(f"Expected a finite `eta` > 0, got {eta}.")
        if not 0.0 <= share < 1.0:
            raise ValueError(f"Expected `share` (1/λ) in [0, 1), got {share}. Use 0 to disable the share step.")
        if prior is None:
            pi = torch.full((num_detectors,), 1.0 / num_detectors, dtype=torch.float64)
        else:
            pi = torch.as_tensor(prior, dtype=torch.float64)
            if pi.shape != (num_detectors,) or not bool(torch.isfinite(pi).all() and (pi > 0).all()):
                raise ValueError(f"Expected `prior` to be {num_detectors} positive finite numbers, got {prior}.")
            pi = pi / pi.sum()
        self.num_detectors, self.eta, self.share = num_detectors, eta, share
        self.register_buffer("log_prior", pi.log())
        self.register_buffer("log_w", pi.log().clone())  # start at π

    def _check(self, x: Tensor, name: str) -> Tensor:
        if not isinstance(x, Tensor) or x.shape != (self.num_detectors,):
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"Hedge.{name} expects a tensor of shape ({self.num_detectors},), got {got}.")
        return x

    def weights(self) -> Tensor:
        """Return the current weights ``w`` ``(M,)`` float32, summing to 1."""
        return torch.softmax(self.log_w, dim=0).float()

    def combine(self, s_hat: Tensor) -> Tensor:
        """Return the ensemble score ``S = Σ_i w_i ŝ_i`` (0-d) for normalised scores ``s_hat`` ``(M,)``."""
        s_hat = self._check(s_hat, "combine")
        w = self.weights().to(s_hat.device)
        return (w * s_hat.to(w.dtype)).sum()

    @torch.no_grad()
    def update(self, loss: Tensor) -> None:
        """Apply one Hedge step with ``loss`` ``(M,)`` (normalised scores, ideally in [0, 1]), then the share step.

        Raises:
            ValueError: if ``loss`` has the wrong shape or holds NaN/inf; the weights are then left unchanged.
        """
        loss = self._check(loss, "update").to(device=self.log_w.device, dtype=torch.float64)
        if not bool(torch.isfinite(loss).all()):
            raise ValueError(
                f"Hedge.update got a non-finite loss {loss.tolist()}; the weights were left unchanged. "
                "Map NaN/inf raw scores to 0.5 in the normaliser before the update."
            )
        log_w = self.log_w - self.eta * loss
        log_w = log_w - torch.logsumexp(log_w, dim=0)
        if self.share > 0:
            log_w = torch.logaddexp(math.log1p(-self.share) + log_w, math.log(self.share) + self.log_prior)
            log_w = log_w - torch.logsumexp(log_w, dim=0)  # exact in theory; removes rounding drift over long streams
        self.log_w.copy_(log_w)

    @torch.no_grad()
    def update_many(self, losses: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        """Run the updates of a chunk: row b applies ``update(losses[b])`` where ``active[b]`` (else no change).

        The recursion is sequential (each step renormalises), so it runs as a float64 NumPy loop over the rows: on
        vectors of M numbers a NumPy op costs about a quarter of a torch op, and the maths is :meth:`update`'s.

        Args:
            losses: ``(B, M)`` finite losses.
            active: ``(B,)`` bool, which rows update (False during the warm-up).

        Returns:
            ``(before, after)``, each ``(B, M)`` float32: the weights each row was combined with, and after its update.
        """
        if losses.ndim != 2 or losses.shape[1] != self.num_detectors or active.shape != losses.shape[:1]:
            raise ValueError(
                f"Hedge.update_many expects losses (B, {self.num_detectors}) and active (B,), got "
                f"{tuple(losses.shape)} and {tuple(active.shape)}."
            )
        if not bool(torch.isfinite(losses).all()):
            raise ValueError("Hedge.update_many got a non-finite loss; the weights were left unchanged.")
        ell = (self.eta * losses.detach().to(torch.float64)).cpu().numpy()
        act = active.cpu().tolist()
        log_w = self.log_w.cpu().numpy().copy()
        log_keep, log_mix = (
            (math.log1p(-self.share), math.log(self.share) + self.log_prior.cpu().numpy())
            if self.share > 0
            else (0.0, None)
        )
        trace = np.empty((len(act) + 1, self.num_detectors))
        trace[0] = log_w
        for b, on in enumerate(act):  # sequential by nature: step b+1 renormalises the output of step b
            if on:
                log_w = log_w - ell[b]
                log_w = log_w - _logsumexp(log_w)
                if log_mix is not None:
                    log_w = np.logaddexp(log_keep + log_w, log_mix)
                    log_w = log_w - _logsumexp(log_w)
            trace[b + 1] = log_w
        self.log_w.copy_(torch.from_numpy(log_w))
        w = torch.softmax(torch.from_numpy(trace), dim=1).float().to(losses.device)
        return w[:-1], w[1:]

    def extra_repr(self) -> str:
        return f"num_detectors={self.num_detectors}, eta={self.eta}, share={self.share}"


class SEADPlusPlusSampler(nn.Module):
    """Pick which detectors score a point (SEAD++, card §2.5 with the review note's exact inclusion probabilities).

    With Hedge weights ``w`` and uniform π, ``p = (1 − γ) w + γ π`` and detector i is drawn independently with
    probability ``P(i) = min(1, k p_i)``, so ``P(i)`` is known exactly and the importance-weighted loss
    ``ℓ̂_i = ŝ_i 1[i drawn] / P(i)`` is unbiased for ŝ_i. The expected number drawn is ``Σ_i P(i) ≤ k``.

    At least one detector is always drawn: when the Bernoulli draws pick none, the argmax of p is drawn and its
    inclusion is reported as 1. That event has probability ``Π_i (1 − P(i)) ≤ exp(−k)`` (0 when some ``k p_i ≥ 1``),
    which bounds the bias it adds to that detector's expected loss.

    The random stream is a function of ``seed`` and the ``step`` buffer only, so a restored ``state_dict`` continues
    with the same draws.

    Args:
        k: expected number of detectors scored per point, > 0 (card: about M/2 for a 2× speed-up).
        gamma: exploration γ in [0, 1]: every detector keeps ``P(i) ≥ min(1, k γ / M)``.
        seed: seed of the draws.

    Attributes:
        seed: 0-d long buffer.
        step: 0-d long buffer, draws made so far.

    Example:
        >>> sampler = SEADPlusPlusSampler(k=2, gamma=0.05, seed=0)
        >>> mask, inclusion = sampler.draw(torch.tensor([0.7, 0.1, 0.1, 0.1]))
        >>> inclusion
        tensor([1.0000, 0.2150, 0.2150, 0.2150])
        >>> bool(mask[0]), int(sampler.step)
        (True, 1)
    """

    seed: Tensor
    step: Tensor

    def __init__(self, k: float, gamma: float = 0.05, seed: int = 0) -> None:
        super().__init__()
        if not (k > 0 and math.isfinite(k)):
            raise ValueError(f"Expected a finite `k` > 0 (expected detectors scored per point), got {k}.")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"Expected `gamma` in [0, 1], got {gamma}.")
        self.k, self.gamma = float(k), float(gamma)
        self.register_buffer("seed", torch.tensor(int(seed), dtype=torch.long))
        self.register_buffer("step", torch.tensor(0, dtype=torch.long))

    def _generator(self) -> torch.Generator:
        # one generator per draw from (seed, step): the stream survives a state_dict round trip, no RNG state pickled
        return torch.Generator().manual_seed(_splitmix64(_splitmix64(int(self.seed)) ^ int(self.step)))

    def probabilities(self, w: Tensor) -> Tensor:
        """Return ``p = (1 − γ) w + γ π`` ``(M,)`` float64 for weights ``w`` ``(M,)`` (renormalised first)."""
        if not isinstance(w, Tensor) or w.ndim != 1 or w.numel() < 1:
            got = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
            raise ValueError(f"SEADPlusPlusSampler expects weights of shape (M,), got {got}.")
        w = w.to(torch.float64)
        if not bool(torch.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
            raise ValueError(
                f"SEADPlusPlusSampler expects finite non-negative weights with a positive sum, got {w.tolist()}."
            )
        return (1.0 - self.gamma) * w / w.sum() + self.gamma / w.numel()

    @torch.no_grad()
    def draw(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """Draw the detectors that score this point.

        Args:
            w: Hedge weights ``(M,)``.

        Returns:
            ``mask`` ``(M,)`` bool (drawn detectors) and ``inclusion`` ``(M,)`` float32, the exact ``P(i drawn)``
            used for importance weighting (1 for a forced draw, see the class docstring).
        """
        p = self.probabilities(w)
        inclusion = (self.k * p).clamp(max=1.0)
        u = torch.rand(p.shape, generator=self._generator(), dtype=torch.float64)
        self.step.add_(1)
        mask = u < inclusion
        if not bool(mask.any()):
            j = int(p.argmax())
            mask[j] = True
            inclusion[j] = 1.0
        return mask.to(w.device), inclusion.float().to(w.device)

    def importance_loss(self, s_hat: Tensor, mask: Tensor, inclusion: Tensor, cap: float | None = None) -> Tensor:
        """Return the capped importance-weighted Hedge loss ``min(ŝ_i 1[i drawn] / P(i), cap)`` ``(M,)``.

        Undrawn detectors get loss 0 (their ``s_hat`` is ignored and may be NaN). Uncapped, the loss is unbiased for
        ŝ but can reach ``M / (k γ)``; with η = 1 one unlucky draw would then push a detector to the share floor
        (review note). The default cap is ``1/γ`` (no cap when γ = 0); η is applied by :class:`Hedge`, not here.

        Args:
            s_hat: normalised scores ``(M,)`` in [0, 1].
            mask: drawn detectors ``(M,)`` bool, from :meth:`draw`.
            inclusion: ``P(i drawn)`` ``(M,)``, from :meth:`draw`.
            cap: upper bound on each loss; ``None`` is ``1/γ``.
        """
        if s_hat.shape != mask.shape or s_hat.shape != inclusion.shape or s_hat.ndim != 1:
            raise ValueError(
                f"importance_loss expects s_hat, mask and inclusion of one shape (M,), got "
                f"{tuple(s_hat.shape)}, {tuple(mask.shape)} and {tuple(inclusion.shape)}."
            )
        if cap is None:
            cap = 1.0 / self.gamma if self.gamma > 0 else math.inf
        est = torch.where(mask, s_hat / inclusion.to(s_hat.dtype), torch.zeros_like(s_hat))
        return est.clamp(max=cap)

    def combine(self, s_hat: Tensor, mask: Tensor, w: Tensor) -> Tensor:
        """Return the ensemble score (0-d): the ``w``-weighted mean of ``s_hat`` over the drawn detectors.

        The weights are renormalised over the drawn set; if they are all 0 there, the plain mean is used.
        """
        if s_hat.shape != mask.shape or s_hat.shape != w.shape or s_hat.ndim != 1:
            raise ValueError(
                f"combine expects s_hat, mask and w of one shape (M,), got {tuple(s_hat.shape)}, "
                f"{tuple(mask.shape)} and {tuple(w.shape)}."
            )
        if not bool(mask.any()):
            raise ValueError("combine got an empty draw; pass the mask returned by draw(), which always holds one.")
        ww = torch.where(mask, w.to(s_hat.dtype), torch.zeros_like(s_hat))
        if not bool(ww.sum() > 0):
            ww = mask.to(s_hat.dtype)
        vals = torch.where(mask, s_hat, torch.zeros_like(s_hat))
        return (ww * vals).sum() / ww.sum()

    def extra_repr(self) -> str:
        return f"k={self.k}, gamma={self.gamma}"
