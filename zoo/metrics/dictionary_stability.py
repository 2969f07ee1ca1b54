"""Dictionary stability (Fel et al., ICML 2025, RA-SAE §3): mean signed cosine of Hungarian-matched atoms.

Two dictionaries ``D (k, d)`` and ``D_ref (k', d)`` are compared up to a permutation of their atoms:

1. L2-normalise every row (``+ eps``, so an all-zero row has cosine 0 with everything instead of NaN);
2. build the cost ``M_ij = 1 - cos(D_i, D_ref_j)`` (signed cosine: an atom and its negation are *not* alike);
3. solve the assignment ``pi = argmin sum_i M_{i, pi(i)}`` (``scipy.optimize.linear_sum_assignment``);
4. stability ``= 1 - mean_i M_{i, pi(i)}``, the mean matched cosine, in ``[-1, 1]``; 1 means equal up to a
   permutation and a positive rescaling of the atoms.

With ``k != k'`` the assignment matches ``min(k, k')`` pairs and the mean is taken over those. The official
``overcomplete.metrics.cosine_hungarian_loss`` returns the summed cost, so stability ``= 1 - loss / k``.

Cost: the Hungarian solve is O(k³) time and the float64 cost matrix k·k' · 8 bytes (8 GB at k = 32,000).
Match a random subset of atoms for large dictionaries (``callbacks.SAEStability`` does, see ``max_atoms``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor
from torchmetrics import Metric

__all__ = [
    "DictionaryStability",
    "dictionary_stability",
    "matched_permutation",
    "stability_floor_gaussian",
    "stability_floor_points",
]


def _check_dictionaries(D: Tensor, D_ref: Tensor) -> None:
    if not isinstance(D, Tensor) or not isinstance(D_ref, Tensor):
        raise TypeError(f"Expected D and D_ref to be tensors, got {type(D).__name__} and {type(D_ref).__name__}.")
    if D.ndim != 2 or D_ref.ndim != 2 or D.shape[1] != D_ref.shape[1]:
        raise ValueError(
            f"Expected D (k, d) and D_ref (k', d) with the same width d, got {tuple(D.shape)} and "
            f"{tuple(D_ref.shape)}. Pass dictionaries with one atom per row (transpose a (d, k) decoder weight)."
        )


def _restrict(D: Tensor, alive: Tensor | None, name: str) -> Tensor:
    if alive is None:
        return D
    if not isinstance(alive, Tensor) or alive.dtype != torch.bool or alive.shape != (D.shape[0],):
        shape = tuple(alive.shape) if isinstance(alive, Tensor) else type(alive).__name__
        dtype = alive.dtype if isinstance(alive, Tensor) else None
        raise ValueError(
            f"Expected `{name}` to be a bool tensor of shape ({D.shape[0]},), got {shape} ({dtype}). "
            "Pass DeadAtomFraction.alive() of the matching dictionary."
        )
    return D[alive.to(D.device)]


def _cosine_matrix(D: Tensor, D_ref: Tensor, eps: float) -> np.ndarray:
    """``cos(D_i, D_ref_j)`` as a float64 numpy array ``(k, k')``, the form the Hungarian solver takes."""
    # float64 on cpu: the solver needs a cpu array anyway, and float32 cosines of near-identical atoms tie.
    A = D.detach().to("cpu", torch.float64)
    B = D_ref.detach().to("cpu", torch.float64)
    if not (torch.isfinite(A).all() and torch.isfinite(B).all()):
        raise ValueError("D or D_ref contains NaN or inf; linear_sum_assignment cannot match such atoms.")
    # The official helper divides by the bare norm: a zero row (n' < k, a collapsed atom) gives NaN there.
    A = A / (A.norm(dim=1, keepdim=True) + eps)
    B = B / (B.norm(dim=1, keepdim=True) + eps)
    return (A @ B.T).numpy()


def _match(cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Minimising sum(1 - cos) over assignments is maximising the summed signed cosine.
    return linear_sum_assignment(1.0 - cos)


def _stability_update(
    D: Tensor, D_ref: Tensor, alive: Tensor | None, alive_ref: Tensor | None, eps: float
) -> tuple[float, int]:
    """Sum of the matched cosines and the number of matched pairs (shared by the function and the Metric)."""
    _check_dictionaries(D, D_ref)
    A, B = _restrict(D, alive, "alive"), _restrict(D_ref, alive_ref, "alive_ref")
    if A.shape[0] == 0 or B.shape[0] == 0:
        raise ValueError(
            f"Expected at least one (alive) atom on each side, got {A.shape[0]} in D and {B.shape[0]} in D_ref. "
            "Stability is undefined without atoms to match."
        )
    cos = _cosine_matrix(A, B, eps)
    rows, cols = _match(cos)
    return float(cos[rows, cols].sum()), len(rows)


def _check_eps(eps: float) -> None:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"Expected argument `eps` to be a positive float but got {eps!r}.")


def dictionary_stability(
    D: Tensor, D_ref: Tensor, alive: Tensor | None = None, alive_ref: Tensor | None = None, eps: float = 1e-8
) -> Tensor:
    """Stability of ``D`` against ``D_ref``: the mean signed cosine between Hungarian-matched atoms.

    Args:
        D: dictionary, ``(k, d)``, one atom per row.
        D_ref: reference dictionary, ``(k', d)``; ``k'`` may differ from ``k`` (``min(k, k')`` pairs are matched).
        alive: optional bool mask ``(k,)`` of the atoms of ``D`` to keep (for example atoms that fired); the
            others are dropped before matching.
        alive_ref: the same for ``D_ref``, ``(k',)``.
        eps: added to the row norms; an all-zero row then has cosine 0 with every atom instead of NaN.

    Returns:
        0-d float tensor in ``[-1, 1]`` on ``D``'s device: the mean matched cosine over ``min(#alive, #alive_ref)``
        pairs.

    Raises:
        ValueError: ``D`` and ``D_ref`` are not 2-D with the same width, a mask has the wrong shape or dtype, no
            atom is left on one side, or an entry is NaN/inf.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> D = torch.randn(6, 4, generator=g)
        >>> perm = torch.randperm(6, generator=g)
        >>> dictionary_stability(D, 3.0 * D[perm])  # equal up to a permutation and a positive scale
        tensor(1.)
        >>> round(float(dictionary_stability(D, torch.randn(6, 4, generator=g))), 2) < 1.0
        True
    """
    _check_eps(eps)
    total, n = _stability_update(D, D_ref, alive, alive_ref, eps)
    dtype = D.dtype if D.is_floating_point() else torch.get_default_dtype()
    return torch.tensor(total / n, dtype=dtype, device=D.device)


def matched_permutation(D: Tensor, D_ref: Tensor, eps: float = 1e-8) -> Tensor:
    """For each atom of ``D``, the index of the atom of ``D_ref`` it is matched to (the stability's assignment).

    ``D_ref[matched_permutation(D, D_ref)]`` puts the reference atoms in ``D``'s order, to compare or plot them
    side by side. With ``k > k'`` some atoms of ``D`` stay unmatched and get ``-1``.

    Args:
        D: dictionary, ``(k, d)``.
        D_ref: reference dictionary, ``(k', d)``.
        eps: added to the row norms (see :func:`dictionary_stability`).

    Returns:
        long tensor ``(k,)`` on ``D``'s device, values in ``[0, k')`` (or ``-1`` when unmatched).

    Example:
        >>> D = torch.eye(3)
        >>> matched_permutation(D, D[[2, 0, 1]])  # row 0 of D is row 1 of D_ref, ...
        tensor([1, 2, 0])
    """
    _check_eps(eps)
    _check_dictionaries(D, D_ref)
    rows, cols = _match(_cosine_matrix(D, D_ref, eps))
    index = torch.full((D.shape[0],), -1, dtype=torch.long)
    index[torch.from_numpy(rows)] = torch.from_numpy(cols).long()
    return index.to(D.device)


def stability_floor_gaussian(k: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """Stability of two independent Gaussian dictionaries ``(k, d)``: the chance level ("Gaussian floor").

    Any trained dictionary should score well above it; it rises towards 1 as ``k`` grows against ``d``, since
    the matching then has more atoms to choose from in a small space.

    Args:
        k: number of atoms.
        d: width.
        generator: cpu random generator, for a reproducible floor.

    Example:
        >>> floor = stability_floor_gaussian(64, 32, torch.Generator().manual_seed(0))
        >>> 0.0 < float(floor) < 0.6
        True
    """
    for name, value in (("k", k), ("d", d)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Expected argument `{name}` to be a positive int but got {value!r}.")
    D = torch.randn(k, d, generator=generator)
    D_ref = torch.randn(k, d, generator=generator)
    return dictionary_stability(D, D_ref)


def stability_floor_points(x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Stability of two disjoint random draws of ``k`` rows of ``x``: the "random data points" floor.

    A dictionary that merely copies data points scores about this much, which is high for clustered data (the
    card measured 0.90–0.93 on its toy); report it next to the stability of any data-initialised dictionary.

    Args:
        x: data, ``(n, d)`` with ``n >= 2k``.
        k: number of atoms per draw.
        generator: cpu random generator, for reproducible draws.

    Raises:
        ValueError: ``x`` is not 2-D or has fewer than ``2k`` rows.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(100, 8, generator=g) + 3.0  # off-centre data: points share a direction
        >>> float(stability_floor_points(x, 10, g)) > 0.8
        True
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"Expected argument `k` to be a positive int but got {k!r}.")
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[0] < 2 * k:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"Expected x of shape (n, d) with n >= 2k = {2 * k} rows, got {shape}. Collect more data points or lower k."
        )
    index = torch.randperm(x.shape[0], generator=generator)[: 2 * k].to(x.device)
    return dictionary_stability(x[index[:k]], x[index[k:]])


class DictionaryStability(Metric):
    """Mean matched cosine over one or several dictionary pairs (RA-SAE stability, :func:`dictionary_stability`).

    ``update(D, D_ref)`` adds the sum of the matched cosines of one pair and its number of matched pairs;
    ``compute()`` divides, so pairs of equal size are averaged (the card's "average over all seed pairs") and
    larger pairs weigh more. Both states are fixed-size sums, so the DDP sync is two scalars. The Hungarian
    solve runs on cpu in ``update``.

    Args:
        eps: added to the row norms; an all-zero row has cosine 0 with every atom instead of NaN.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> D = torch.randn(6, 4, generator=g)
        >>> m = DictionaryStability()
        >>> m.update(D, D.flip(0))        # 6 pairs, cosine 1 each
        >>> m.update(D[:1], -D[:1])       # 1 pair, cosine -1
        >>> round(float(m.compute()), 4)  # (6 - 1) / 7
        0.7143
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    cosine_sum: Tensor
    num_pairs: Tensor

    def __init__(self, eps: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check_eps(eps)
        self.eps = eps
        self.add_state("cosine_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("num_pairs", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, D: Tensor, D_ref: Tensor, alive: Tensor | None = None, alive_ref: Tensor | None = None) -> None:
        """Add one pair: ``D (k, d)``, ``D_ref (k', d)``, optional bool masks ``alive (k,)``, ``alive_ref (k',)``."""
        total, n = _stability_update(D, D_ref, alive, alive_ref, self.eps)
        self.cosine_sum += total
        self.num_pairs += n

    def compute(self) -> Tensor:
        """The mean matched cosine, in ``[-1, 1]``."""
        return self.cosine_sum / self.num_pairs
