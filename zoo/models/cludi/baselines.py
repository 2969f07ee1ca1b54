"""Deep-clustering baselines on frozen features: SCAN's clustering step and TEMI, one head each.

CLUDI's paper compares against heads trained on frozen pretrained features (TEMI, SCAN, Self-Classifier); its
features come from the TEMI pipeline. Both baselines mine each training point's nearest neighbours in the frozen
feature space and train a head whose cluster probabilities agree between a point and a neighbour:

* **SCAN** (Van Gansbeke et al., ECCV 2020), eq. (2): −log⟨p(x), p(n)⟩ minus λ = 5 times the entropy of the mean
  prediction. Its self-labelling fine-tune and its ten heads are not run.
* **TEMI** (Adaloglou et al., BMVC 2023): a student head and its EMA teacher (momentum 0.996 → 1, cosine), the
  β-pointwise mutual information −log Σ_k (q_s(k|x) q_t(k|n))^β / π_k with β = 0.6 and π the EMA (0.9) of the
  teacher's mean prediction, weighted per pair by the teacher's agreement Σ_k q_t(k|x) q_t(k|n), symmetric in the two
  views, temperatures 0.1 (the official defaults); 50 independent heads, each an MLP to an L2-normalised bottleneck
  and a weight-normalised last layer as the official DINO-style heads, narrower here (128 / 64 instead of 512 / 256)
  for the CPU; AdamW with a 10-epoch warm-up and a cosine decay; the lowest-loss head labels.

No maintained package ships either (``scan`` on PyPI is unrelated; both official repositories are training scripts),
so the losses are written here from the papers and the official TEMI code (HHU-MMBS/TEMI-official-BMVC2023 at
c02631b). Self-Classifier is the zoo's ``mode="no_diffusion"`` CLUDI ablation (the same row/column-normalised loss
between two views of the features).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Self

import torch
from torch import Tensor, nn

__all__ = ["SCANHead", "TEMIHead", "mine_neighbours", "scan_loss", "temi_loss"]


def mine_neighbours(x: Tensor, k: int, batch_size: int = 4096) -> Tensor:
    """Indices ``(N, k)`` of each row's ``k`` nearest other rows of ``x`` by cosine similarity (itself excluded).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> mine_neighbours(x, 1).flatten().tolist()
        [1, 0, 3, 2]
    """
    if not 1 <= k < len(x):
        raise ValueError(f"k must be in [1, {len(x) - 1}] for {len(x)} rows, got {k}")
    z = nn.functional.normalize(x.float(), dim=-1)
    rows = []
    for start in range(0, len(z), batch_size):  # blocks of rows keep the similarity matrix small for large N
        sim = z[start : start + batch_size] @ z.T
        sim[torch.arange(len(sim)), torch.arange(start, start + len(sim))] = -float("inf")
        rows.append(sim.topk(k, dim=-1).indices)
    return torch.cat(rows)


def scan_loss(anchor_logits: Tensor, neighbour_logits: Tensor, entropy_weight: float = 5.0) -> Tensor:
    """SCAN's clustering loss: −mean log⟨p(x), p(n)⟩ − λ H(mean p(x)), for anchors and one neighbour each.

    The entropy of the batch's mean prediction is subtracted, so spreading the points over clusters lowers the loss
    (λ = 5, the paper's value).

    Example:
        >>> same = torch.tensor([[9.0, 0.0], [0.0, 9.0]])
        >>> bool(scan_loss(same, same) < scan_loss(same, same.flip(-1)))
        True
    """
    p, q = anchor_logits.softmax(-1), neighbour_logits.softmax(-1)
    consistency = -torch.log((p * q).sum(-1).clamp_min(1e-8)).mean()
    mean = p.mean(0)
    entropy = -(mean * torch.log(mean.clamp_min(1e-8))).sum()
    return consistency - entropy_weight * entropy


def temi_loss(student: Tensor, teacher: Tensor, prior: Tensor, beta: float = 0.6) -> Tensor:
    """TEMI's weighted β-PMI per head, for student and teacher probabilities of two views ``(2, B, H, K)``.

    For each ordered pair of different views (v, w): −w(x) log Σ_k (q_s(k|v) q_t(k|w))^β / π_k, with the teacher's
    agreement w(x) = Σ_k q_t(k|x) q_t(k|n), averaged over the heads, as the pair weight (no gradient through the
    teacher) and ``prior`` π ``(H, K)``. Returns ``(H,)``, the loss of each head.

    Example:
        >>> uniform = torch.full((2, 3, 1, 4), 0.25)
        >>> # w = 4 · (1/4)² = 1/4 and Σ_k (1/16)^½ / (1/4) = 4, so each head's loss is −¼ · log 4
        >>> temi_loss(uniform, uniform, torch.full((1, 4), 0.25), beta=0.5).mul(1e4).round().tolist()
        [-3466.0]
    """
    weight = (teacher[0] * teacher[1]).sum(-1).mean(-1, keepdim=True)  # (B, 1): shared by the heads
    terms = [
        -(weight * torch.log(((student[v] * teacher[w]) ** beta / prior).sum(-1))).mean(0) for v, w in ((0, 1), (1, 0))
    ]
    return (terms[0] + terms[1]) / 2


class _NeighbourHead(nn.Module):
    """A two-layer head on L2-normalised frozen features, trained on (point, mined neighbour) pairs."""

    def __init__(self, feat_dim: int, num_clusters: int, hidden: int, neighbours: int, heads: int = 1) -> None:
        super().__init__()
        if num_clusters < 2:
            raise ValueError(f"num_clusters must be at least 2, got {num_clusters}")
        if neighbours < 1:
            raise ValueError(f"neighbours must be at least 1, got {neighbours}")
        if heads < 1:
            raise ValueError(f"heads must be at least 1, got {heads}")
        self.neighbours, self.num_clusters, self.heads, self.head = neighbours, num_clusters, heads, 0
        self.net = self._build(feat_dim, hidden)

    def _build(self, feat_dim: int, hidden: int) -> nn.Module:
        return nn.Sequential(nn.Linear(feat_dim, hidden), nn.GELU(), nn.Linear(hidden, self.heads * self.num_clusters))

    def _logits(self, net: nn.Module, x: Tensor) -> Tensor:
        """``(..., heads, K)`` logits of L2-normalised features."""
        return net(nn.functional.normalize(x.float(), dim=-1)).unflatten(-1, (self.heads, self.num_clusters))

    def _optimizer(self, lr: float, steps_per_epoch: int, epochs: int) -> tuple[torch.optim.Optimizer, Any]:
        """Adam with weight decay 1e-4 at a constant rate (SCAN's clustering step)."""
        return torch.optim.Adam(self.net.parameters(), lr=lr, weight_decay=1e-4), None

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, K)`` of the selected head."""
        return self._logits(self.net, x)[..., self.head, :]

    @torch.no_grad()
    def cluster(self, x: Tensor) -> Tensor:
        """Argmax cluster of each row."""
        return self.eval()(x).argmax(-1)

    def _loss(self, anchors: Tensor, neighbours: Tensor, progress: float) -> Tensor:
        raise NotImplementedError

    def _after_step(self, progress: float) -> None:
        pass

    def fit(self, x: Tensor, epochs: int = 100, batch_size: int = 256, lr: float = 1e-3, seed: int = 0) -> Self:
        """Train on features ``x`` ``(N, F)`` (labels are never seen): each anchor is paired with one of its mined
        neighbours drawn afresh every epoch, with the head's optimiser (see ``_optimizer``) at peak rate ``lr``."""
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for layer in self.net.modules():
                if layer is not self.net and hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
        self._start()
        neighbours = mine_neighbours(x, min(self.neighbours, len(x) - 1))
        per_epoch = math.ceil(len(x) / batch_size)
        optimizer, scheduler = self._optimizer(lr, per_epoch, epochs)
        steps, step = epochs * per_epoch, 0
        self.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator)
            pick = torch.randint(0, neighbours.shape[1], (len(x),), generator=generator)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                loss = self._loss(x[idx], x[neighbours[idx, pick[idx]]], step / steps)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                self._after_step(step / steps)
        self._select(x, neighbours)
        return self.eval()

    def _start(self) -> None:
        pass

    def _select(self, x: Tensor, neighbours: Tensor) -> None:
        pass


