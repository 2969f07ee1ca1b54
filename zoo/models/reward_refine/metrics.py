"""What the card measures on a designed population: reward, constraint satisfaction, naturalness and diversity."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["diversity", "population_metrics", "pseudo_log_likelihood", "top_fraction_mean"]


def diversity(x: Tensor) -> float:
    """Mean pairwise Hamming distance over distinct pairs, divided by the length (the official ``set_diversity``).

    Example:
        >>> diversity(torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]]))
        0.5
    """
    n = len(x)
    if n < 2:
        return 0.0
    d = (x[:, None] != x[None]).float().mean(-1)
    return float(d.sum() / (n * (n - 1)))


def top_fraction_mean(r: Tensor, fraction: float = 0.1) -> float:
    """Mean of the top ``fraction`` of the rewards (at least one).

    Example:
        >>> top_fraction_mean(torch.arange(20.0))
        18.5
    """
    k = max(1, round(fraction * len(r)))
    return float(r.float().topk(k).values.mean())


@torch.no_grad()
def pseudo_log_likelihood(denoiser: Callable[[Tensor], Tensor], x: Tensor, mask_id: int,
                          n_valid: int | None = None, chunk: int = 8192) -> Tensor:  # fmt: skip
    """Per-letter pseudo-log-likelihood under the denoiser: mask each position alone, ``log softmax`` over the
    *vocabulary* (the official ``likelihood()`` normalises over the sequence axis, ``softmax(dim=1)``, a bug the card
    says not to copy), averaged over positions. ``(N,)``.

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> net = MaskedDenoiser(4, 6).eval()
        >>> bool(pseudo_log_likelihood(net, torch.zeros(2, 6, dtype=torch.long), 4).le(0).all())
        True
    """
    n, length = x.shape
    eye = torch.eye(length, dtype=torch.bool, device=x.device)
    rows = x[:, None].expand(n, length, length).masked_fill(eye, mask_id).reshape(n * length, length)
    out = []
    for lo in range(0, len(rows), chunk):
        logits = denoiser(rows[lo : lo + chunk]).float()
        out.append(logits[..., :n_valid] if n_valid is not None else logits)
    logp = torch.cat(out).log_softmax(-1).view(n, length, length, -1)
    pos = torch.arange(length, device=x.device)
    return logp[:, pos, pos].gather(-1, x[..., None]).squeeze(-1).mean(1)


def population_metrics(
    x: Tensor,
    rewards: Tensor,
    satisfied: Tensor | None = None,
    log_prob: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, float]:
    """``reward`` (mean), ``reward_top10`` (top-10 % mean), ``constraint`` (share satisfying it), ``naturalness``
    (mean ``log p(x) / L`` under the true model, an independent judge rather than the guiding reward) and
    ``diversity``.

    Example:
        >>> population_metrics(torch.tensor([[0, 1], [1, 1]]), torch.tensor([1.0, 3.0]))
        {'reward': 2.0, 'reward_top10': 3.0, 'diversity': 0.5}
    """
    out = {"reward": float(rewards.float().nanmean()), "reward_top10": top_fraction_mean(rewards.nan_to_num(-1e9))}
    if satisfied is not None:
        out["constraint"] = float(satisfied.float().mean())
    if log_prob is not None:
        out["naturalness"] = float(log_prob(x).mean() / x.shape[1])
    out["diversity"] = diversity(x)
    return out
