"""Encoders of the sparse autoencoder: TopK (official ``TopKSAE`` with the ``"linear"`` encoder), and the BatchTopK,
JumpReLU and ReLU + L1 encoders that SAE users expect beside it."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = ["BatchTopKEncoder", "EncoderKind", "JumpReLUEncoder", "ReLUEncoder", "TopKEncoder", "build_encoder"]


class TopKEncoder(nn.Module):
    """Encode activations as sparse codes keeping the ``top_k`` largest ReLU pre-codes per row.

    Pre-codes are ``p = x W_enc + b`` (``nn.Linear(dim, num_atoms)``); codes are ``TopK_s(ReLU(p))``: the
    ``top_k`` largest entries of each row are kept and the rest set to zero.

    Args:
        dim: input width d.
        num_atoms: number of concepts k (code width).
        top_k: non-zeros kept per row, ``1 <= top_k <= num_atoms``.

    Example:
        >>> enc = TopKEncoder(dim=8, num_atoms=32, top_k=4)
        >>> pre, codes = enc(torch.randn(5, 8))
        >>> codes.shape, int((codes[0] > 0).sum()) <= 4
        (torch.Size([5, 32]), True)
    """

    def __init__(self, dim: int, num_atoms: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= num_atoms:
            raise ValueError(f"Expected 1 <= top_k <= num_atoms ({num_atoms}), got top_k={top_k}.")
        self.dim, self.num_atoms, self.top_k = dim, num_atoms, top_k
        self.linear = nn.Linear(dim, num_atoms)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(pre_codes, codes)``, both ``(N, num_atoms)``."""
        pre = self.linear(x)
        values, index = torch.relu(pre).topk(self.top_k, dim=-1)
        codes = torch.zeros_like(pre).scatter(-1, index, values)
        return pre, codes

    @torch.no_grad()
    def tie_to(self, dictionary: Tensor) -> None:
        """Set ``W_enc`` to the unit-normalised rows of ``dictionary`` (``D_init^T`` up to row scale) and ``b = 0``.

        Not in the official code: the card's pilot found that the official random encoder init killed 75–85 %
        of the atoms on the synthetic data, so ``init="tied"`` starts the encoder at the initial decoder. Rows are
        normalised because archetypal atoms start at k-means centroids (norms ≈ 3–4 on the card's data, review
        note): unnormalised they gave several-times-larger pre-codes, and measured RA-SAE R² fell from 0.63 to
        0.52 (centred, k* = 256, 1,500 steps) against 0.64 for TopK.
        """
        self.linear.weight.copy_(dictionary / (dictionary.norm(dim=1, keepdim=True) + 1e-8))
        self.linear.bias.zero_()


class BatchTopKEncoder(TopKEncoder):
    """BatchTopK (Bussmann et al., 2024; overcomplete's and sae-lens' ``BatchTopK``): the ``top_k · B`` largest ReLU
    pre-codes of the whole batch are kept, so a sample may use more or fewer than ``top_k`` codes.

    Training tracks θ, the running mean (momentum 0.99) of the smallest kept value per batch; evaluation keeps the
    pre-codes above θ (a JumpReLU with one global threshold, as sae-lens converts it), so codes do not depend on
    the batch a sample is in.

    Example:
        >>> enc = BatchTopKEncoder(dim=8, num_atoms=32, top_k=4)
        >>> pre, codes = enc(torch.randn(16, 8))
        >>> int((codes > 0).sum()) <= 4 * 16
        True
    """

    def __init__(self, dim: int, num_atoms: int, top_k: int, momentum: float = 0.99) -> None:
        super().__init__(dim, num_atoms, top_k)
        self.momentum = momentum
        self.register_buffer("threshold", torch.zeros(()))
        self.register_buffer("threshold_ready", torch.tensor(False))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.linear(x)
        relu = torch.relu(pre)
        if not self.training:
            return pre, relu * (relu > self.threshold)
        flat = relu.flatten()
        values, index = flat.topk(min(self.top_k * len(x), flat.numel()))
        codes = torch.zeros_like(flat).scatter(0, index, values).view_as(pre)
        with torch.no_grad():  # no host read: the first batch sets θ, later ones move it (topk sorts descending)
            low = torch.where(values[-1] > 0, values[-1], self.threshold)
            moved = self.momentum * self.threshold + (1 - self.momentum) * low
            self.threshold.copy_(torch.where(self.threshold_ready, moved, low))
            self.threshold_ready.fill_(True)
        return pre, codes


class _JumpReLU(torch.autograd.Function):
    """z · H(z − θ), with Rajamanoharan et al.'s (2024) pseudo-derivative for θ: −(θ/ε) K((z − θ)/ε), K = 1[|u| < ½]."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        z, theta = ctx.saved_tensors
        window = ((z - theta).abs() < ctx.eps / 2).to(grad.dtype)
        grad_theta = (grad * -(theta / ctx.eps) * window).sum(tuple(range(grad.dim() - 1)))
        return grad * (z > theta).to(grad.dtype), grad_theta, None


class _Step(torch.autograd.Function):
    """H(z − θ) (the L0 count) with the pseudo-derivative −(1/ε) K((z − θ)/ε) for θ and none for z."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
        z, theta = ctx.saved_tensors
        window = ((z - theta).abs() < ctx.eps / 2).to(grad.dtype)
        return None, (grad * -(1.0 / ctx.eps) * window).sum(tuple(range(grad.dim() - 1))), None


