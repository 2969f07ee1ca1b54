"""C³R: the causal complete cause regulariser (Wang et al., ICML 2025), as a plain ``nn.Module``.

The released code (WangJingyao07/Multi-Modal-Base, ``models/base_{vt,vta}_causal.py``) is a sketch that cannot run
(card §1); this follows the card's coherent proposal (P), with the code's (C) choices as options:

* instrument V (identifiability without exogeneity): for two modalities the code's cross-attention gate,
  w = σ(⟨W_Q h_1, W_K h_2⟩/√d), V = w·W_V h_2 + (1 − w)·W_V h_1; for more, self-attention over the modality tokens
  with a learnable score scale, summed over tokens;
* real-world branch (sufficiency): L_suff = CE(f(Z), y) and L_IV = KL(softmax(V) ‖ softmax(Z));
* hypothetical-world branch (necessity): a one-step counterfactual z̄ = Z + η ∇_Z CE(f(Z), y) that removes the
  evidence for y (per-sample gradients: the *sum* of the per-sample losses, card review), computed with
  ``create_graph=True`` so the regulariser trains the encoders and the head; L_nec = −log(1 − p_y(f(z̄)) + 1e-6),
  the differentiable surrogate of 1{f(z̄) = y}, and the minimal-intervention penalty L_fe = mean ‖z̄ − Z‖²;
* total: (L_suff + L_nec) + λ_v L_IV + λ_fe L_fe; the indicator risks (risk_suff, risk_nec, R_C3) are metrics only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["C3Regularizer", "counterfactual", "counterfactual_risks"]

Head = Callable[[Tensor], Tensor]


def counterfactual(z: Tensor, head: Head, y: Tensor, eta: float = 1.0,
                   sign: Literal["remove_evidence", "code_vt"] = "remove_evidence",
                   eta_mode: Literal["absolute", "relative"] = "absolute",
                   create_graph: bool = True) -> Tensor:  # fmt: skip
    """z̄: one gradient step on Z that removes (``"remove_evidence"``: z̄ = Z + η ∇_Z CE) or, as the vt code has it,
    adds (``"code_vt"``: Z − η ∇_Z CE) the evidence for y. Per-sample gradients (the sum of per-sample CE).
    ``eta_mode="relative"`` takes a step of length η‖Z‖ along the normalised gradient (card pitfall: an
    unnormalised step shrinks as the model grows confident).

    Example:
        >>> head = nn.Linear(4, 3)
        >>> z = torch.randn(5, 4, requires_grad=True)
        >>> z_bar = counterfactual(z, head, torch.tensor([0, 1, 2, 0, 1]))
        >>> z_bar.shape, bool(z_bar.requires_grad)
        (torch.Size([5, 4]), True)
    """
    if sign not in ("remove_evidence", "code_vt") or eta_mode not in ("absolute", "relative"):
        raise ValueError(f"sign must be 'remove_evidence' or 'code_vt' and eta_mode 'absolute' or 'relative', got "
                         f"{sign!r}, {eta_mode!r}")  # fmt: skip
    if not z.requires_grad:
        z = z.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(head(z), y, reduction="sum"), z, create_graph=create_graph)
    if eta_mode == "relative":
        grad = grad / grad.norm(dim=-1, keepdim=True).clamp_min(1e-12) * z.norm(dim=-1, keepdim=True)
    step = eta * grad
    return z + step if sign == "remove_evidence" else z - step


def counterfactual_risks(z: Tensor, head: Head, y: Tensor, eta: float = 1.0,
                         eta_mode: Literal["absolute", "relative"] = "absolute") -> dict[str, Tensor]:  # fmt: skip
    """The indicator risks of the C³ risk: risk_suff = P(f(Z) ≠ y), risk_nec = P(f(z̄) = y) with the evidence-removing
    counterfactual, and R_C3 = their sum (a metric: nothing here back-propagates).

    Example:
        >>> r = counterfactual_risks(torch.randn(8, 4), nn.Linear(4, 3), torch.zeros(8, dtype=torch.long))
        >>> sorted(r)
        ['c3_risk', 'risk_nec', 'risk_suff']
    """
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        z_bar = counterfactual(z, head, y, eta, "remove_evidence", eta_mode, create_graph=False)
    with torch.no_grad():
        suff = (head(z).argmax(-1) != y).float().mean()
        nec = (head(z_bar).argmax(-1) == y).float().mean()
    return {"risk_suff": suff, "risk_nec": nec, "c3_risk": suff + nec}


class C3Regularizer(nn.Module):
    """The C³R training loss of a multi-modal model: ``forward(features, z, head, y) -> (loss, metrics)``.

    Args:
        dim: d, the width of every modality feature h_m and of the fused representation Z.
        num_modalities: M (the instrument is the cross-attention gate for M = 2, self-attention for M > 2).
        lambda_v: weight of L_IV (the code's ``args.lambda_v``; no default in the repo, 0.1 in the card).
        lambda_fe: weight of L_fe (``args.lambda_fe``; 0.1).
        eta: the counterfactual step (1, unnormalised, in the code).
        cf_sign: ``"remove_evidence"`` (P) or ``"code_vt"`` (the vt code's opposite sign).
        eta_mode: ``"absolute"`` (the code) or ``"relative"`` (a step of η‖Z‖).
        sufficiency: include L_suff = CE(f(Z), y). Turn it off where the host's task loss already is that CE (the
            card's toy), so that the regularised arm differs from the host only by the regulariser.
        weight: a factor on the whole loss (1 in the code; 0 is the regulariser switched off, a stand-in).

    Example:
        >>> reg = C3Regularizer(dim=8, num_modalities=2)
        >>> feats = [torch.randn(6, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)]
        >>> z = feats[0] + feats[1]
        >>> loss, metrics = reg(feats, z, nn.Linear(8, 3), torch.tensor([0, 1, 2, 0, 1, 2]))
        >>> loss.ndim, sorted(metrics)[:3]
        (0, ['c3_risk', 'cf_norm', 'loss_fe'])
    """

    def __init__(self, dim: int, num_modalities: int = 2, lambda_v: float = 0.1, lambda_fe: float = 0.1,
                 eta: float = 1.0, cf_sign: Literal["remove_evidence", "code_vt"] = "remove_evidence",
                 eta_mode: Literal["absolute", "relative"] = "absolute", sufficiency: bool = True,
                 weight: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        if num_modalities < 2:
            raise ValueError(f"C³R needs at least two modalities, got num_modalities={num_modalities}")
        if min(lambda_v, lambda_fe, eta, weight) < 0:
            raise ValueError(f"lambda_v, lambda_fe, eta and weight must be >= 0, got {lambda_v}, {lambda_fe}, {eta}, "
                             f"{weight}")  # fmt: skip
        self.dim, self.num_modalities = dim, num_modalities
        self.lambda_v, self.lambda_fe, self.eta = lambda_v, lambda_fe, eta
        self.cf_sign, self.eta_mode, self.sufficiency, self.weight = cf_sign, eta_mode, sufficiency, weight
        self.W_Q, self.W_K, self.W_V = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        # vta: a learnable scale on the self-attention scores (the code's [d]-shaped one only broadcasts when d = M)
        self.score_scale = nn.Parameter(torch.ones(())) if num_modalities > 2 else None

    def instrument(self, features: Sequence[Tensor]) -> Tensor:
        """V ``(B, d)`` from the modality features (each ``(B, d)``)."""
        if len(features) != self.num_modalities:
            raise ValueError(f"expected {self.num_modalities} modality features, got {len(features)}")
        if self.num_modalities == 2:
            h_1, h_2 = features
            w = torch.sigmoid((self.W_Q(h_1) * self.W_K(h_2)).sum(-1, keepdim=True) / math.sqrt(self.dim))
            return w * self.W_V(h_2) + (1 - w) * self.W_V(h_1)
        tokens = torch.stack(list(features), 1)  # (B, M, d)
        scores = self.W_Q(tokens) @ self.W_K(tokens).transpose(1, 2) / math.sqrt(self.dim) * self.score_scale
        return (scores.softmax(-1) @ self.W_V(tokens)).sum(1)

    def forward(self, features: Sequence[Tensor], z: Tensor, head: Head, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The regulariser's loss and its metrics (detached) for modality features, fused Z ``(B, d)``, the head f
        and labels ``(B,)``."""
        sizes = [len(h) for h in features] + [len(z), len(y)]
        if len(set(sizes)) != 1:
            raise ValueError(f"modalities, Z and labels must share the batch size, got {sizes} (features..., Z, y)")
        if z.ndim != 2 or z.shape[1] != self.dim:
            raise ValueError(f"expected Z of shape (B, {self.dim}), got {tuple(z.shape)}")
        logits = head(z)
        loss_suff = F.cross_entropy(logits, y) if self.sufficiency else logits.new_zeros(())
        loss_iv = F.kl_div(F.log_softmax(z, -1), F.softmax(self.instrument(features), -1), reduction="batchmean")
        z_bar = counterfactual(z, head, y, self.eta, self.cf_sign, self.eta_mode, create_graph=True)
        p_y = F.softmax(head(z_bar), -1).gather(1, y[:, None]).squeeze(1)
        loss_nec = -torch.log(1 - p_y + 1e-6).mean()
        loss_fe = (z_bar - z).square().mean()
        loss = self.weight * (loss_suff + loss_nec + self.lambda_v * loss_iv + self.lambda_fe * loss_fe)
        with torch.no_grad():
            suff = (logits.argmax(-1) != y).float().mean()
            nec = (head(z_bar).argmax(-1) == y).float().mean()
            metrics = {"loss_nec": loss_nec.detach(), "loss_iv": loss_iv.detach(), "loss_fe": loss_fe.detach(),
                       "risk_suff": suff, "risk_nec": nec, "c3_risk": suff + nec,
                       "cf_norm": (z_bar - z).norm(dim=-1).mean()}  # fmt: skip
        return loss, metrics
