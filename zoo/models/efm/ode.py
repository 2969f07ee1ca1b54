"""Moving samples along field lines with z as the clock: dx/dz = f_x / f_z (EFM card §2.5, poster Algorithm 2)."""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["FieldFn", "Transport", "transport"]

#: ``field(x, z) -> (f_x, f_z)`` with ``x`` ``(n, ...)``, ``z`` ``(n,)``, ``f_x`` shaped like ``x``, ``f_z`` ``(n,)``.
FieldFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


class Transport(NamedTuple):
    """The end points of the field lines and how well the z-clock held along them.

    ``clamped_fraction`` is the fraction of (particle, evaluation) pairs where f_z < ``min_fz`` (the line turned back
    or ran parallel to the plates, so z stops being a valid clock and the step was clamped); ``lines_clamped`` the
    fraction of particles clamped at least once; ``nfe`` the number of field evaluations.
    """

    x: Tensor
    clamped_fraction: float
    lines_clamped: float
    nfe: int


@torch.no_grad()
def transport(
    field: FieldFn,
    x: Tensor,
    z_start: float,
    z_end: float,
    steps: int = 100,
    method: Literal["euler", "rk45"] = "euler",
    min_fz: float = 1e-3,
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> Transport:
    """Integrate the field lines through ``x`` from the plane ``z_start`` to ``z_end`` (either direction).

    ``f_x / f_z`` is used as it is: the field's norm carries no information (the target is unit-normalised) and
    re-normalising before the division would change nothing but the rounding. ``"euler"`` takes ``steps`` equal steps
    in z (the paper's sampler); ``"rk45"`` is SciPy's adaptive Dormand–Prince with ``rtol``/``atol`` (the official
    code's alternative; torchdiffeq is not a dependency and SciPy already is).

    Example:
        >>> straight = lambda x, z: (torch.ones_like(x), torch.ones_like(z))  # lines at 45 degrees
        >>> out = transport(straight, torch.zeros(4, 2), 0.0, 2.0, steps=4)
        >>> out.x[0], out.clamped_fraction
        (tensor([2., 2.]), 0.0)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n = len(x)
    clamped = torch.zeros(n, dtype=torch.long, device=x.device)

    def slope(x: Tensor, z: float) -> Tensor:
        nonlocal clamped
        f_x, f_z = field(x, torch.full((n,), z, dtype=x.dtype, device=x.device))
        low = f_z < min_fz
        clamped = clamped + low
        return f_x / f_z.clamp_min(min_fz).reshape(-1, *([1] * (x.ndim - 1)))

    if method == "euler":
        dz = (z_end - z_start) / steps
        for k in range(steps):
            x = x + dz * slope(x, z_start + k * dz)
        nfe = steps
    elif method == "rk45":
        from scipy.integrate import solve_ivp

        shape, dtype, device = x.shape, x.dtype, x.device

        def rhs(z: float, y: np.ndarray) -> np.ndarray:
            state = torch.from_numpy(y).to(device=device, dtype=dtype).reshape(shape)
            return slope(state, float(z)).reshape(-1).double().cpu().numpy()

        sol = solve_ivp(
            rhs, (z_start, z_end), x.reshape(-1).double().cpu().numpy(), method="RK45", rtol=rtol, atol=atol
        )
        if not sol.success:
            raise RuntimeError(f"the adaptive solver failed: {sol.message}")
        x = torch.from_numpy(sol.y[:, -1]).to(device=device, dtype=dtype).reshape(shape)
        nfe = int(sol.nfev)
    else:
        raise ValueError(f"unknown method {method!r}; choose 'euler' or 'rk45'")
    clamped = clamped.float()
    return Transport(x, float(clamped.sum()) / (n * nfe), float((clamped > 0).float().mean()), nfe)