class JumpReLUEncoder(nn.Module):
    """JumpReLU (Rajamanoharan et al., 2024; sae-lens' and overcomplete's ``JumpReLU``): per-atom learned thresholds.

    ``codes = p · H(p − θ)`` with ``p = x W_enc + b`` and θ = exp(log θ) per atom. H has no gradient, so θ learns
    through straight-through pseudo-derivatives with a rectangle kernel of bandwidth ``eps``; the sparsity is not
    fixed but paid for by an L0 penalty, ``l0_penalty · mean_rows Σ_atoms H(p − θ)`` (:meth:`sparsity_loss`), that
    the SAE adds to its loss. torch and the SAE libraries have no JumpReLU with these estimators as a module, hence
    the two small autograd functions here.

    Args:
        dim / num_atoms: as :class:`TopKEncoder`.
        top_k: not a hard limit here: it sets the initial threshold so that a start at random weights keeps about
            ``top_k`` codes (θ₀ = 0.1 · √(2 log(num_atoms / top_k)), a Gaussian tail bound scaled to the init).
        l0_penalty: λ of the L0 term.
        eps: bandwidth ε of the pseudo-derivatives.

    Example:
        >>> enc = JumpReLUEncoder(dim=8, num_atoms=32, top_k=4)
        >>> pre, codes = enc(torch.randn(5, 8))
        >>> codes.shape, bool(((codes == 0) | (codes > enc.theta)).all())
        (torch.Size([5, 32]), True)
    """

    def __init__(self, dim: int, num_atoms: int, top_k: int, l0_penalty: float = 1e-3, eps: float = 1e-3) -> None:
        super().__init__()
        if not 1 <= top_k <= num_atoms:
            raise ValueError(f"Expected 1 <= top_k <= num_atoms ({num_atoms}), got top_k={top_k}.")
        self.dim, self.num_atoms, self.top_k, self.l0_penalty, self.eps = dim, num_atoms, top_k, l0_penalty, eps
        self.linear = nn.Linear(dim, num_atoms)
        theta0 = 0.1 * math.sqrt(2 * math.log(max(num_atoms / top_k, 1.0 + 1e-6)))
        self.log_theta = nn.Parameter(torch.full((num_atoms,), math.log(max(theta0, 1e-3))))

    @property
    def theta(self) -> Tensor:
        return self.log_theta.exp()

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.linear(x)
        return pre, _JumpReLU.apply(torch.relu(pre), self.theta, self.eps)

    def sparsity_loss(self, pre: Tensor) -> Tensor:
        """λ · the mean number of active codes per row, differentiable in θ (not in the pre-codes)."""
        return self.l0_penalty * _Step.apply(torch.relu(pre), self.theta, self.eps).sum(-1).mean()

    @torch.no_grad()
    def tie_to(self, dictionary: Tensor) -> None:
        """As :meth:`TopKEncoder.tie_to`."""
        TopKEncoder.tie_to(self, dictionary)  # type: ignore[arg-type]


class ReLUEncoder(nn.Module):
    """The vanilla SAE encoder (Bricken et al., 2023; overcomplete's ``SAE``): ``codes = ReLU(x W_enc + b)``, made
    sparse by an L1 penalty ``l1_penalty · mean_rows Σ_atoms codes`` (:meth:`sparsity_loss`) rather than by a cap.
    With unit-norm atoms (the free dictionary) this is the L1 of Anthropic's update weighted by decoder norms.

    Args:
        dim / num_atoms: as :class:`TopKEncoder`.
        l1_penalty: λ of the L1 term.

    Example:
        >>> enc = ReLUEncoder(dim=8, num_atoms=32)
        >>> pre, codes = enc(torch.randn(5, 8))
        >>> bool((codes >= 0).all()), enc.sparsity_loss(pre).ndim
        (True, 0)
    """

    def __init__(self, dim: int, num_atoms: int, l1_penalty: float = 1e-2) -> None:
        super().__init__()
        if l1_penalty < 0:
            raise ValueError(f"Expected l1_penalty >= 0, got {l1_penalty}.")
        self.dim, self.num_atoms, self.l1_penalty = dim, num_atoms, l1_penalty
        self.linear = nn.Linear(dim, num_atoms)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.linear(x)
        return pre, torch.relu(pre)

    def sparsity_loss(self, pre: Tensor) -> Tensor:
        """λ · the mean L1 norm of the codes per row."""
        return self.l1_penalty * torch.relu(pre).sum(-1).mean()

    @torch.no_grad()
    def tie_to(self, dictionary: Tensor) -> None:
        """As :meth:`TopKEncoder.tie_to`."""
        TopKEncoder.tie_to(self, dictionary)  # type: ignore[arg-type]


EncoderKind = Literal["topk", "batchtopk", "jumprelu", "relu"]


def build_encoder(
    kind: str, dim: int, num_atoms: int, top_k: int, l0_penalty: float = 1e-3, l1_penalty: float = 1e-2
) -> nn.Module:
    """The encoder called ``kind`` (``"topk"``, ``"batchtopk"``, ``"jumprelu"`` or ``"relu"``, ReLU + L1)."""
    if kind == "topk":
        return TopKEncoder(dim, num_atoms, top_k)
    if kind == "batchtopk":
        return BatchTopKEncoder(dim, num_atoms, top_k)
    if kind == "jumprelu":
        return JumpReLUEncoder(dim, num_atoms, top_k, l0_penalty=l0_penalty)
    if kind == "relu":
        return ReLUEncoder(dim, num_atoms, l1_penalty=l1_penalty)
    raise ValueError(f"Expected encoder to be 'topk', 'batchtopk', 'jumprelu' or 'relu', got {kind!r}.")
