"""Tests of the RCSC reproduction's claim set (the run itself is the contract test's): every arm a claim names is run,
the stand-ins are what they say (0 iterations leaves the initial objective and uniform α), and the slope helper."""

from __future__ import annotations

import torch

from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import solver as S
from zoo.models.rcsc.reproduce import ARMS, CHECKS, CLAIMS, VARIANTS, _solver_metrics, loglog_slope


def test_rcsc_reproduce_every_claim_names_arms_the_run_has() -> None:
    """Check that each claim's method and stand-ins are arms of the run (quick too), and names are unique."""
    for claim in CLAIMS:
        assert claim.method in ARMS, claim.name
        assert claim.stand_ins and set(claim.stand_ins) <= set(ARMS), claim.name
    names = [c.name for c in CLAIMS] + [c.name for c in CHECKS]
    assert len(names) == len(set(names))


def test_rcsc_reproduce_iter0_stand_in_has_no_objective_drop_and_uniform_alpha() -> None:
    """Check that the 0-iteration stand-in keeps the initial objective and uniform α, while a short fit moves both."""
    views, y = synthetic_views(n_per=30, n_clusters=5, noise_dim=40, seed=0)
    solver = {"n_clusters": 5, "n_anchors": 15, "latent_dim": 5}
    iter0 = _solver_metrics(S.RCSC(**solver, **VARIANTS["rcsc-iter0"], seed=0).fit(views), y, 0.0)
    assert iter0["obj_drop"] == 0.0 and iter0["alpha_shift"] < 1e-12
    fitted = _solver_metrics(S.RCSC(**solver, warmup=3, max_iter=6, seed=0).fit(views), y, 0.0)
    assert fitted["obj_drop"] > 0.1 and fitted["alpha_shift"] > 0.05
    assert fitted["beta0_max_rise"] <= 1e-9 and "agreement_nmi" in fitted


def test_rcsc_reproduce_loglog_slope_recovers_power_laws() -> None:
    """Check that the log-log slope is 1 for linear and 2 for quadratic costs."""
    ns = [1500, 3000, 6000, 12000]
    assert abs(loglog_slope(ns, [0.001 * n for n in ns]) - 1.0) < 1e-9
    assert abs(loglog_slope(ns, [1e-7 * n**2 for n in ns]) - 2.0) < 1e-9
    assert torch.isfinite(torch.tensor(loglog_slope(ns[:2], [0.5, 1.1])))
