"""ProDiff against hand-derived references.

Every expected value here is computed independently of the code under test: the linear-β schedule, q_sample, the
official DDIM steps, the prototype softmax, the triplet hinge and the cluster cross-entropy are written out with numpy
or math (or worked out in comments), never by calling the functions being checked.
"""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest
import torch

from zoo.models.prodiff import (
    EndpointDiffusion,
    ProDiff,
    cluster_consistency_loss,
    match_prototypes,
    prototype_triplet_loss,
)

SMALL = {"k": 6, "ch": 16, "groups": 4, "d_model": 16, "pce_layers": 1, "pce_heads": 2, "pce_ff": 32, "n_prototypes": 4}
LO, HI = [0.0, 35.6, 139.7], [24.0, 35.8, 139.9]


def _alpha_bar(T, beta_start, beta_end):
    """ᾱ_t = Π_{s ≤ t} (1 − β_s), β linear from beta_start to beta_end over T points (float64)."""
    return np.cumprod(1.0 - np.linspace(beta_start, beta_end, T))


def _hold(x, ends):
    x = x.copy()
    x[..., 0], x[..., -1] = ends[..., 0], ends[..., -1]
    return x


def _raw(b=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([1.0, 35.65, 139.75], dtype=torch.float64).view(1, 3, 1)
    step = torch.rand(b, 3, 6, generator=g, dtype=torch.float64) * torch.tensor([0.5, 0.01, 0.01]).double().view(
        1, 3, 1
    )
    return base + step.cumsum(-1)


def test_q_sample_matches_the_hand_schedule():
    """Catches q_sample without the square roots (ᾱ x0 + (1 − ᾱ) ε) and noised endpoints."""
    diffusion = EndpointDiffusion(10, beta_start=0.1, beta_end=0.5)
    ab = _alpha_bar(10, 0.1, 0.5)
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, 5, generator=g)
    t = torch.tensor([0, 3, 7, 9])
    out = diffusion.q_sample(x0, t, noise).double().numpy()
    a = ab[t.numpy()].reshape(-1, 1, 1)
    expected = _hold(np.sqrt(a) * x0.double().numpy() + np.sqrt(1 - a) * noise.double().numpy(), x0.double().numpy())
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    assert np.array_equal(out[..., [0, -1]], x0.double().numpy()[..., [0, -1]])


@pytest.mark.parametrize(
    "offset, expected",
    [
        (lambda n: torch.zeros_like(n), 0.0),  # exact interior: 0 whatever the endpoints hold
        (lambda n: torch.full_like(n, 0.5), 0.5),  # L1 mean of |0.5| = 0.5 (L2 would give 0.25)
        (lambda n: torch.where(torch.arange(n.numel()).view(n.shape) % 2 == 0, 0.5, -0.5), 0.5),  # |±0.5| = 0.5
    ],
    ids=["exact", "plus_c", "plus_minus_c"],
)
def test_diffusion_loss_is_the_interior_l1_of_the_noise_error(offset, expected):
    """Catches an L1 that includes the held endpoints (here off by ±100), L2 in place of L1, and a missing abs."""
    model = ProDiff(**SMALL)
    model.set_scaler(LO, HI)
    captured = {}
    q_sample = model.diffusion.q_sample

    def spy(x0, t, noise):
        captured["noise"] = noise
        return q_sample(x0, t, noise)

    def fake_eps(x_t, t, ends, matched):
        e = captured["noise"] + offset(captured["noise"])
        e[..., 0] += 100.0
        e[..., -1] -= 100.0
        return e

    model.diffusion.q_sample = spy
    model.eps = fake_eps
    loss = model.losses(_raw(), generator=torch.Generator().manual_seed(0))["diffusion"]
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    if expected == 0.0:
        assert float(loss) == 0.0


def _ddim_by_hand(x, ends, e, t, t_prev, ab):
    """One eta = 0 DDIM step: x̂0 = (x − √(1−ᾱ_t) ε̂)/√ᾱ_t, then √ᾱ_prev x̂0 + √(1−ᾱ_prev) ε̂ (ᾱ_prev = 1: x̂0)."""
    x0 = _hold((x - math.sqrt(1 - ab[t]) * e) / math.sqrt(ab[t]), ends)
    a_prev = 1.0 if t_prev is None else ab[t_prev]
    return _hold(math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * e, ends), x0


