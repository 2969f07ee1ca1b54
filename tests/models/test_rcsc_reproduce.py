"""Tests of the RCSC reproduction's arms (the run itself is the contract test's): every arm a claim names is run, the
ablations remove what they say, the equal-energy concatenation by hand, and the slope helper."""

from __future__ import annotations

import numpy as np
import torch

from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import solver as S
from zoo.models.rcsc.evaluation import loglog_slope
from zoo.models.rcsc.reproduce import ARMS, CHECKS, CLAIMS, SOLVER, VARIANTS, _equal_energy


def test_rcsc_reproduce_every_claim_names_arms_the_run_has() -> None:
    """Check that each claim's method and stand-ins are arms of the run, and names are unique."""
    for claim in CLAIMS:
        assert claim.method in ARMS, claim.name
        assert set(claim.all_stand_ins) <= set(ARMS) | {"spectral-dense"}, claim.name
    names = [c.name for c in CLAIMS] + [c.name for c in CHECKS]
    assert len(names) == len(set(names))


def test_rcsc_ablations_remove_what_they_say() -> None:
    """Check the ablation arms: uniform-alpha keeps α at 1/V, no-simplex leaves the simplex, beta0 never switches the
    partition on, mapstd leaves the views unscaled."""
    views, _ = synthetic_views(n_per=30, n_clusters=5, noise_dim=40, seed=0)
    fit = {arm: S.RCSC(**SOLVER, **VARIANTS[arm], warmup=2, max_iter=6, seed=0).fit(views) for arm in VARIANTS}
    assert torch.allclose(fit["uniform-alpha"].alpha_, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert float(fit["no-simplex"].Z_.min()) < -1e-6 or float((fit["no-simplex"].Z_.sum(0) - 1).abs().max()) > 1e-6
    assert fit["beta0"].state_.G is None and fit["rcsc"].state_.G is not None
    assert fit["mapstd"].view_scales(views) == [1.0, 1.0, 1.0] and fit["rcsc"].view_scales(views)[2] < 0.2


def test_equal_energy_concatenation_by_hand() -> None:
    """Check the alternative's features: each standardised view divided by √(its width), so every view carries the
    same total energy (n − 1, with ddof-1 standardisation)."""
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(20, 4, generator=g), torch.randn(20, 100, generator=g)]
    x = _equal_energy(views)
    assert x.shape == (20, 104)
    np.testing.assert_allclose([float((x[:, :4] ** 2).sum()), float((x[:, 4:] ** 2).sum())], [19.0, 19.0])


def test_rcsc_reproduce_loglog_slope_recovers_power_laws() -> None:
    """Check that the log-log slope is 1 for linear and 2 for quadratic costs."""
    ns = [1500, 3000, 6000, 12000]
    assert abs(loglog_slope(ns, [0.001 * n for n in ns]) - 1.0) < 1e-9
    assert abs(loglog_slope(ns, [1e-7 * n**2 for n in ns]) - 2.0) < 1e-9
