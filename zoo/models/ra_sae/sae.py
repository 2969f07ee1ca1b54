"""The sparse autoencoder: an encoder (TopK, BatchTopK or JumpReLU) + a dictionary, and its loss."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.models.ra_sae.dictionary import FreeDictionary, RelaxedArchetypalDictionary
from zoo.models.ra_sae.encoder import EncoderKind, build_encoder

__all__ = ["CandidateScale", "DictionaryKind", "SparseAutoencoder", "equal_norm_candidates", "sae_loss"]

DictionaryKind = Literal["ra", "a", "free"]
CandidateScale = Literal["equal", "raw"]


def equal_norm_candidates(candidates: Tensor) -> tuple[Tensor, float]:
    """Rescale every candidate point to the median candidate norm s; return ``(C_eq, −log s)``.

    The zoo's default start for the archetypal dictionaries (``candidate_scale="equal"``). The official code keeps
    C as given with m = 0, so atom i starts at centroid C_i with its own norm (1.8–10.3 on the card's raw data),
    while the tied encoder has unit rows: high-norm atoms overshoot, stop being picked and die (75 % dead, R² 0.45 at
    raw k* = 256). Equal norms with m₀ = −log s start every atom at unit norm, as the free dictionary's are. The
    constraint is unchanged where it matters: conv(C) and conv(C_eq) reach the same cone of directions (a positive
    rescaling of each point is absorbed by W's weights), and e^m rescales D anyway; δ stays in activation units,
    measured against points of norm s.

    Example:
        >>> C_eq, m0 = equal_norm_candidates(torch.tensor([[3.0, 4.0], [0.0, 1.0], [2.0, 0.0]]))
        >>> C_eq.norm(dim=1).tolist(), round(m0, 4)
        ([2.0, 2.0, 2.0], -0.6931)
    """
    norms = candidates.norm(dim=1, keepdim=True)
    if not bool((norms > 0).all()):
        raise ValueError("candidate points include a zero row: equal-norm scaling needs non-zero candidates")
    scale = float(norms.median())
    return candidates / norms * scale, -math.log(scale)


class SparseAutoencoder(nn.Module):
    """TopK sparse autoencoder ``x -> codes -> codes @ D`` (no decoder bias, no centring, as in the official code).

    Args:
        dim: activation width d.
        num_atoms: number of concepts k.
        top_k: non-zero codes per row s.
        dictionary: ``"ra"`` (relaxed archetypal, RA-SAE), ``"a"`` (archetypal, δ = 0) or ``"free"`` (baseline).
        delta: RA radius δ (ignored unless ``dictionary="ra"``).
        use_multiplier: train the scalar multiplier e^m of the archetypal dictionaries.
        num_candidates: n', the number of candidate points C (archetypal dictionaries, and the free dictionary's
            ``init_candidates``); C is a buffer filled by ``set_candidates``.
        candidate_scale: ``"equal"`` (the zoo's default) rescales C to the median candidate norm and starts m at
            −log of it, so atoms start at unit norm like the tied encoder's rows (:func:`equal_norm_candidates`);
            ``"raw"`` is the official start, C as given and m = 0.
        init: ``"tied"`` starts the encoder at the initial dictionary (unit rows of D_init, b = 0, the card's pilot
            choice); ``"official"`` keeps PyTorch's default Linear init.
        encoder: ``"topk"`` (the paper's), ``"batchtopk"`` (top_k · B codes per batch), ``"jumprelu"`` (learned
            per-atom thresholds with an L0 penalty) or ``"relu"`` (ReLU + L1, the vanilla SAE); the penalties are
            :meth:`sparsity_loss`, part of the training loss.
        l0_penalty: the JumpReLU encoder's L0 weight λ.
        l1_penalty: the ReLU encoder's L1 weight λ.

    Example:
        >>> sae = SparseAutoencoder(dim=4, num_atoms=8, top_k=2, dictionary="ra", num_candidates=8)
        >>> sae.set_candidates(torch.randn(8, 4))
        >>> pre, codes, x_hat = sae(torch.randn(3, 4))
        >>> x_hat.shape, int((codes != 0).sum(1).max()) <= 2
        (torch.Size([3, 4]), True)
    """

    def __init__(
        self,
        dim: int,
        num_atoms: int,
        top_k: int,
        dictionary: DictionaryKind = "ra",
        delta: float = 1.0,
        use_multiplier: bool = True,
        num_candidates: int | None = None,
        init: Literal["tied", "official"] = "tied",
        encoder: EncoderKind = "topk",
        l0_penalty: float = 1e-3,
        l1_penalty: float = 1e-2,
        candidate_scale: CandidateScale = "equal",
    ) -> None:
        super().__init__()
        if dictionary not in ("ra", "a", "free"):
            raise ValueError(f"Expected dictionary to be 'ra', 'a' or 'free', got {dictionary!r}.")
        if candidate_scale not in ("equal", "raw"):
            raise ValueError(f"Expected candidate_scale to be 'equal' or 'raw', got {candidate_scale!r}.")
        self.dim, self.num_atoms, self.kind, self.init = dim, num_atoms, dictionary, init
        self.candidate_scale = candidate_scale
        self.encoder = build_encoder(encoder, dim, num_atoms, top_k, l0_penalty, l1_penalty)
        n_cand = num_candidates or num_atoms
        if dictionary == "free":
            self.dictionary: FreeDictionary | RelaxedArchetypalDictionary = FreeDictionary(num_atoms, dim)
        else:
            self.dictionary = RelaxedArchetypalDictionary(
                num_atoms,
                torch.zeros(n_cand, dim),
                delta=delta if dictionary == "ra" else 0.0,
                use_multiplier=use_multiplier,
            )
        if init == "tied":
            self.encoder.tie_to(self.dictionary.get_dictionary().detach())

    @torch.no_grad()
    def set_candidates(self, candidates: Tensor, free_init: bool = False) -> None:
        """Fill C of an archetypal dictionary; with ``free_init`` start a free dictionary at ``candidates``.

        A free dictionary started at the normalised k-means centroids is the critique's control arm. With
        ``candidate_scale="equal"`` an archetypal dictionary's C is rescaled to equal norms and m restarted at −log of
        that norm (:func:`equal_norm_candidates`). With ``init="tied"`` the encoder is re-tied to the new initial
        dictionary.
        """
        if isinstance(self.dictionary, RelaxedArchetypalDictionary):
            if self.candidate_scale == "equal":
                candidates, m0 = equal_norm_candidates(candidates)
                self.dictionary.m.fill_(m0)
            self.dictionary.set_candidates(candidates)
        elif free_init:
            self.dictionary.reset_from(candidates[: self.num_atoms])
        else:
            return
        if self.init == "tied":
            self.encoder.tie_to(self.dictionary.get_dictionary().detach())

    def forward(self, x: Tensor, return_dictionary: bool = False) -> tuple[Tensor, ...]:
        """Return ``(pre_codes, codes, x_hat)`` for activations ``x`` ``(N, dim)``; with ``return_dictionary``
        also the D ``(num_atoms, dim)`` that decoded them.

        A loss that needs D again (AuxK) must take this one: a second ``get_dictionary()`` in training mode would
        re-project the parameters in place after autograd saved them for the first.
        """
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} expects activations of shape (N, {self.dim}), got {tuple(x.shape)}. "
                "Set model.dim to the data width (data.dim)."
            )
        pre, codes = self.encoder(x)
        D = self.dictionary.get_dictionary()
        return (pre, codes, codes @ D, D) if return_dictionary else (pre, codes, codes @ D)

    def sparsity_loss(self, pre_codes: Tensor) -> Tensor | float:
        """The encoder's own sparsity term (JumpReLU's L0 penalty); 0 for TopK and BatchTopK, sparse by construction."""
        penalty = getattr(self.encoder, "sparsity_loss", None)
        return penalty(pre_codes) if penalty is not None else 0.0


def sae_loss(
    x: Tensor, x_hat: Tensor, pre_codes: Tensor, codes: Tensor, dictionary: Tensor, aux_k_penalty: float = 0.0
) -> Tensor:
    """MSE reconstruction loss, plus the optional TopK auxiliary loss (official ``top_k_auxiliary_loss``).

    AuxK: the ``k // 2`` largest ReLU pre-codes that TopK did *not* keep reconstruct the residual ``x - x_hat``;
    its MSE is added with weight ``aux_k_penalty`` (official 0.1 when used; off by default).
    """
    residual = x - x_hat
    loss = residual.square().mean()
    if aux_k_penalty > 0:
        left = torch.relu(pre_codes) - codes
        values, index = left.topk(left.shape[1] // 2, dim=1)
        aux_codes = torch.zeros_like(left).scatter(1, index, values)
        loss = loss + aux_k_penalty * F.mse_loss(aux_codes @ dictionary, residual)
    return loss