def test_official_and_trailing_ddim_match_hand_steps():
    """Catches the official last step returning x̂0 (instead of landing on t = 0) and a dropped √(1−ᾱ_prev) ε̂ term."""
    T, b0, b1 = 10, 0.01, 0.2
    diffusion = EndpointDiffusion(T, beta_start=b0, beta_end=b1)
    ab = _alpha_bar(T, b0, b1)
    ends_t = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(3))
    ends = ends_t.double().numpy()
    e = np.full(ends.shape, 0.3)
    eps = lambda x, t: torch.full_like(x, 0.3)
    # sample() draws x_T ~ N(0, I) first from the generator, then overwrites the endpoints.
    x_T = _hold(torch.randn(ends_t.shape, generator=torch.Generator().manual_seed(0)).double().numpy(), ends)

    # official grid: linspace(9, 0, 3) = [9, 4.5, 0] → .long() = [9, 4, 0]; steps 9 → 4 → 0.
    x4, _ = _ddim_by_hand(x_T, ends, e, 9, 4, ab)
    official_hand, x0_hat = _ddim_by_hand(x4, ends, e, 4, 0, ab)
    official = diffusion.sample(
        eps, ends_t, "ddim", 2, generator=torch.Generator().manual_seed(0), ddim_grid="official"
    )
    np.testing.assert_allclose(official.double().numpy(), official_hand, rtol=0, atol=1e-5)

    # trailing grid for T = 10, 2 steps: round(arange(10, 0, -5)) − 1 = [9, 4]; 9 → 4, then 4 → x̂0 (ᾱ_prev = 1).
    trailing = diffusion.sample(eps, ends_t, "ddim", 2, generator=torch.Generator().manual_seed(0)).double().numpy()
    assert diffusion.ddim.timesteps.tolist() == [9, 4]
    trailing_hand, _ = _ddim_by_hand(x4, ends, e, 4, None, ab)
    np.testing.assert_allclose(trailing, trailing_hand, rtol=0, atol=1e-5)
    np.testing.assert_allclose(trailing[..., 1:-1], x0_hat[..., 1:-1], rtol=0, atol=1e-5)
    # the grids share the 9 → 4 step, so they differ only by the last: √ᾱ_0 x̂0 + √(1−ᾱ_0) ε̂ − x̂0 on the interior.
    gap = math.sqrt(ab[0]) * x0_hat + math.sqrt(1 - ab[0]) * e - x0_hat
    np.testing.assert_allclose((official.double().numpy() - trailing)[..., 1:-1], gap[..., 1:-1], rtol=0, atol=1e-5)
    assert np.abs(gap[..., 1:-1]).min() > 1e-2  # √(1 − 0.99) · 0.3 = 0.03 dominates: the check has teeth


def test_match_prototypes_is_a_cosine_softmax_at_the_given_temperature():
    """Catches an ignored temperature (√D used), multiplying by τ, unnormalised cosines, or mixing normalised P."""
    q = np.array([[3.0, 1.0], [-1.0, 2.0]])
    P = np.array([[2.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (P / np.linalg.norm(P, axis=1, keepdims=True)).T
    w = np.exp(cos / 0.5)
    expected = (w / w.sum(1, keepdims=True)) @ P
    out = match_prototypes(torch.tensor(q, dtype=torch.float32), torch.tensor(P, dtype=torch.float32), 0.5)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=0, atol=1e-6)


def test_triplet_loss_on_worked_examples():
    """Catches nearest / farthest swapped, a missing (or hard-coded) margin, and max/min taken over the wrong axis."""
    P = torch.tensor([[1.0, 0.0], [0.0, 1.5]])
    # f=(0,0): d = (1, 1.5), nearest 1, farthest 1.5: max(0, 1 − 1.5 + 1) = 0.5 (swapped: 1.5; no margin: 0).
    assert float(prototype_triplet_loss(torch.tensor([[0.0, 0.0]]), P, 1.0)) == pytest.approx(0.5, abs=1e-6)
    # f=(0,1): d = (√2, 0.5), the nearest is now the second prototype: 0.5 − √2 + 1 = 0.0858 (swapped: 1.9142).
    f = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    expected = (0.5 + (0.5 - math.sqrt(2) + 1)) / 2
    assert float(prototype_triplet_loss(f, P, 1.0)) == pytest.approx(expected, abs=1e-6)
    # margin 2: (1 − 1.5 + 2 = 1.5, 0.5 − √2 + 2 = 1.0858) averaged.
    assert float(prototype_triplet_loss(f, P, 2.0)) == pytest.approx((1.5 + 2.5 - math.sqrt(2)) / 2, abs=1e-6)
    # f=(0,0), P=[(1,0),(0,3)]: 1 − 3 + 1 = −1 → 0 (the hinge is inactive).
    assert float(prototype_triplet_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 3.0]]))) == 0.0


