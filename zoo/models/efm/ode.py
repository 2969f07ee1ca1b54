"""Moving samples along field lines with z as the clock: dx/dz = f_x / f_z (EFM card §2.5, poster Algorithm 2)."""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["FieldFn", "Transport", "require_finite", "transport"]

#: ``field(x, z) -> (f_x, f_z)`` with ``x`` ``(n, ...)``, ``z`` ``(n,)``, ``f_x`` shaped like ``x``, ``f_z`` ``(n,)``.
FieldFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


class Transport(NamedTuple):
    """The end points of the field lines and how well the z-clock held along them.

    ``clamped_fraction`` is the fraction of (particle, evaluation) pairs where f_z < ``min_fz`` (the line turned back
    or ran parallel to the plates, so z stops being a valid clock and the step was clamped); ``lines_clamped`` the
    fraction of particles clamped at least once; ``nfe`` the number of field evaluations. With the behind-plate
    continuation, ``lines_behind`` is the fraction of lines that crossed the target plane and were followed behind
    it, ``lines_lost`` the fraction of those that had not come back after the step budget (left at the plane).
    """

    x: Tensor
    clamped_fraction: float
    lines_clamped: float
    nfe: int
    lines_behind: float = 0.0
    lines_lost: float = 0.0


def require_finite(x: Tensor, what: str, purpose: str = "EFM transports finite samples only") -> None:
    """Refuse ``x`` with one line if any of its rows holds NaN or inf.

    A non-finite sample does not fail anywhere downstream: it turns its own line (transport) or the whole batch's
    Monte-Carlo field (training) into NaN, silently. One reduction and one host sync per call; the rows are only
    counted once the check has failed.
    """
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = int((~finite.reshape(len(x), -1).all(dim=1)).sum())
        raise ValueError(f"{what} has {bad} non-finite row(s) (NaN or inf); {purpose}")


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
    behind_steps: int = 0,
    behind_step: float = 0.2,
    probe: float = 0.05,
) -> Transport:
    """Integrate the field lines through ``x`` from the plane ``z_start`` to ``z_end`` (either direction).

    ``f_x / f_z`` is used as it is: the field's norm carries no information (the target is unit-normalised) and
    re-normalising before the division would change nothing but the rounding. ``"euler"`` takes ``steps`` equal steps
    in z (the paper's sampler); ``"rk45"`` is SciPy's adaptive Dormand–Prince with ``rtol``/``atol`` (the official
    code's alternative; torchdiffeq is not a dependency and SciPy already is).

    Lines that reach the target plane where the plate carries little charge pass through it, loop behind it and
    land on its back side (the theorem counts them; the official toy solver follows them). With ``behind_steps > 0``
    the field is probed ``probe`` past the plane; lines it still pushes onward are followed with fixed-length steps
    ``behind_step`` along f/‖f‖ in the full (x, z) space until they come back to within ``probe`` of the plane (the
    official toy solver stops at L + 0.05; the end point is the linear interpolation at that level), for at most
    ``behind_steps`` steps.

    An ``x`` with a NaN or inf row is refused (``ValueError``): its line would come back NaN without a word. The
    field's output is not checked per step, which would cost a host sync in every step of the loop.

    Example:
        >>> straight = lambda x, z: (torch.ones_like(x), torch.ones_like(z))  # lines at 45 degrees
        >>> out = transport(straight, torch.zeros(4, 2), 0.0, 2.0, steps=4)
        >>> out.x[0], out.clamped_fraction
        (tensor([2., 2.]), 0.0)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    # Checked once here, not on the field's output per step: that would add a host sync to every step of the loop.
    require_finite(x, "the input x")
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
    clamped_fraction = float(clamped.sum()) / (n * nfe)
    lines_clamped = float((clamped > 0).float().mean())
    behind = lost = 0.0
    if behind_steps > 0:
        x, behind, lost, extra = _behind_plate(
            field, x, z_end, 1.0 if z_end >= z_start else -1.0, behind_steps, behind_step, probe
        )
        nfe += extra
    return Transport(x, clamped_fraction, lines_clamped, nfe, behind, lost)


def _behind_plate(
    field: FieldFn, x: Tensor, plane: float, sign: float, max_steps: int, step: float, probe: float
) -> tuple[Tensor, float, float, int]:
    """Follow the lines that pass through the plane z = ``plane`` until they come back; see ``transport``."""
    n = len(x)
    # A line is back when it re-enters the probe band: a learned field is smooth across the plate, so right behind
    # its charges it still points away, and lines would hover there instead of crossing the plane itself.
    landing = plane + sign * probe
    z = torch.full((n,), landing, dtype=x.dtype, device=x.device)
    _, f_z = field(x, z)
    # A line travels along sign·f (the Euler steps move by dz·f/f_z with f_z > 0), so it keeps going away from the
    # plane, in either direction, exactly where f_z > 0.
    idx = (f_z > 0).nonzero().squeeze(1)
    behind, x = len(idx) / n, x.clone()
    xs, zs = x[idx], z[idx]
    nfe = 1
    for _ in range(max_steps):
        if len(idx) == 0:
            break
        f_x, f_z = field(xs, zs)
        nfe += 1
        norm = (f_x.reshape(len(xs), -1).square().sum(1) + f_z.square()).sqrt().clamp_min(1e-12)
        scale = sign * step / norm
        x_new = xs + scale.reshape(-1, *([1] * (xs.ndim - 1))) * f_x
        z_new = zs + scale * f_z
        back = sign * (z_new - landing) <= 0
        if back.any():
            t = ((zs[back] - landing) / (zs[back] - z_new[back])).reshape(-1, *([1] * (xs.ndim - 1)))
            x[idx[back]] = xs[back] + t * (x_new[back] - xs[back])
        keep = ~back
        idx, xs, zs = idx[keep], x_new[keep], z_new[keep]
    return x, behind, len(idx) / n, nfe
