"""Dictionaries of the sparse autoencoder: free (baseline) and relaxed archetypal (RA-SAE / A-SAE).

No Lightning here: both are plain ``nn.Module``s with ``project_()`` (the constraint, applied in place) and
``get_dictionary()`` (the ``(num_atoms, dim)`` matrix D, with gradients in training mode).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["FreeDictionary", "RelaxedArchetypalDictionary"]

_EPS = 1e-8  # official constant of the row normalisations


class _Dictionary(nn.Module):
    """Shared behaviour: lazy projection in training mode, a detached cache in eval mode."""

    num_atoms: int
    dim: int

    def __init__(self) -> None:
        super().__init__()
        self._cache: Tensor | None = None
        self._cache_key: tuple[int, ...] | None = None

    def project_(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _compute(self) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _version_key(self) -> tuple[int, ...]:
        # Tensor._version counts in-place writes (optimizer steps, load_state_dict, project_), so the eval cache
        # is rebuilt exactly when a parameter or buffer changed. The official cache goes stale instead.
        return tuple(t._version for t in (*self.parameters(), *self.buffers())) + tuple(
            t.data_ptr() for t in self.parameters()
        )

    def get_dictionary(self) -> Tensor:
        """D, ``(num_atoms, dim)``.

        In training mode the constraint is first projected in place (official order: at the start of every
        training forward), then D is built with gradients. In eval mode D is fused once and cached, detached.
        """
        if self.training:
            self.project_()
            return self._compute()
        key = self._version_key()
        if self._cache is None or self._cache_key != key:
            with torch.no_grad():
                self.project_()
                self._cache = self._compute().detach()
            self._cache_key = self._version_key()
        return self._cache

    def forward(self, codes: Tensor) -> Tensor:
        """Decode: ``codes (N, num_atoms) @ D (num_atoms, dim) -> (N, dim)``."""
        return codes @ self.get_dictionary()


class FreeDictionary(_Dictionary):
    """Free dictionary D = V with unit-norm rows (projected gradient descent), the TopK-SAE baseline.

    Args:
        num_atoms: k.
        dim: d.
        init: optional ``(num_atoms, dim)`` starting atoms (e.g. k-means centroids, the critique's control);
            default Xavier-uniform as in the official ``DictionaryLayer``.

    Example:
        >>> D = FreeDictionary(num_atoms=6, dim=4)
        >>> torch.allclose(D.get_dictionary().norm(dim=1), torch.ones(6), atol=1e-6)
        True
    """

    def __init__(self, num_atoms: int, dim: int, init: Tensor | None = None) -> None:
        super().__init__()
        self.num_atoms, self.dim = num_atoms, dim
        self.V = nn.Parameter(torch.empty(num_atoms, dim))
        if init is None:
            nn.init.xavier_uniform_(self.V)
        else:
            self.reset_from(init)

    @torch.no_grad()
    def reset_from(self, atoms: Tensor) -> None:
        if atoms.shape != self.V.shape:
            raise ValueError(f"Expected initial atoms of shape {tuple(self.V.shape)}, got {tuple(atoms.shape)}.")
        self.V.copy_(atoms)
        self.project_()

    @torch.no_grad()
    def project_(self) -> None:
        self.V.div_(self.V.norm(dim=1, keepdim=True) + _EPS)

    def _compute(self) -> Tensor:
        return self.V


class RelaxedArchetypalDictionary(_Dictionary):
    """Relaxed archetypal dictionary D = (W C + Λ) · exp(m) (Fel et al., ICML 2025, RA-SAE).

    * ``C`` ``(num_candidates, dim)``: fixed candidate points from the data (a buffer, e.g. k-means centroids).
    * ``W`` ``(num_atoms, num_candidates)``: row-stochastic (W ≥ 0, W·1 = 1), so W C lies in conv(C).
    * ``Λ`` ``(num_atoms, dim)``: relaxation, ‖Λ_i‖₂ ≤ δ.
    * ``m``: scalar log-multiplier, trained when ``use_multiplier`` (official default), else fixed at 0.

    ``delta=0`` is A-SAE. It is implemented as a frozen Λ ≡ 0 rather than through the scaling δ/‖Λ_i‖, which
    gives 0/0 = NaN in the official formula at initialisation.

    Args:
        num_atoms: k.
        candidates: C, ``(num_candidates, dim)``; zeros are fine when weights are loaded afterwards.
        delta: relaxation radius δ ≥ 0, in the units of the activations.
        use_multiplier: train the scalar m (D scaled by e^m).

    Example:
        >>> C = torch.randn(8, 3)
        >>> D = RelaxedArchetypalDictionary(num_atoms=8, candidates=C, delta=0.0)
        >>> torch.allclose(D.get_dictionary(), C)   # W = I at initialisation: atom i starts at C_i
        True
    """

    def __init__(self, num_atoms: int, candidates: Tensor, delta: float = 1.0, use_multiplier: bool = True) -> None:
        super().__init__()
        if candidates.ndim != 2:
            raise ValueError(f"Expected candidates C of shape (num_candidates, dim), got {tuple(candidates.shape)}.")
        if delta < 0:
            raise ValueError(f"Expected delta >= 0, got {delta}.")
        num_candidates, dim = candidates.shape
        self.num_atoms, self.dim, self.delta = num_atoms, dim, float(delta)
        self.register_buffer("C", candidates.detach().clone().float())
        # Official init: W = eye(k, n'), so atom i starts at C_i. With n' < k the rows i >= n' would be zero
        # atoms (relu/normalise keeps them at 0), so they start at the uniform mixture 1/n' instead.
        W = torch.eye(num_atoms, num_candidates)
        if num_candidates < num_atoms:
            W[num_candidates:] = 1.0 / num_candidates
        self.W = nn.Parameter(W)
        if self.delta > 0:
            self.Lambda = nn.Parameter(torch.zeros(num_atoms, dim))
        else:
            self.register_buffer("Lambda", torch.zeros(num_atoms, dim))
        if use_multiplier:
            self.m = nn.Parameter(torch.zeros(()))
        else:
            self.register_buffer("m", torch.zeros(()))

    @property
    def num_candidates(self) -> int:
        return self.C.shape[0]

    @torch.no_grad()
    def set_candidates(self, candidates: Tensor) -> None:
        """Fill C (e.g. k-means centroids computed when training starts)."""
        if candidates.shape != self.C.shape:
            raise ValueError(f"Expected candidates of shape {tuple(self.C.shape)}, got {tuple(candidates.shape)}.")
        self.C.copy_(candidates)

    @torch.no_grad()
    def project_(self) -> None:
        """Official order: W ← ReLU(W); W ← W / (W·1 + 1e-8); Λ_i ← Λ_i · min(1, δ / ‖Λ_i‖)."""
        self.W.clamp_(min=0)
        self.W.div_(self.W.sum(dim=1, keepdim=True) + _EPS)
        if self.delta > 0:
            # eps in the denominator: the official δ/‖Λ_i‖ is δ/0 = inf at init (harmless only because δ > 0).
            scale = (self.delta / (self.Lambda.norm(dim=1, keepdim=True) + _EPS)).clamp(max=1.0)
            self.Lambda.mul_(scale)

    def _compute(self) -> Tensor:
        # exp(m) clamped for safety: a runaway multiplier would overflow D.
        return (self.W @ self.C + self.Lambda) * torch.exp(self.m.clamp(-10.0, 10.0))