def test_cluster_consistency_loss_is_cross_entropy_against_normalised_prototypes():
    """Catches prototypes left unnormalised in the logits (and normalised features)."""
    f = np.array([[1.0, 2.0], [-1.0, 0.5], [2.0, -1.0]])
    P = np.array([[3.0, 4.0], [0.0, -2.0]])  # normalised: (0.6, 0.8), (0, −1)
    labels = np.array([1, 0, 0])
    logits = f @ (P / np.linalg.norm(P, axis=1, keepdims=True)).T
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = -log_softmax[np.arange(3), labels].mean()
    out = cluster_consistency_loss(
        torch.tensor(f, dtype=torch.float32), torch.tensor(P, dtype=torch.float32), torch.tensor(labels)
    )
    assert float(out) == pytest.approx(expected, abs=1e-6)


def _windows():
    return torch.tensor([[[0.0, 0, 0, 0, 0, 1.0], [35.68] * 5 + [35.70], [139.76] * 5 + [139.78]]])


def test_impute_refuses_an_unset_scaler():
    """Catches a missing never-set-scaler check (the imputation would silently use min 0 / max 1)."""
    with pytest.raises(ValueError, match="never set"):
        ProDiff(**SMALL).impute(_windows(), steps=1)


def test_impute_refuses_endpoints_outside_the_training_range():
    """Catches a missing range check on the endpoints (10° of latitude beyond a 0.2° range)."""
    model = ProDiff(**SMALL)
    model.set_scaler(LO, HI)
    windows = _windows()
    windows[0, 1, -1] = HI[1] + 10.0
    with pytest.raises(ValueError, match="outside"):
        model.impute(windows, steps=1)
    windows = _windows()
    windows[0, 1, 0] = LO[1] - 10.0
    with pytest.raises(ValueError, match="latitude"):
        model.impute(windows, steps=1)


@pytest.mark.parametrize(("sampler", "steps"), [("ddim", 0), ("ddim", 101), ("ddpm", 0), ("ddpm", 101)])
def test_impute_refuses_steps_outside_1_to_T(sampler, steps):
    """Catches a missing steps check in impute (T = 100); with DDPM the sampler ignores ``steps``, so only impute's
    own check refuses it."""
    model = ProDiff(**SMALL)
    model.set_scaler(LO, HI)
    with pytest.raises(ValueError, match="steps"):
        model.impute(_windows(), sampler=sampler, steps=steps)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"sampling_steps": 0}, "sampling_steps"),
        ({"sampling_steps": 101}, "sampling_steps"),
        ({"eta": 1.5}, "eta"),
        ({"eta": -0.1}, "eta"),
        ({"ddim_grid": "x"}, "ddim_grid"),
        ({"sampler": "x"}, "sampler"),
    ],
)
def test_constructor_refuses_bad_hyperparameters(kwargs, word):
    """Catches a missing validation of sampling_steps, eta, ddim_grid or sampler."""
    with pytest.raises(ValueError, match=word):
        ProDiff(**SMALL, **kwargs)


@pytest.mark.parametrize("hi", [[24.0, 35.8, 139.7], [24.0, 35.5, 139.9]])
def test_set_scaler_refuses_max_not_above_min(hi):
    """Catches a set_scaler that accepts max == min or max < min (division by a zero or negative span)."""
    with pytest.raises(ValueError, match="max > min"):
        ProDiff(**SMALL).set_scaler(LO, hi)


def _eps_of_t(x, t):
    """ε̂ = 0.05 t²: depends on t, so the result depends on which timesteps the sampler visits (a constant ε̂ would
    not: with it every eta = 0 DDIM grid lands on the same x_0)."""
    return 0.05 * t.to(x).view(-1, 1, 1) ** 2 + torch.zeros_like(x)


