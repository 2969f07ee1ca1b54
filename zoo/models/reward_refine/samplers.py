"""Samplers of a masked-diffusion denoiser over a population, all built on one guided unmasking step.

One step unmasks one position per sequence, the order-agnostic (OADM) way of the official code. With ``M``
candidates per sequence (SVDD's value-based decoding, the official ``generate_oaardm_reward_metrics*``):

1. one proposal forward of the population;
2. each candidate draws *its own* uniformly random still-masked position (the card's pitfall: one position shared by
   the candidates changes the algorithm) and a letter from the softmax of the logits there;
3. each candidate is valued by one more forward: every remaining mask filled with its argmax prediction, the
   completed sequence scored by the reward (a one-step estimate of x̂₀);
4. the highest-valued candidate is kept (argmax, the α → 0 limit).

``M = 1`` is unguided sampling (no value forward, no reward call). On top of it: :func:`unguided`,
:func:`best_of_n`, :func:`svdd` (single shot from all masks) and :func:`refine`, the paper's iterative refinement
(RERD): an SVDD pass, then rounds of resampling by ``exp(r / α)``, re-masking ``E`` random positions and guided
re-unmasking. Every sampler counts reward calls (sequences scored) and denoiser calls (rows forwarded) per output
sequence, the budget the comparisons are matched on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from zoo.models.reward_refine.rewards import CountedReward

__all__ = [
    "Design",
    "best_of_n",
    "guided_unmask",
    "refine",
    "refine_budget",
    "remask",
    "resample",
    "rounds_for_budget",
    "svdd",
    "unguided",
]

Denoiser = Callable[[Tensor], Tensor]


@dataclass
class Design:
    """A sampler's output population and its costs.

    Attributes:
        sequences: ``(R, L)`` letters.
        rewards: ``(R,)`` the reward of each output (an evaluation: not counted in the budget).
        reward_calls: sequences scored per output sequence (the budget).
        denoiser_calls: rows forwarded per output sequence.
        trajectory: mean reward of the population after each guided pass (refinement: round 0 is the SVDD pass).
        ess: effective sample size of each resampling, ``(Σw)² / Σw²``.
        seconds: wall time.
    """

    sequences: Tensor
    rewards: Tensor
    reward_calls: float
    denoiser_calls: float
    trajectory: list[float] = field(default_factory=list)
    ess: list[float] = field(default_factory=list)
    seconds: float = 0.0


class _Forward:
    """The denoiser restricted to the valid letters, counting the rows it forwards."""

    def __init__(self, denoiser: Denoiser, n_valid: int | None) -> None:
        self.denoiser, self.n_valid, self.rows = denoiser, n_valid, 0

    @torch.no_grad()
    def __call__(self, x: Tensor) -> Tensor:
        self.rows += len(x)
        logits = self.denoiser(x).float()
        return logits[..., : self.n_valid] if self.n_valid is not None else logits


def _mask_id(denoiser: Denoiser, mask_id: int | None) -> int:
    if mask_id is None:
        mask_id = getattr(denoiser, "mask_id", None)
    if mask_id is None:
        raise ValueError("give mask_id: the denoiser has no mask_id attribute")
    return int(mask_id)


def _length(denoiser: Denoiser, length: int | None) -> int:
    length = length or getattr(denoiser, "length", None)
    if not length:
        raise ValueError("give length: the denoiser has no length attribute")
    return int(length)


def guided_unmask(
    forward: Callable[[Tensor], Tensor],
    x: Tensor,
    masked: Tensor,
    reward: Callable[[Tensor], Tensor] | None,
    candidates: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """One unmasking step of every sequence: ``M = candidates`` proposals, valued by their argmax completion.

    ``x`` ``(R, L)`` holds letters where ``masked`` ``(R, L)`` is False; every row needs a masked position. Returns
    the new ``(x, masked)`` with exactly one position unmasked per row. ``forward`` gives logits over the valid
    letters only, so MASK is never drawn.

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> net = MaskedDenoiser(4, 8).eval()
        >>> x, masked = torch.full((3, 8), 4), torch.ones(3, 8, dtype=torch.bool)
        >>> x, masked = guided_unmask(lambda t: net(t), x, masked, lambda t: (t == 2).sum(1).float(), 4)
        >>> masked.sum(1).tolist()
        [7, 7, 7]
    """
    n, length = x.shape
    if candidates < 1:
        raise ValueError(f"candidates must be ≥ 1, got {candidates}")
    if not bool(masked.any(1).all()):
        raise ValueError("every sequence needs a masked position to unmask")
    if candidates > 1 and reward is None:
        raise ValueError("guided unmasking (candidates > 1) needs a reward")
    logits = forward(x)  # (R, L, V): the proposal forward
    # Each candidate its own random masked position: the argmax of uniform keys over the masked set.
    keys = torch.rand(n, candidates, length, generator=generator).to(x.device)
    pos = keys.masked_fill(~masked[:, None], -1.0).argmax(-1)  # (R, M)
    v = logits.shape[-1]
    probs = logits.gather(1, pos[..., None].expand(n, candidates, v)).softmax(-1)
    tok = torch.multinomial(probs.reshape(-1, v).cpu(), 1, generator=generator).view(n, candidates).to(x.device)
    cand = x[:, None].repeat(1, candidates, 1)
    cand.scatter_(2, pos[..., None], tok[..., None])
    rows = torch.arange(n, device=x.device)
    if candidates == 1:
        choice = torch.zeros(n, dtype=torch.long, device=x.device)
    else:
        still = masked[:, None].repeat(1, candidates, 1)
        still.scatter_(2, pos[..., None], False)
        flat, still = cand.reshape(n * candidates, length), still.reshape(n * candidates, length)
        completed = torch.where(still, forward(flat).argmax(-1), flat)  # the value forward: argmax completion
        values = reward(completed).view(n, candidates).nan_to_num(nan=-math.inf)
        choice = values.argmax(1)
    new_masked = masked.clone()
    new_masked[rows, pos[rows, choice]] = False
    return cand[rows, choice], new_masked


def _unmask_all(
    forward: Callable[[Tensor], Tensor],
    x: Tensor,
    masked: Tensor,
    reward: Callable[[Tensor], Tensor] | None,
    candidates: int,
    generator: torch.Generator | None,
) -> Tensor:
    counts = masked.sum(1)
    if not bool((counts == counts[0]).all()):
        raise ValueError("every sequence must have the same number of masked positions")
    for _ in range(int(counts[0])):
        x, masked = guided_unmask(forward, x, masked, reward, candidates, generator)
    return x


def _all_masked(n: int, length: int, mask_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    return torch.full((n, length), mask_id, device=device), torch.ones(n, length, dtype=torch.bool, device=device)


def _device(denoiser: Denoiser) -> torch.device:
    params = getattr(denoiser, "parameters", None)
    first = next(params(), None) if callable(params) else None
    return first.device if first is not None else torch.device("cpu")


def _design(x: Tensor, evaluate: Callable[[Tensor], Tensor], reward: CountedReward | None, forward: _Forward,
            n: int, start: float, **kwargs: list[float]) -> Design:  # fmt: skip
    scores = evaluate(x).float()
    calls = reward.calls / n if reward is not None else 0.0
    return Design(x, scores, calls, forward.rows / n, seconds=time.perf_counter() - start, **kwargs)


def _evaluator(reward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """The reward as the outputs' score: checked, NaN let through, outside the budget's count."""
    return CountedReward(reward, allow_nan=True)


def unguided(
    denoiser: Denoiser,
    n: int,
    reward: Callable[[Tensor], Tensor] | None = None,
    length: int | None = None,
    mask_id: int | None = None,
    n_valid: int | None = None,
    generator: torch.Generator | None = None,
    chunk: int = 4096,
) -> Design:
    """``n`` samples of the pretrained model, unmasked one random position at a time (no reward is called; a given
    ``reward`` only scores the outputs).

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> d = unguided(MaskedDenoiser(4, 8).eval(), 5, generator=torch.Generator().manual_seed(0))
        >>> d.sequences.shape, d.reward_calls, d.denoiser_calls
        (torch.Size([5, 8]), 0.0, 8.0)
    """
    start = time.perf_counter()
    length, mask_id = _length(denoiser, length), _mask_id(denoiser, mask_id)
    forward, device = _Forward(denoiser, n_valid), _device(denoiser)
    parts = []
    for lo in range(0, n, chunk):
        x, masked = _all_masked(min(chunk, n - lo), length, mask_id, device)
        parts.append(_unmask_all(forward, x, masked, None, 1, generator))
    x = torch.cat(parts)
    evaluate = _evaluator(reward) if reward is not None else (lambda t: torch.zeros(len(t)))
    return _design(x, evaluate, None, forward, n, start)


def best_of_n(
    denoiser: Denoiser,
    reward: Callable[[Tensor], Tensor],
    n: int,
    samples: int,
    length: int | None = None,
    mask_id: int | None = None,
    n_valid: int | None = None,
    generator: torch.Generator | None = None,
    chunk: int = 4096,
) -> Design:
    """For each of ``n`` outputs, the best of ``samples`` unguided samples (``samples`` reward calls each).

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> from zoo.models.reward_refine.rewards import MotifReward
        >>> d = best_of_n(MaskedDenoiser(4, 8).eval(), MotifReward(), 4, 10, generator=torch.Generator().manual_seed(0))
        >>> d.sequences.shape, d.reward_calls
        (torch.Size([4, 8]), 10.0)
    """
    start = time.perf_counter()
    counted = CountedReward(reward)
    length, mask_id = _length(denoiser, length), _mask_id(denoiser, mask_id)
    forward, device = _Forward(denoiser, n_valid), _device(denoiser)
    best_x = torch.zeros(n, length, dtype=torch.long, device=device)
    best_r = torch.full((n,), -math.inf, device=device)
    per_chunk = max(1, chunk // n)  # samples per output in one chunk
    for lo in range(0, samples, per_chunk):
        k = min(per_chunk, samples - lo)
        x, masked = _all_masked(n * k, length, mask_id, device)
        x = _unmask_all(forward, x, masked, None, 1, generator).view(n, k, length)
        r = counted(x.reshape(n * k, length)).view(n, k).nan_to_num(nan=-math.inf)
        top, idx = r.max(1)
        better = top > best_r
        best_x[better] = x[torch.arange(n, device=device), idx][better]
        best_r = torch.where(better, top, best_r)
    return _design(best_x, _evaluator(reward), counted, forward, n, start)


def svdd(
    denoiser: Denoiser,
    reward: Callable[[Tensor], Tensor],
    n: int,
    candidates: int,
    length: int | None = None,
    mask_id: int | None = None,
    n_valid: int | None = None,
    generator: torch.Generator | None = None,
) -> Design:
    """Single-shot value-based decoding (SVDD): ``n`` sequences unmasked from all masks with ``M = candidates``
    (``L · M`` reward calls each).

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> from zoo.models.reward_refine.rewards import MotifReward
        >>> d = svdd(MaskedDenoiser(4, 8).eval(), MotifReward(), 4, 3, generator=torch.Generator().manual_seed(0))
        >>> d.reward_calls, d.denoiser_calls
        (24.0, 32.0)
    """
    start = time.perf_counter()
    counted = CountedReward(reward)
    length, mask_id = _length(denoiser, length), _mask_id(denoiser, mask_id)
    forward = _Forward(denoiser, n_valid)
    x, masked = _all_masked(n, length, mask_id, _device(denoiser))
    x = _unmask_all(forward, x, masked, counted, candidates, generator)
    design = _design(x, _evaluator(reward), counted, forward, n, start)
    design.trajectory = [float(design.rewards.nanmean())]
    return design


def resample(
    population: Tensor, rewards: Tensor, alpha: float, generator: torch.Generator | None = None,
    scheme: str = "multinomial",
) -> tuple[Tensor, float]:  # fmt: skip
    """Importance resampling of the population with weights ``∝ exp(r / α)`` (NaN → weight 0). Returns the new
    population and the weights' effective sample size ``(Σw)² / Σw²``.

    ``scheme``: ``"multinomial"`` (the official ``Categorical`` draw) or ``"systematic"`` (lower variance).

    Example:
        >>> pop = torch.arange(4)[:, None].repeat(1, 3)
        >>> new, ess = resample(pop, torch.tensor([0.0, 0.0, 10.0, float("nan")]), 1.0, torch.Generator().manual_seed(0))
        >>> new[:, 0].tolist(), round(ess, 3)
        ([2, 2, 2, 2], 1.0)
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    r = rewards.double().cpu()
    finite = torch.isfinite(r)
    if not bool(finite.any()):
        raise ValueError("every reward is NaN: nothing to resample from")
    logw = torch.where(finite, r / alpha, torch.tensor(-math.inf, dtype=r.dtype))
    w = (logw - logw.max()).exp()
    ess = float(w.sum() ** 2 / (w**2).sum())
    n = len(population)
    if scheme == "multinomial":
        idx = torch.multinomial(w, n, replacement=True, generator=generator)
    elif scheme == "systematic":
        u = (torch.rand(1, generator=generator, dtype=r.dtype) + torch.arange(n, dtype=r.dtype)) / n
        idx = torch.searchsorted((w / w.sum()).cumsum(0), u).clamp(max=n - 1)
    else:
        raise ValueError(f"unknown resampling scheme {scheme!r}; choose multinomial or systematic")
    return population[idx.to(population.device)], ess