class _DinoHeads(nn.Module):
    """``heads`` independent DINO-style heads in one batched call: Linear → GELU → Linear to a bottleneck, L2
    normalisation, and a weight-normalised last layer without bias (its gains trainable, as TEMI's
    ``norm_last_layer=False``). ``(..., F)`` → ``(..., heads, K)``; torch has no batched per-head MLP, hence bmm."""

    def __init__(self, feat_dim: int, num_clusters: int, heads: int, hidden: int, bottleneck: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(heads, feat_dim, hidden))
        self.b1 = nn.Parameter(torch.empty(heads, 1, hidden))
        self.w2 = nn.Parameter(torch.empty(heads, hidden, bottleneck))
        self.b2 = nn.Parameter(torch.empty(heads, 1, bottleneck))
        self.v = nn.Parameter(torch.empty(heads, bottleneck, num_clusters))
        self.g = nn.Parameter(torch.empty(heads, 1, num_clusters))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.w1, self.w2, self.v):  # DINO's head init: truncated normal, std 0.02, zero biases
            nn.init.trunc_normal_(w, std=0.02)
        for b in (self.b1, self.b2):
            nn.init.zeros_(b)
        nn.init.ones_(self.g)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(1, -1, x.shape[-1]).expand(len(self.w1), -1, -1)
        h = nn.functional.gelu(torch.baddbmm(self.b1, rows, self.w1))
        z = nn.functional.normalize(torch.baddbmm(self.b2, h, self.w2), dim=-1)
        out = z @ (nn.functional.normalize(self.v, dim=1) * self.g)  # (heads, rows, K)
        return out.transpose(0, 1).reshape(*lead, *out.shape[::2])