def _official_hand(x, ends, grid, ab):
    for t, t_prev in itertools.pairwise(grid):
        e = np.full(x.shape, 0.05 * t**2)
        x0 = _hold((x - math.sqrt(1 - ab[t]) * e) / math.sqrt(ab[t]), ends)
        x = _hold(math.sqrt(ab[t_prev]) * x0 + math.sqrt(1 - ab[t_prev]) * e, ends)
    return x


def test_official_ddim_grid_truncates_the_linspace():
    """4 steps on T = 10: linspace(9, 0, 5) = [9, 6.75, 4.5, 2.25, 0], truncated to [9, 6, 4, 2, 0]. Catches a grid
    rounded ([9, 7, 4, 2, 0]) or stepped on diffusers' fixed stride."""
    T, b0, b1 = 10, 0.01, 0.2
    diffusion = EndpointDiffusion(T, beta_start=b0, beta_end=b1)
    ab = _alpha_bar(T, b0, b1)
    ends_t = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(3))
    ends = ends_t.double().numpy()
    x_T = _hold(torch.randn(ends_t.shape, generator=torch.Generator().manual_seed(0)).double().numpy(), ends)
    truncated = _official_hand(x_T, ends, [9, 6, 4, 2, 0], ab)
    rounded = _official_hand(x_T, ends, [9, 7, 4, 2, 0], ab)
    assert np.abs(truncated - rounded)[..., 1:-1].min() > 0.05  # the two grids are told apart
    out = diffusion.sample(
        _eps_of_t, ends_t, "ddim", 4, generator=torch.Generator().manual_seed(0), ddim_grid="official"
    )
    np.testing.assert_allclose(out.double().numpy(), truncated, rtol=0, atol=1e-4)


def test_official_ddim_step_with_eta_one_matches_the_hand_formula():
    """Two official steps (9 → 4 → 0) with η = 1: σ = η √((1 − ᾱ_prev)/(1 − ᾱ_t) · (1 − ᾱ_t/ᾱ_prev)), x_prev =
    √ᾱ_prev x̂0 + √(1 − ᾱ_prev − σ²) ε̂ + σ z, z drawn after x_T from the same generator, one per step. Catches a
    dropped σ z, a σ² not taken from the ε̂ coefficient, a wrong σ and z drawn from another generator."""
    T, b0, b1 = 10, 0.01, 0.2
    diffusion = EndpointDiffusion(T, beta_start=b0, beta_end=b1)
    ab = _alpha_bar(T, b0, b1)
    ends_t = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(3))
    ends = ends_t.double().numpy()
    g = torch.Generator().manual_seed(0)
    draws = [torch.randn(ends_t.shape, generator=g).double().numpy() for _ in range(3)]  # x_T, z (9 → 4), z (4 → 0)
    x = _hold(draws[0], ends)
    e = np.full(ends.shape, 0.3)
    for (t, t_prev), z in zip([(9, 4), (4, 0)], draws[1:]):
        x0 = _hold((x - math.sqrt(1 - ab[t]) * e) / math.sqrt(ab[t]), ends)
        sigma = math.sqrt((1 - ab[t_prev]) / (1 - ab[t]) * (1 - ab[t] / ab[t_prev]))
        assert sigma > 0.05  # the noise term has teeth
        x = _hold(math.sqrt(ab[t_prev]) * x0 + math.sqrt(1 - ab[t_prev] - sigma**2) * e + sigma * z, ends)
    out = diffusion.sample(
        lambda x, t: torch.full_like(x, 0.3), ends_t, "ddim", 2, eta=1.0,
        generator=torch.Generator().manual_seed(0), ddim_grid="official",
    )  # fmt: skip
    np.testing.assert_allclose(out.double().numpy(), x, rtol=0, atol=1e-5)


def test_impute_refuses_endpoints_outside_the_training_longitude_range():
    """Catches a range check that only looks at latitude (10° of longitude beyond a 0.2° range, at either end)."""
    model = ProDiff(**SMALL)
    model.set_scaler(LO, HI)
    for i, value in ((-1, HI[2] + 10.0), (0, LO[2] - 10.0)):
        windows = _windows()
        windows[0, 2, i] = value
        with pytest.raises(ValueError, match="longitude"):
            model.impute(windows, steps=1)


def _optimizer(monkeypatch, **kwargs):
    from lightning.pytorch import LightningModule

    monkeypatch.setattr(LightningModule, "trainer", types.SimpleNamespace(estimated_stepping_batches=100))
    model = ProDiff(**SMALL, **kwargs)
    return model, model.configure_optimizers()["optimizer"]


