"""Dataset-pruning scores from recorded training dynamics, and the subset selections (DUAL card §2).

Every score is a pure function of what ``callbacks.TrainingDynamics`` records: ``target_probs`` ``(E, N)``, the
probability of each sample's (possibly noisy) label at each recorded epoch, or ``probs`` ``(E, N, C)``, the full
softmax. Higher score = keep first, for every score here. No maintained PyPI package provides these scores (card §5),
so they are written here, vectorised over samples (sliding windows with ``Tensor.unfold``).

Where the official code differs from what it intends, the intended version is the default and the difference is
named in the docstring (AUM's accumulator, TDDS's windows).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "aum_score",
    "balanced_random_select",
    "beta_select",
    "ccs_select",
    "check_probabilities",
    "dual_score",
    "dyn_unc_score",
    "el2n_score",
    "entropy_score",
    "forgetting_score",
    "keep_count",
    "random_select",
    "tdds_score",
    "topk_select",
]


def check_probabilities(values: Tensor, name: str = "target_probs") -> None:
    """Refuse anything but finite probabilities in [0, 1]: logits passed by mistake would score from −79 to 251."""
    finite = bool(torch.isfinite(values).all())
    if values.numel() and not (finite and 0 <= float(values.min()) and float(values.max()) <= 1):
        shown = values.nan_to_num()
        raise ValueError(
            f"{name} must hold probabilities in [0, 1] (the softmax of each sample's label), got values from "
            f"{float(shown.min()):.3g} to {float(shown.max()):.3g}{'' if finite else ' and non-finite entries'}: "
            "logits or losses? Take softmax(logits) and gather each sample's label (TrainingDynamics records that)"
        )


def _check_probs(target_probs: Tensor, epochs: int | None, window: int) -> Tensor:
    if target_probs.ndim != 2:
        raise ValueError(f"target_probs must be (epochs, samples), got shape {tuple(target_probs.shape)}")
    p = target_probs if epochs is None else target_probs[:epochs]
    if epochs is not None and len(target_probs) < epochs:
        raise ValueError(f"the score needs {epochs} recorded epochs, the record has {len(target_probs)}")
    check_probabilities(p)
    if not 2 <= window <= len(p):
        raise ValueError(f"window must be in [2, {len(p)}] (the recorded epochs used), got {window}")
    return p.double()


def dual_score(target_probs: Tensor, epochs: int = 30, window: int = 10) -> Tensor:
    """DUAL: mean over sliding windows of 10·σ_k(n)·(1 − μ_k(n)) over the first ``epochs`` epochs.

    μ_k, σ_k are the mean and unbiased standard deviation of the target probability over epochs k … k+J−1,
    k = 0 … T−J (J = ``window``): uncertain *and* difficult samples score high.

    Example:
        >>> p = torch.tensor([[0.1, 0.9], [0.5, 0.9], [0.2, 0.9]])   # sample 0 fluctuates and is hard
        >>> dual_score(p, epochs=3, window=2)
        tensor([1.6794, 0.0000], dtype=torch.float64)
    """
    w = _check_probs(target_probs, epochs, window).unfold(0, window, 1)  # (K, N, J)
    return (10 * w.std(dim=-1) * (1 - w.mean(dim=-1))).mean(dim=0)


def dyn_unc_score(target_probs: Tensor, window: int = 10, epochs: int | None = None) -> Tensor:
    """Dynamic uncertainty: mean over sliding windows of 10·σ_k(n), over all recorded epochs by default."""
    w = _check_probs(target_probs, epochs, window).unfold(0, window, 1)
    return (10 * w.std(dim=-1)).mean(dim=0)


def el2n_score(probs: Tensor, labels: Tensor) -> Tensor:
    """EL2N: ‖softmax − onehot(y)‖₂ at one epoch; ``probs`` ``(N, C)`` (the official code uses epoch 20)."""
    one_hot = torch.nn.functional.one_hot(labels.long(), probs.shape[-1]).to(probs.dtype)
    return (probs - one_hot).norm(dim=-1)


def forgetting_score(probs: Tensor, labels: Tensor) -> Tensor:
    """Forgetting events: how often the argmax goes from correct to incorrect between consecutive epochs."""
    correct = probs.argmax(dim=-1) == labels.long()[None]
    return (correct[:-1] & ~correct[1:]).sum(dim=0).double()


def aum_score(probs: Tensor, labels: Tensor) -> Tensor:
    """Area under the margin: mean over epochs of p_y − max_{c≠y} p_c, negated so that low margins score high.

    The official script resets its accumulator inside the epoch loop, so only the last epoch counts there; this is
    the intended mean. Keep-highest convention: the sign is flipped (small or negative margins are the hard,
    possibly mislabelled samples AUM points at).
    """
    y = labels.long()[None, :, None].expand(len(probs), -1, 1)
    target = probs.gather(-1, y).squeeze(-1)
    others = probs.scatter(-1, y, float("-inf")).amax(dim=-1)
    return -(target - others).double().mean(dim=0)


def entropy_score(probs: Tensor) -> Tensor:
    """Entropy of the softmax ``(N, C)`` (the official code uses the last recorded epoch)."""
    return -(probs * torch.log(probs + 1e-10)).sum(dim=-1).double()


def tdds_score(probs: Tensor, epochs: int = 70, window: int = 10) -> Tensor:
    """TDDS: the spread of per-epoch prediction changes inside windows, exponentially weighted toward late windows.

    d_t(n) = Σ_c |p_{t+1,c}·(log p_{t+1,c} − log p_{t,c})| for t < T−1; window k (k = 0 … T−J) holds the J−1
    changes d_k … d_{k+J−2}; its value is the L2 norm of their deviations from the window mean, weighted by
    0.9·0.1^{T−J−k}; the score is the sum over windows. The official CIFAR script forgets the offset k (every window
    is epochs 0 … J−1) and takes logs of raw logits; this follows the intended version (and its ImageNet script).
    """
    if probs.ndim != 3:
        raise ValueError(f"probs must be (epochs, samples, classes), got shape {tuple(probs.shape)}")
    if len(probs) < epochs or not 2 <= window <= epochs:
        raise ValueError(f"TDDS needs window in [2, epochs] and {epochs} recorded epochs, got {len(probs)}, {window}")
    p = probs[:epochs].double()
    log = torch.log(p + 1e-8)
    change = (p[1:] * (log[1:] - log[:-1])).abs().sum(dim=-1)  # (T-1, N)
    w = change.unfold(0, window - 1, 1)  # (T-J+1, N, J-1)
    spread = (w - w.mean(dim=-1, keepdim=True)).norm(dim=-1)
    k = torch.arange(len(spread), dtype=torch.float64)
    weight = 0.9 * 0.1 ** (epochs - window - k)
    return (weight[:, None] * spread).sum(dim=0)


def keep_count(n: int, ratio: float) -> int:
    """Samples kept when pruning a fraction ``ratio`` ∈ (0, 1) of ``n``: ⌊(1 − ratio)·n⌋, at least 1."""
    if not 0 < ratio < 1:
        raise ValueError(f"the pruning ratio must be in (0, 1) (the fraction removed), got {ratio}")
    return max(1, math.floor((1 - ratio) * n + 1e-9))


def topk_select(score: Tensor, ratio: float) -> Tensor:
    """Indices of the ⌊(1 − ratio)·N⌋ highest scores (the official ``mask[-k:]`` after an ascending sort)."""
    return score.argsort(descending=True, stable=True)[: keep_count(len(score), ratio)]


def random_select(n: int, ratio: float, generator: torch.Generator | None = None) -> Tensor:
    """A uniform random subset of ⌊(1 − ratio)·n⌋ indices."""
    return torch.randperm(n, generator=generator)[: keep_count(n, ratio)]


def beta_select(
    score: Tensor,
    target_probs: Tensor,
    ratio: float,
    c_d: float = 4.0,
    epochs: int = 30,
    anchor: int = 10,
    generator: torch.Generator | None = None,
) -> Tensor:
    """DUAL's pruning-ratio-adaptive Beta sampling (card §2.3): k indices drawn without replacement from π.

    m(n) is the mean target probability over the first ``epochs`` epochs; a the mean of m over the ``anchor``
    highest-scoring samples; β = 15·(1 − a)·(1 − r^{c_D}), α = 16 − β; π(n) ∝ BetaPDF(m(n); α, β)·score(n). As r → 1
    the Beta mode moves to easy samples, which keeps a tiny subset learnable. ``torch.multinomial`` without
    replacement is the same successive-draw scheme as the official ``np.random.choice(..., replace=False, p=π)``;
    β is clamped to [1e-3, 16 − 1e-3], and when fewer than k samples have a non-zero weight the rest is filled by
    score rank (card §9).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(30, 100, generator=g)
        >>> beta_select(dual_score(p), p, ratio=0.9, generator=g).shape
        torch.Size([10])
    """
    from scipy.stats import beta as beta_dist

    k = keep_count(len(score), ratio)
    if target_probs.ndim != 2 or target_probs.shape[1] != len(score):
        raise ValueError(f"target_probs {tuple(target_probs.shape)} must be (epochs, {len(score)})")
    if len(target_probs) < epochs:
        raise ValueError(f"m(n) needs {epochs} recorded epochs, the record has {len(target_probs)}")
    check_probabilities(target_probs[:epochs])
    m = target_probs[:epochs].double().mean(dim=0)
    a = float(m[score.argsort(descending=True, stable=True)[:anchor]].mean())
    b = min(max(15 * (1 - a) * (1 - ratio**c_d), 1e-3), 16 - 1e-3)  # the card's clamp of β
    # m clamped away from 0 and 1: there the density is 0 or infinite when α or β < 1.
    pdf = torch.from_numpy(beta_dist.pdf(m.clamp(1e-6, 1 - 1e-6).numpy(), 16 - b, b))
    weight = pdf * score.double().clamp_min(0)
    nonzero = int((weight > 0).sum())
    if nonzero >= k:
        return torch.multinomial(weight, k, replacement=False, generator=generator)
    # Fewer candidates than the budget (np.random.choice would raise): take them all, fill the rest by score rank.
    drawn = weight.nonzero().squeeze(1)
    taken = torch.zeros(len(score), dtype=torch.bool)
    taken[drawn] = True
    rest = score.argsort(descending=True, stable=True)
    return torch.cat([drawn, rest[~taken[rest]][: k - nonzero]])


def balanced_random_select(labels: Tensor, ratio: float, generator: torch.Generator | None = None) -> Tensor:
    """A uniform random subset with the class proportions of ``labels``: k = ⌊(1 − r)·N⌋ indices in all.

    Each class c of size N_c gets ⌊k·N_c / N⌋ places, and the places left over go one each to the classes with the
    largest remainders (largest-remainder apportionment), so no class is short by chance at extreme ratios.

    Example:
        >>> labels = torch.tensor([0] * 60 + [1] * 30 + [2] * 10)
        >>> torch.bincount(labels[balanced_random_select(labels, 0.9)]).tolist()
        [6, 3, 1]
    """
    k = keep_count(len(labels), ratio)
    sizes = torch.bincount(labels.long())
    share = sizes.double() * k / len(labels)
    quota = share.floor().long()
    left = k - int(quota.sum())
    quota[(share - quota).argsort(descending=True, stable=True)[:left]] += 1
    order = torch.randperm(len(labels), generator=generator)
    by_class = order[labels.long()[order].argsort(stable=True)]  # random order within each class
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.arange(len(labels)) - starts[labels.long()[by_class]]
    return by_class[rank < quota[labels.long()[by_class]]]


def ccs_select(
    score: Tensor,
    ratio: float,
    hard_cut: float = 0.2,
    cut_by: Tensor | None = None,
    strata: int = 50,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Coverage-centric selection (CCS, Zheng et al., ICLR 2023): drop the hardest ``hard_cut`` of the samples, then
    spread the budget evenly over equal-width strata of ``score``.

    Both ``score`` and ``cut_by`` follow this module's convention, higher = harder. The hard cut removes the
    ⌊``hard_cut``·N⌋ samples with the highest ``cut_by`` (default: ``score`` itself): the hardest end, where the
    mislabelled samples sit. The CCS code (haizhongzheng/Coverage-centric-coreset-selection, b37f166,
    ``CoresetSelection.mislabel_mask``) always cuts by the accumulated margin, lowest margins first, whatever score
    the strata use, and stratifies over AUM in its CIFAR commands (hard cut 0.3 at 90 % pruning): pass
    ``aum_score`` as both. (The DUAL repo's CCS branch drops the front of the ascending order of the score it is
    given; that is the hardest end only for a score where low means hard, such as a raw margin, and the easiest end
    for EL2N, forgetting or DUAL.)

    The kept scores are cut into ``strata`` equal-width bins; the budget k is spread over the bins from the smallest
    up (each takes min(its size, what is left / bins left)), and each bin is sampled uniformly.

    Example:
        >>> score = torch.arange(100.0)          # sample i has difficulty i
        >>> keep = ccs_select(score, 0.5, hard_cut=0.2, generator=torch.Generator().manual_seed(0))
        >>> len(keep), int(score[keep].max()) < 80  # the 20 hardest are never kept
        (50, True)
    """
    if not 0 <= hard_cut < 1:
        raise ValueError(f"hard_cut must be in [0, 1) (the fraction of hardest samples dropped), got {hard_cut}")
    cut_by = score if cut_by is None else cut_by
    if cut_by.shape != score.shape:
        raise ValueError(f"cut_by {tuple(cut_by.shape)} must have the shape of score {tuple(score.shape)}")
    k = keep_count(len(score), ratio)
    order = cut_by.argsort(descending=True, stable=True)  # hardest first
    kept = order[int(hard_cut * len(score)) :]
    if len(kept) < k:
        raise ValueError(f"hard_cut={hard_cut} leaves {len(kept)} samples, fewer than the {k} to keep")
    s = score[kept].double()
    # The top edge just past the maximum, relative to the range (the official `max * 1.0001` breaks on negative or
    # offset scores): the largest score falls in the last stratum, and a constant shift changes nothing.
    low = float(s.min())
    high = float(s.max()) + 1e-4 * (float(s.max()) - low) + 1e-12
    bins = ((s - low) / ((high - low) / strata)).long().clamp(0, strata - 1)
    sizes = torch.bincount(bins, minlength=strata)
    budget = torch.zeros(strata, dtype=torch.long)
    left = k
    for rank, b in enumerate(sizes.argsort(stable=True).tolist()):  # 50 bins: a Python loop is fine here
        take = min(int(sizes[b]), left // (strata - rank))
        budget[b] = take
        left -= take
    shuffled = torch.randperm(len(kept), generator=generator)
    # Within each bin, keep the first `budget` samples of a random order: one stable sort by bin does it.
    by_bin = shuffled[bins[shuffled].argsort(stable=True)]
    starts = torch.cumsum(sizes, 0) - sizes
    rank_in_bin = torch.arange(len(kept)) - starts[bins[by_bin]]
    return kept[by_bin[rank_in_bin < budget[bins[by_bin]]]]
