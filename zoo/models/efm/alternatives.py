"""The non-learned stand-ins of the EFM reproduction: the Gaussian optimal-transport map, the exact assignment to
fresh samples of Q, and snapping the lines that cross the target plate to the nearest sample of Q."""

from __future__ import annotations

import ot
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from zoo.models.efm.ode import FieldFn

__all__ = ["assign", "gaussian_ot_map", "snap_crossing"]

def gaussian_ot_map(x: Tensor, p: Tensor, q: Tensor) -> Tensor:
    """``x`` through the optimal-transport map between the Gaussian fits of the samples ``p`` and ``q``.

    T(x) = μ_q + A(x − μ_p), A = Σ_p^{-1/2}(Σ_p^{1/2} Σ_q Σ_p^{1/2})^{1/2} Σ_p^{-1/2}, the Monge map between two
    Gaussians, from POT (``ot.gaussian.bures_wasserstein_mapping``) on the samples' means and unbiased covariances,
    in float64.

    Example:
        >>> p = torch.tensor([[1.0, 0], [-1, 0], [0, 1], [0, -1]])
        >>> gaussian_ot_map(torch.tensor([[1.0, 1.0]]), p, torch.tensor([[2.0, 0], [-2, 0], [0, 0.5], [0, -0.5]]))
        tensor([[2.0000, 0.5000]])
    """
    p, q = p.double(), q.double()
    a, b = ot.gaussian.bures_wasserstein_mapping(p.mean(0), q.mean(0), torch.cov(p.T), torch.cov(q.T))
    return (x.double() @ a + b).to(x.dtype)


def assign(x: Tensor, q: Tensor) -> Tensor:
    """Row i of ``x`` sent to its partner among the rows of ``q`` in the exact assignment minimising the total squared
    distance (SciPy's ``linear_sum_assignment``): the discrete optimal-transport map between two equal-size samples.

    Example:
        >>> assign(torch.tensor([[0.0, 0.0], [10.0, 0.0]]), torch.tensor([[9.0, 0.0], [1.0, 0.0]]))
        tensor([[1., 0.],
                [9., 0.]])
    """
    if len(x) != len(q):
        raise ValueError(f"assign needs as many rows in q as in x, got {len(q)} and {len(x)}")
    rows, cols = linear_sum_assignment(torch.cdist(x.double(), q.double()).square().numpy())
    return q[torch.from_numpy(cols[rows.argsort()])]


def snap_crossing(field: FieldFn, x: Tensor, pool: Tensor, plane: float, probe: float) -> Tensor:
    """Lines stopped at the plane that would pass through it (f_z > 0 at ``plane + probe``, the continuation's own
    test) sent to the nearest sample of ``pool``: the cheap fix a practitioner tries instead of following them.

    Example:
        >>> up = lambda x, z: (torch.zeros_like(x), torch.where(x[:, 0] > 0, 1.0, -1.0))  # only x₁ > 0 crosses
        >>> x, pool = torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), torch.tensor([[4.0, 0.0], [-4.0, 0.0]])
        >>> snap_crossing(up, x, pool, plane=6.0, probe=0.3)
        tensor([[ 4.,  0.],
                [-1.,  0.]])
    """
    _, f_z = field(x, torch.full((len(x),), plane + probe, dtype=x.dtype))
    cross = f_z > 0
    out = x.clone()
    if bool(cross.any()):
        out[cross] = pool[torch.cdist(x[cross], pool).argmin(dim=1)]
    return out