@pytest.mark.parametrize(("pce_lr", "expected"), [(None, 2e-3), (2e-4, 2e-4), (5e-4, 5e-4)])
def test_configure_optimizers_gives_the_extractor_its_own_learning_rate(monkeypatch, pce_lr, expected):
    """The extractor's parameters at pce_lr (lr when None), every other at lr; the groups share no parameter and
    cover them all. Catches swapped rates, an extractor also left in the main group, a dropped parameter and a
    pce_lr=None not falling back to lr. (``initial_lr``: the schedule scales ``lr`` by the warm-up at step 0.)"""
    model, opt = _optimizer(monkeypatch, pce_lr=pce_lr)
    extractor = {id(p) for p in model.pce.parameters()}
    groups = [{id(p) for p in g["params"]} for g in opt.param_groups]
    assert len(groups) == 2 and not groups[0] & groups[1]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    assert set().union(*groups) == {id(p) for p in model.parameters()}
    (pce,) = [g for g, ids in zip(opt.param_groups, groups) if ids == extractor]
    (rest,) = [g for g, ids in zip(opt.param_groups, groups) if ids != extractor]
    assert pce["initial_lr"] == pytest.approx(expected, rel=1e-12)
    assert rest["initial_lr"] == pytest.approx(2e-3, rel=1e-12)
    assert model.hparams.pce_lr == pce_lr


def test_configure_optimizers_diff_mask_has_one_group(monkeypatch):
    """Diff+Mask (no extractor): one group of every parameter at lr."""
    model, opt = _optimizer(monkeypatch, prototypes=False)
    assert len(opt.param_groups) == 1
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model.parameters()}
    assert opt.param_groups[0]["initial_lr"] == pytest.approx(2e-3, rel=1e-12)


@pytest.mark.parametrize("eta", [2.0, -1.0, 1.0001, float("nan")])
def test_eta_outside_0_1_is_refused(eta):
    """Catches a missing eta check: eta = 2 makes √(1 − ᾱ_prev − σ²) NaN and returned silently; eta < 0 is no
    DDIM. Both impute and the sampler itself refuse it."""
    model = ProDiff(**SMALL)
    model.set_scaler(LO, HI)
    with pytest.raises(ValueError, match=r"eta.*\[0, 1\]"):
        model.impute(_windows(), steps=3, eta=eta)
    with pytest.raises(ValueError, match=r"eta.*\[0, 1\]"):
        EndpointDiffusion(10).sample(lambda x, t: torch.zeros_like(x), torch.zeros(1, 3, 6), steps=3, eta=eta)


def test_eta_at_the_bounds_is_accepted():
    """η = 0 and η = 1 are valid (a check written as 0 < η < 1 would refuse them)."""
    for eta in (0.0, 1.0):
        out = EndpointDiffusion(10).sample(lambda x, t: torch.zeros_like(x), torch.zeros(1, 3, 6), steps=3, eta=eta)
        assert torch.isfinite(out).all()


def _bad_windows():
    wrong_k = torch.rand(2, 3, 5)
    two_channels = torch.rand(2, 2, 6)
    flat = torch.rand(3, 6)
    nan_end = torch.rand(2, 3, 6)
    nan_end[1, 2, -1] = float("nan")
    return [
        (wrong_k, r"\[B, 3, 6\].*got \[2, 3, 5\]"),
        (two_channels, r"\[B, 3, 6\].*got \[2, 2, 6\]"),
        (flat, r"\[B, 3, 6\].*got \[3, 6\]"),
        (nan_end, "NaN"),
    ]


def test_baselines_refuse_windows_of_another_shape_or_nan_endpoints():
    """Catches EndpointNeighbours and EndpointRegressor.impute taking windows of another k (a broadcast error, or a
    silent answer), of other than 3 channels, or with NaN endpoints."""
    from zoo.models.prodiff.baselines import EndpointNeighbours, EndpointRegressor

    train = torch.rand(10, 3, 6).double()
    neighbours = EndpointNeighbours(train, n_neighbours=2)
    regressor = EndpointRegressor(k=6, width=4, depth=1)
    for impute in (neighbours, regressor.impute):
        assert impute(train[:2]).shape == (2, 3, 6)
        for windows, message in _bad_windows():
            with pytest.raises(ValueError, match=message):
                impute(windows)
