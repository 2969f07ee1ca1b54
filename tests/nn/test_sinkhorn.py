"""The batched log-domain Sinkhorn against POT: marginals, the entropic plan, the cost near the exact EMD, masking and
the unbalanced relaxation."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from zoo.nn.sinkhorn import sinkhorn


def _problem(seed: int, n: int = 10, m: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cost = torch.rand(n, m, generator=g, dtype=torch.float64)
    a = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    b = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    return cost, a / a.sum(), b / b.sum()


def test_balanced_marginals_hold_within_1e3_after_500_iterations():
    cost, a, b = _problem(0)
    _, plan = sinkhorn(cost.float(), a.float(), b.float(), eps=0.02, iterations=500)
    assert (plan.sum(-1) - a.float()).abs().max() < 1e-3
    assert (plan.sum(-2) - b.float()).abs().max() < 1e-3


@pytest.mark.parametrize("seed", range(5))
def test_plan_matches_pot_sinkhorn_log(seed):
    cost, a, b = _problem(seed)
    _, plan = sinkhorn(cost, a, b, eps=0.05, iterations=2000)
    reference = ot.sinkhorn(a.numpy(), b.numpy(), cost.numpy(), reg=0.05, method="sinkhorn_log", numItermax=2000,
                            stopThr=1e-12)  # fmt: skip
    np.testing.assert_allclose(plan.numpy(), reference, atol=1e-6)


@pytest.mark.parametrize("seed", range(20))
def test_cost_within_3_percent_of_the_exact_emd_at_small_eps(seed):
    # the card's unit check: ε = 0.005, 2,000 iterations, random 10 x 8 costs in [0, 1]
    cost, a, b = _problem(seed)
    value, _ = sinkhorn(cost, a, b, eps=0.005, iterations=2000)
    exact = ot.emd2(a.numpy(), b.numpy(), cost.numpy())
    assert abs(float(value) - exact) <= 0.03 * exact


def test_batched_equals_one_by_one():
    problems = [_problem(s) for s in range(4)]
    cost = torch.stack([p[0] for p in problems])
    a, b = torch.stack([p[1] for p in problems]), torch.stack([p[2] for p in problems])
    batched, _ = sinkhorn(cost, a, b, eps=0.05, iterations=300)
    single = torch.stack([sinkhorn(c, x, y, eps=0.05, iterations=300)[0] for c, x, y in problems])
    torch.testing.assert_close(batched, single)


def test_zero_mass_entries_are_the_problem_without_them():
    cost, a, b = _problem(1)
    a_masked, b_masked = torch.cat([a, torch.zeros(3, dtype=a.dtype)]), torch.cat([b, torch.zeros(2, dtype=b.dtype)])
    padded = torch.nn.functional.pad(cost, (0, 2, 0, 3), value=0.0)  # free to move mass there, were it counted
    value, plan = sinkhorn(padded, a_masked, b_masked, eps=0.05, iterations=500)
    expected, _ = sinkhorn(cost, a, b, eps=0.05, iterations=500)
    assert torch.isfinite(plan).all()
    torch.testing.assert_close(value, expected)
    assert plan[-3:].abs().max() == 0 and plan[:, -2:].abs().max() == 0


def test_unbalanced_matches_pot():
    cost, a, b = _problem(2)
    b = b * 0.5  # unequal masses: only the relaxed problem is defined
    _, plan = sinkhorn(cost, a, b, eps=0.05, iterations=3000, tau_a=1.0, tau_b=0.5)
    # ρ = (τ / (1 − τ)) / (τ / (1 − τ) + ε) is POT's fi = reg_m / (reg_m + reg) with reg_m = τ / (1 − τ) = 1
    reference = ot.unbalanced.sinkhorn_unbalanced(a.numpy(), b.numpy(), cost.numpy(), reg=0.05, reg_m=(np.inf, 1.0),
                                                  method="sinkhorn_stabilized", reg_type="entropy", numItermax=3000,
                                                  stopThr=1e-12)  # fmt: skip
    np.testing.assert_allclose(plan.numpy(), reference, atol=1e-5)


def test_early_stop_on_tolerance_and_errors():
    cost, a, b = _problem(3)
    early, _ = sinkhorn(cost, a, b, eps=0.05, iterations=5000, tol=1e-9)
    full, _ = sinkhorn(cost, a, b, eps=0.05, iterations=5000)
    torch.testing.assert_close(early, full)
    with pytest.raises(ValueError, match="does not match"):
        sinkhorn(cost, a[:-1], b)
    with pytest.raises(ValueError, match="tau"):
        sinkhorn(cost, a, b, tau_b=0.0)