def remask(population: Tensor, positions: int, mask_id: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Mask ``positions`` uniformly random positions of every sequence (each its own). Returns ``(x, masked)``.

    Example:
        >>> x, masked = remask(torch.zeros(3, 10, dtype=torch.long), 4, 4, torch.Generator().manual_seed(0))
        >>> masked.sum(1).tolist(), int((x == 4).sum())
        ([4, 4, 4], 12)
    """
    n, length = population.shape
    if not 1 <= positions <= length:
        raise ValueError(f"re-mask between 1 and {length} positions, got {positions}")
    order = torch.rand(n, length, generator=generator).argsort(1)[:, :positions].to(population.device)
    masked = torch.zeros(n, length, dtype=torch.bool, device=population.device)
    masked.scatter_(1, order, True)
    return population.masked_fill(masked, mask_id), masked


def refine_budget(length: int, init_candidates: int, rounds: int, positions: int, candidates: int,
                  seeded: bool = False) -> int:  # fmt: skip
    """Reward calls per sequence of :func:`refine`: the SVDD pass (``L · M₀``, none from seed designs), then per
    round one scoring for resampling plus ``E · M`` for the guided re-unmasking (none when ``M = 1``).

    Example:
        >>> refine_budget(32, 4, 10, 8, 4)  # the card's 448 plus the 10 resampling scorings (review)
        458
    """
    init = 0 if seeded else length * (init_candidates if init_candidates > 1 else 0)
    return init + rounds * (1 + (positions * candidates if candidates > 1 else 0))


def rounds_for_budget(budget: int, length: int, init_candidates: int, positions: int, candidates: int,
                      seeded: bool = False) -> int:  # fmt: skip
    """The most refinement rounds that fit in ``budget`` reward calls per sequence (an error below one round).

    Example:
        >>> rounds_for_budget(458, 32, 4, 8, 1)  # GA (unguided re-unmasking) at RERD's budget
        330
    """
    init = refine_budget(length, init_candidates, 0, positions, candidates, seeded)
    per_round = refine_budget(length, init_candidates, 1, positions, candidates, seeded) - init
    if budget < init + per_round:
        raise ValueError(
            f"a budget of {budget} reward calls per sequence is smaller than one round: the initial pass takes {init} "
            f"and each round {per_round} (1 scoring + {positions} positions × {candidates} candidates)"
        )
    return (budget - init) // per_round


def refine(
    denoiser: Denoiser,
    reward: Callable[[Tensor], Tensor],
    n: int,
    rounds: int = 10,
    positions: int = 8,
    candidates: int = 4,
    init_candidates: int = 4,
    alpha: float = 0.2,
    init: Tensor | None = None,
    scheme: str | None = "multinomial",
    length: int | None = None,
    mask_id: int | None = None,
    n_valid: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    budget: int | None = None,
) -> Design:
    """Reward-guided iterative refinement (RERD): an SVDD pass, then ``rounds`` of resample, re-mask, re-unmask.

    Each round scores the population, resamples it by ``exp(r / α)`` (``scheme=None`` keeps it as it is),
    re-masks ``positions`` uniformly random positions per sequence (K/T = positions / L) and unmasks them again with
    the guided step (``candidates`` per position; 1 is the GA ablation: unguided diffusion mutations plus
    selection). ``init`` (sequences ``(n, L)``, or one ``(L,)`` repeated) starts from seed designs instead of the
    SVDD pass (the official ``..._edit_initial``). ``budget`` (reward calls per sequence) sets ``rounds`` to as
    many as it pays for (:func:`rounds_for_budget`; an error below one round).

    ``alpha``: the official code's ``exp(5·r)``, α = 0.2, set for protein rewards in [0, 1]. The weights depend on
    the reward's scale: :attr:`Design.ess` reports each round's effective sample size, so a collapse to one
    ancestor (ESS ≈ 1) or no selection at all (ESS ≈ n) shows.

    Example:
        >>> from zoo.models.reward_refine.denoiser import MaskedDenoiser
        >>> from zoo.models.reward_refine.rewards import MotifReward
        >>> d = refine(MaskedDenoiser(4, 8).eval(), MotifReward(), 6, rounds=2, positions=2, candidates=2,
        ...            init_candidates=2, generator=torch.Generator().manual_seed(0))
        >>> d.reward_calls == refine_budget(8, 2, 2, 2, 2), len(d.trajectory), len(d.ess)
        (True, 3, 2)
    """
    start = time.perf_counter()
    counted = CountedReward(reward)
    length, mask_id = _length(denoiser, length), _mask_id(denoiser, mask_id)
    if budget is not None:
        rounds = rounds_for_budget(budget, length, init_candidates, positions, candidates, seeded=init is not None)
    forward, device = _Forward(denoiser, n_valid), _device(denoiser)
    evaluate = _evaluator(reward)
    if init is None:
        x, masked = _all_masked(n, length, mask_id, device)
        x = _unmask_all(forward, x, masked, counted if init_candidates > 1 else None, init_candidates, generator)
    else:
        x = (init[None].expand(n, -1) if init.dim() == 1 else init).to(device).long().clone()
        if x.shape != (n, length):
            raise ValueError(f"init must be ({n}, {length}) or ({length},) seed designs, got {tuple(init.shape)}")
    trajectory, ess = [float(evaluate(x).nanmean())], []
    steps = range(rounds)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="refine", unit="round")
    for _ in steps:
        if scheme is not None:
            x, e = resample(x, counted(x), alpha, generator, scheme)
            ess.append(e)
        x, masked = remask(x, positions, mask_id, generator)
        x = _unmask_all(forward, x, masked, counted if candidates > 1 else None, candidates, generator)
        trajectory.append(float(evaluate(x).nanmean()))
    return _design(x, evaluate, counted, forward, n, start, trajectory=trajectory, ess=ess)