class TEMIHead(_NeighbourHead):
    """TEMI on frozen features: student heads, their EMA teacher and the teacher's cluster priors π.

    After training, the head with the lowest loss over the training pairs labels the data (the official selection).

    Args:
        feat_dim: feature width F.
        num_clusters: K.
        hidden: hidden width of the head.
        neighbours: nearest neighbours mined per training point (official: 50 on ImageNet-scale data).
        beta: β of the pointwise mutual information (0.6).
        temperature: softmax temperature of student and teacher (0.1, the official defaults).
        momentum: the teacher's starting EMA momentum, raised to 1 by a cosine over training (0.996).
        prior_momentum: EMA momentum of π (0.9).
        heads: clustering heads trained side by side (official: 50).
        bottleneck: width of each head's L2-normalised bottleneck (official: 256, with ``hidden`` 512).
        warmup_epochs: epochs of linear learning-rate warm-up before the cosine decay to 1e-6 (official: 10).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.eye(3).repeat_interleave(40, 0) * 3 + torch.randn(120, 3, generator=g)
        >>> head = TEMIHead(3, 3, hidden=32, neighbours=5).fit(x, epochs=40, batch_size=60, seed=0)
        >>> head.cluster(x).shape
        torch.Size([120])
    """

    def __init__(
        self,
        feat_dim: int,
        num_clusters: int,
        hidden: int = 128,
        neighbours: int = 20,
        beta: float = 0.6,
        temperature: float = 0.1,
        momentum: float = 0.996,
        prior_momentum: float = 0.9,
        heads: int = 50,
        bottleneck: int = 64,
        warmup_epochs: int = 10,
    ) -> None:
        self.bottleneck, self.warmup_epochs = bottleneck, warmup_epochs
        super().__init__(feat_dim, num_clusters, hidden, neighbours, heads)
        self.beta, self.temperature, self.momentum, self.prior_momentum = beta, temperature, momentum, prior_momentum
        self.teacher = copy.deepcopy(self.net).requires_grad_(False)
        self.register_buffer("prior", torch.full((heads, num_clusters), 1.0 / num_clusters))

    def _build(self, feat_dim: int, hidden: int) -> nn.Module:
        return _DinoHeads(feat_dim, self.num_clusters, self.heads, hidden, self.bottleneck)

    def _logits(self, net: nn.Module, x: Tensor) -> Tensor:
        return net(nn.functional.normalize(x.float(), dim=-1))

    def _optimizer(self, lr: float, steps_per_epoch: int, epochs: int) -> tuple[torch.optim.Optimizer, Any]:
        """AdamW (weight decay 1e-4), linear warm-up over ``warmup_epochs`` then a cosine to 1e-6 (TEMI's)."""
        optimizer = torch.optim.AdamW(self.net.parameters(), lr=lr, weight_decay=1e-4)
        warmup, total, floor = (
            min(self.warmup_epochs, epochs - 1) * steps_per_epoch,
            epochs * steps_per_epoch,
            1e-6 / lr,
        )

        def rate(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, rate)

    def _start(self) -> None:
        self.teacher.load_state_dict(self.net.state_dict())
        self.prior.fill_(1.0 / self.num_clusters)

    def _head_losses(self, anchors: Tensor, neighbours: Tensor, update: bool = True) -> Tensor:
        views = torch.stack([anchors, neighbours])
        student = (self._logits(self.net, views) / self.temperature).softmax(-1)
        with torch.no_grad():
            teacher = (self._logits(self.teacher, views) / self.temperature).softmax(-1)
            if update:
                self.prior.mul_(self.prior_momentum).add_((1 - self.prior_momentum) * teacher.mean((0, 1)))
        return temi_loss(student, teacher, self.prior, self.beta)

    def _loss(self, anchors: Tensor, neighbours: Tensor, progress: float) -> Tensor:
        return self._head_losses(anchors, neighbours).mean()  # the official average over heads

    @torch.no_grad()
    def _select(self, x: Tensor, neighbours: Tensor) -> None:
        self.head = int(self._head_losses(x, x[neighbours[:, 0]], update=False).argmin())

    @torch.no_grad()
    def _after_step(self, progress: float) -> None:
        m = 1 - (1 - self.momentum) * (math.cos(math.pi * progress) + 1) / 2  # DINO's cosine schedule to 1
        for t, s in zip(self.teacher.parameters(), self.net.parameters(), strict=True):
            t.mul_(m).add_((1 - m) * s)


class SCANHead(_NeighbourHead):
    """A two-layer head on frozen features trained by SCAN's clustering step; ``fit`` then call it for logits.

    Args:
        feat_dim: feature width F.
        num_clusters: K.
        hidden: hidden width of the head.
        neighbours: nearest neighbours mined per training point (SCAN: 20).
        entropy_weight: λ of the entropy term (SCAN: 5).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> centres = torch.eye(4) * 3
        >>> x = (centres.repeat_interleave(50, 0) + torch.randn(200, 4, generator=g))
        >>> head = SCANHead(4, 4).fit(x, epochs=30, seed=0)
        >>> labels = head.cluster(x)
        >>> len(set(labels.tolist())) == 4
        True
    """

    def __init__(
        self, feat_dim: int, num_clusters: int, hidden: int = 256, neighbours: int = 20, entropy_weight: float = 5.0
    ) -> None:
        super().__init__(feat_dim, num_clusters, hidden, neighbours)
        self.entropy_weight = entropy_weight

    def _loss(self, anchors: Tensor, neighbours: Tensor, progress: float) -> Tensor:
        return scan_loss(
            self._logits(self.net, anchors)[..., 0, :],
            self._logits(self.net, neighbours)[..., 0, :],
            self.entropy_weight,
        )
