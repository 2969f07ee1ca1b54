import math

import numpy as np
import pytest
import torch

from zoo.metrics import (
    ControlVariatesWinRate,
    HumanWinRate,
    SyntheticWinRate,
    WinRateEstimate,
    bootstrap_mse,
    control_variates_win_rate,
    human_win_rate,
    ppi_win_rate,
    synthetic_win_rate,
)

NAN = float("nan")


def _latent_pool(seed: int, N: int, sigma_s: float, beta: float = 1.5, b: float = 0.6) -> tuple[torch.Tensor, ...]:
    """The card's Part A: u ~ N(0, 1); z = 1[u + ε_h > 0] with 0.5-ties near 0; ẑ = σ(β(u + σ_s ε_s) + b), biased."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(N, generator=g, dtype=torch.float64)
    h = u + torch.randn(N, generator=g, dtype=torch.float64)
    z = (h > 0).double()
    z[h.abs() < 0.1] = 0.5
    z_hat = torch.sigmoid(beta * (u + sigma_s * torch.randn(N, generator=g, dtype=torch.float64)) + b)
    return z, z_hat


def _random_labels(seed: int, N: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels in {0, 0.5, 1} correlated with scores in [0, 1]; only a random n of the N labels kept (NaN elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    z_hat = torch.rand(N, generator=g, dtype=torch.float64)
    z = (torch.rand(N, generator=g, dtype=torch.float64) < z_hat).double()
    z[torch.rand(N, generator=g) < 0.1] = 0.5
    z[torch.randperm(N, generator=g)[n:]] = NAN
    return z, z_hat


def _numpy_cv(z: np.ndarray, z_hat: np.ndarray, ddof_var: int, finite: bool) -> dict[str, float]:
    labelled = ~np.isnan(z)
    zH, hH, n, N = z[labelled], z_hat[labelled], labelled.sum(), len(z)
    alpha = np.cov(zH, hH)[0, 1] / np.var(hH, ddof=ddof_var)  # official: np.cov (ddof 1) / np.var (ddof 0)
    rho = np.corrcoef(zH, hH)[0, 1]
    saving = rho**2 * ((1 - n / N) if finite else 1.0)
    return {
        "estimate": zH.mean() - alpha * (hH.mean() - z_hat.mean()),
        "se": np.sqrt((1 - saving) * np.var(zH, ddof=1) / n),
        "alpha": alpha,
        "rho": rho,
        "predicted_saving": saving,
    }


@pytest.mark.parametrize(("alpha_ddof", "ddof_var", "finite"), [("official", 0, True), ("exact", 1, False)])
def test_control_variates_win_rate_matches_numpy_reference(alpha_ddof, ddof_var, finite):
    """Check that estimate, se, alpha, rho and saving equal a numpy computation with np.cov / np.var."""
    z, z_hat = _random_labels(seed=0, N=500, n=120)
    got = control_variates_win_rate(z.float(), z_hat.float(), alpha_ddof=alpha_ddof, finite_population=finite)
    expected = _numpy_cv(z.float().double().numpy(), z_hat.float().double().numpy(), ddof_var, finite)
    for key, value in expected.items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert (got.n, got.N) == (120, 500)
    assert got.rho > 0.3


def test_human_and_synthetic_win_rate_match_numpy_reference():
    """Check that the baselines are the label mean and the score mean with ddof-1 standard errors."""
    z, z_hat = _random_labels(seed=1, N=300, n=80)
    zH = z.numpy()[~np.isnan(z.numpy())]
    human = human_win_rate(z)
    assert human.estimate == pytest.approx(zH.mean(), rel=1e-12)
    assert human.se == pytest.approx(zH.std(ddof=1) / math.sqrt(80), rel=1e-9)
    assert (human.alpha, human.predicted_saving, human.n, human.N) == (0.0, 0.0, 80, 300)
    assert math.isnan(human.rho)
    synthetic = synthetic_win_rate(z_hat, z)
    assert synthetic.estimate == pytest.approx(z_hat.numpy().mean(), rel=1e-12)
    assert synthetic.se == pytest.approx(z_hat.numpy().std(ddof=1) / math.sqrt(300), rel=1e-9)
    assert synthetic.rho == pytest.approx(control_variates_win_rate(z, z_hat).rho, rel=1e-12)
    assert math.isnan(synthetic_win_rate(z_hat).rho) and synthetic_win_rate(z_hat).n == 0


def _as_dict(estimate: WinRateEstimate) -> dict[str, float]:
    return {k: getattr(estimate, k) for k in ("estimate", "se", "alpha", "rho", "predicted_saving")}


def _assert_same(computed: dict[str, torch.Tensor], expected: dict[str, float]) -> None:
    assert list(computed) == list(expected)
    for key, value in expected.items():
        assert computed[key].ndim == 0 and computed[key].dtype == torch.float64
        assert float(computed[key]) == pytest.approx(value, rel=1e-10, abs=1e-12, nan_ok=True), key


def test_win_rate_metrics_accumulated_over_batches_match_numpy_on_all_of_them():
    """Check that each Metric fed 3 batches equals a numpy computation on the concatenated batches (np.cov / np.var,
    the label and score means with ddof-1 standard errors), not the module's own functions."""
    z, z_hat = _random_labels(seed=2, N=600, n=150)
    zn, hn = z.numpy(), z_hat.numpy()
    labelled = ~np.isnan(zn)
    zH = zn[labelled]
    metrics = {
        "cv": (ControlVariatesWinRate(), _numpy_cv(zn, hn, ddof_var=0, finite=True)),
        "human": (HumanWinRate(), {"estimate": zH.mean(), "se": zH.std(ddof=1) / math.sqrt(len(zH)), "alpha": 0.0,
                                   "rho": NAN, "predicted_saving": 0.0}),  # fmt: skip
        "synthetic": (SyntheticWinRate(), {"estimate": hn.mean(), "se": hn.std(ddof=1) / math.sqrt(len(hn)),
                                           "alpha": NAN, "rho": np.corrcoef(zH, hn[labelled])[0, 1],
                                           "predicted_saving": 0.0}),  # fmt: skip
    }
    for rows in torch.tensor_split(torch.arange(600), 3):
        for metric, _ in metrics.values():
            metric.update(z[rows], z_hat[rows])
    for metric, expected in metrics.values():
        _assert_same(metric.compute(), {k: float(v) for k, v in expected.items()})


def test_win_rate_metric_merge_state_equals_one_metric():
    """Check that merging the sum states of two metric copies (the DDP sync) equals one metric fed everything."""
    z, z_hat = _random_labels(seed=3, N=400, n=100)
    a, b, both = ControlVariatesWinRate(), ControlVariatesWinRate(), ControlVariatesWinRate()
    a.update(z[:250], z_hat[:250])
    b.update(z[250:], z_hat[250:])
    both.update(z, z_hat)
    a.merge_state(b)
    _assert_same(a.compute(), {k: float(v) for k, v in both.compute().items()})


def test_ppi_win_rate_equals_ppi_formula():
    """Check that alpha = 1 gives the PPI mean ẑ̄_N + (z̄_H - ẑ̄_H)."""
    z, z_hat = _random_labels(seed=4, N=300, n=60)
    labelled = ~torch.isnan(z)
    expected = float(z_hat.mean() + (z[labelled].mean() - z_hat[labelled].mean()))
    assert ppi_win_rate(z, z_hat).estimate == pytest.approx(expected, rel=1e-12)
    assert control_variates_win_rate(z, z_hat, alpha=1.0).estimate == pytest.approx(expected, rel=1e-12)
    assert ppi_win_rate(z, z_hat).alpha == 1.0


@pytest.mark.parametrize("sigma_s", [1.0, 0.5])
def test_control_variates_win_rate_is_unbiased_and_saves_rho_squared(sigma_s):
    """Check that on the card's Part A the CV estimate is unbiased, the synthetic one biased, the saving ρ²(1-n/N)."""
    N, n, reps = 20_000, 200, 4000
    z, z_hat = _latent_pool(seed=0, N=N, sigma_s=sigma_s)
    p_star = float(z.mean())
    rho = float(torch.corrcoef(torch.stack([z, z_hat]))[0, 1])
    g = torch.Generator().manual_seed(1)
    # Labelled subsets drawn without replacement from the fixed pool: the n smallest of N uniform keys per row.
    index = torch.cat([torch.rand(1000, N, generator=g).topk(n, dim=1).indices for _ in range(reps // 1000)])
    p_cv = torch.empty(reps, dtype=torch.float64)
    for r in range(reps):  # the public function itself, ~0.4 ms a call
        z_subset = torch.full_like(z, NAN)
        z_subset[index[r]] = z[index[r]]
        p_cv[r] = control_variates_win_rate(z_subset, z_hat).estimate
    p_h = z[index].mean(dim=1)
    p_s = synthetic_win_rate(z_hat).estimate
    se = float(p_cv.std()) / math.sqrt(reps)
    # Measured (this pool and draw, sigma_s 1.0 / 0.5): bias / SE -1.45 / -1.43 (the human mean of the same subsets is
    # off by -0.0004 too), synthetic bias +0.090 / +0.101, saving 0.163 / 0.279 vs ρ²(1-n/N) 0.158 / 0.268.
    assert abs(float(p_cv.mean()) - p_star) < 3 * se
    assert abs(p_s - p_star) > 0.02
    saving = 1.0 - float(p_cv.var() / p_h.var())
    assert saving == pytest.approx(rho**2 * (1 - n / N), abs=0.05)
    assert rho > 0.3


def test_bootstrap_mse_shows_the_predicted_saving():
    """Check that CV beats human at every n >= 20, decreases with n, and saves ρ²_pool; synthetic MSE is its bias²."""
    z, z_hat = _latent_pool(seed=0, N=2000, sigma_s=0.5)
    n_grid = [20, 50, 100, 200, 500, 1000]
    mse = bootstrap_mse(z, z_hat, n_grid, reps=1000, seed=0)
    assert set(mse) == {"human", "synthetic", "cv", "ppi"} and mse["cv"].shape == (6,)
    assert (mse["cv"] < mse["human"]).all()
    assert (mse["cv"].diff() < 0).all()
    bias2 = float((z_hat.mean() - z.mean()) ** 2)
    assert torch.allclose(mse["synthetic"], torch.full((6,), bias2, dtype=torch.float64), rtol=1e-12)
    # With replacement and an exactly known control mean, the saving is ρ²_pool at every n (no 1 - n/N).
    rho2 = float(torch.corrcoef(torch.stack([z, z_hat]))[0, 1] ** 2)
    saving = 1.0 - mse["cv"] / mse["human"]
    assert float(saving[2:].mean()) == pytest.approx(rho2, abs=0.05)  # measured: 0.299 vs ρ² = 0.276


def test_bootstrap_mse_is_seeded_and_selects_methods():
    """Check that a fixed seed repeats the MSEs and `methods` limits the keys."""
    z, z_hat = _latent_pool(seed=1, N=300, sigma_s=1.0)
    first = bootstrap_mse(z, z_hat, [10, 30], reps=50, seed=3, methods=("cv",))
    assert list(first) == ["cv"]
    assert torch.equal(first["cv"], bootstrap_mse(z, z_hat, [10, 30], reps=50, seed=3, methods=("cv",))["cv"])


def test_control_variates_win_rate_falls_back_to_human_mean_when_scores_are_constant():
    """Check that var(ẑ_H) = 0 gives alpha 0, rho 0 and the human mean with the human se."""
    z = torch.tensor([1.0, 0.0, 0.5, 1.0, NAN, NAN])
    z_hat = torch.tensor([0.7, 0.7, 0.7, 0.7, 0.1, 0.9])
    cv, human = control_variates_win_rate(z, z_hat), human_win_rate(z)
    assert (cv.alpha, cv.rho, cv.predicted_saving) == (0.0, 0.0, 0.0)
    assert cv.estimate == pytest.approx(human.estimate) and cv.se == pytest.approx(human.se)
    m = ControlVariatesWinRate()
    m.update(z, z_hat)
    assert float(m.compute()["alpha"]) == 0.0


def test_control_variates_win_rate_has_negative_rho_when_scores_are_flipped():
    """Check that a flipped ẑ (1 - ẑ) gives rho < 0, the same saving, and still an unbiased-form estimate."""
    z, z_hat = _random_labels(seed=5, N=500, n=150)
    right, flipped = control_variates_win_rate(z, z_hat), control_variates_win_rate(z, 1 - z_hat)
    assert right.rho > 0.3 and flipped.rho == pytest.approx(-right.rho)
    assert flipped.alpha == pytest.approx(-right.alpha) and flipped.estimate == pytest.approx(right.estimate)


def test_win_rate_estimate_interval_is_normal():
    """Check that the 95% interval is estimate ± 1.96 se and a bad level raises."""
    low, high = WinRateEstimate(0.5, 0.1, 0.0, NAN, 0.0, 10, 10).interval(0.95)
    assert (low, high) == pytest.approx((0.5 - 0.195996, 0.5 + 0.195996), abs=1e-6)
    with pytest.raises(ValueError, match="Expected argument `level` to be a float in \\(0, 1\\) but got 95"):
        WinRateEstimate(0.5, 0.1, 0.0, NAN, 0.0, 10, 10).interval(95)


def test_win_rate_raises_on_bad_input():
    """Check that bad labels, too few labels, non-finite or out-of-range scores and bad shapes raise ValueErrors."""
    z_hat = torch.tensor([0.2, 0.4, 0.6, 0.8])
    with pytest.raises(ValueError, match=r"0 \(B wins\), 0.5 \(tie\), 1 \(A wins\) or NaN .* got \[0.25, 2.0\]"):
        control_variates_win_rate(torch.tensor([1.0, 0.25, 2.0, 0.0]), z_hat)
    with pytest.raises(ValueError, match="at least 2 human labels .* but got 1"):
        control_variates_win_rate(torch.tensor([1.0, NAN, NAN, NAN]), z_hat)
    with pytest.raises(ValueError, match="at least 2 human labels .* but got 0"):
        human_win_rate(torch.full((3,), NAN))
    with pytest.raises(ValueError, match="`z_hat` to be finite, but got NaN or inf at 2 positions"):
        control_variates_win_rate(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.2, NAN, float("inf"), 0.5]))
    with pytest.raises(ValueError, match=r"`z_hat` in \[0, 1\] .* got values in \[-0.5, 1.5\]"):
        control_variates_win_rate(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([-0.5, 0.5, 1.5, 0.5]))
    with pytest.raises(ValueError, match=r"1-D of the same length \(N,\), got \(4,\) and \(3,\)"):
        control_variates_win_rate(torch.tensor([1.0, 0.0, 1.0, 0.0]), z_hat[:3])
    with pytest.raises(ValueError, match=r"got \(2, 2\) and \(2, 2\)"):
        ControlVariatesWinRate().update(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="every pair of the pool to be labelled, but `z` has 1 NaN"):
        bootstrap_mse(torch.tensor([1.0, 0.0, NAN, 1.0]), z_hat, [2])
    with pytest.raises(ValueError, match=r"`n_grid` to hold ints >= 2 .* got \[1\]"):
        bootstrap_mse(torch.tensor([1.0, 0.0, 0.0, 1.0]), z_hat, [1])
    with pytest.raises(ValueError, match=r"`methods` among \['human', 'synthetic', 'cv', 'ppi'\] but got \['ols'\]"):
        bootstrap_mse(torch.tensor([1.0, 0.0, 0.0, 1.0]), z_hat, [2], methods=["ols"])


def test_win_rate_metrics_raise_on_bad_arguments():
    """Check that bad init arguments, a missing input and computing before 2 labels raise clear errors."""
    with pytest.raises(
        ValueError, match="Expected argument `alpha_ddof` to be one of 'official', 'exact', but got 'np'"
    ):
        ControlVariatesWinRate(alpha_ddof="np")
    with pytest.raises(ValueError, match="Expected argument `alpha` to be a finite float or None, but got nan"):
        control_variates_win_rate(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), alpha=NAN)
    with pytest.raises(ValueError, match="`finite_population` to be one of True, False, but got 1"):
        ControlVariatesWinRate(finite_population=1)
    with pytest.raises(ValueError, match="`reps` to be an int >= 1, but got 0"):
        bootstrap_mse(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0.2, 0.4, 0.6, 0.8]), [2], reps=0)
    with pytest.raises(TypeError, match="SyntheticWinRate.update needs `z_hat`, got None"):
        SyntheticWinRate().update(torch.tensor([1.0, 0.0]))
    m = HumanWinRate()
    m.update(torch.tensor([1.0, NAN]))
    with pytest.raises(ValueError, match="at least 2 human labels .* but got 1"):
        m.compute()


def test_fixed_alpha_and_ppi_standard_errors_match_the_formula_by_hand() -> None:
    """Check the fixed-α SE, (s_z² − (1 − n/N)(2α s_zẑ − α² s_ẑ²)) / n with ddof 1, on numbers computed with numpy
    here (not with the module's helpers), for α = 0.3 and PPI's α = 1; the optimal-α SE differs on these data."""
    import numpy as np

    from zoo.metrics.win_rate import control_variates_win_rate, ppi_win_rate

    rng = np.random.default_rng(7)
    z_hat_all = rng.uniform(0, 1, size=400)
    z = (rng.uniform(0, 1, size=60) < z_hat_all[:60]).astype(float)  # the first 60 pairs are labelled
    n, N = 60, 400
    s_zz = np.var(z, ddof=1)
    s_hh = np.var(z_hat_all[:60], ddof=1)
    s_zh = np.cov(z, z_hat_all[:60], ddof=1)[0, 1]
    labels = torch.full((N,), float("nan"), dtype=torch.float64)  # NaN: no human label
    labels[:n] = torch.tensor(z)
    scores = torch.tensor(z_hat_all)
    for alpha, est in (
        (0.3, control_variates_win_rate(labels, scores, alpha=0.3)),
        (1.0, ppi_win_rate(labels, scores)),
    ):
        var = (s_zz - (1 - n / N) * (2 * alpha * s_zh - alpha**2 * s_hh)) / n
        assert est.se == pytest.approx(math.sqrt(var), rel=1e-9)
        assert est.estimate == pytest.approx(z.mean() - alpha * (z_hat_all[:60].mean() - z_hat_all.mean()), rel=1e-9)
    optimal = s_zh / s_hh
    var_opt = (s_zz - (1 - n / N) * (2 * optimal * s_zh - optimal**2 * s_hh)) / n
    assert abs(math.sqrt(var_opt) - ppi_win_rate(labels, scores).se) > 1e-4


# --- pinned to the official implementation (tests/fixtures/reference/cv-winrate) and to hand-derived cases ---------


def test_subset_estimates_match_the_official_evaluators_with_alpha_far_from_one(reference) -> None:
    """Check human-only, synthetic-only and CV estimates per bootstrap replicate against the official
    ControlVariatesEvaluatorV4 / HumanOnlyEvaluator / RmOnlyEvaluator (Zanette-Labs/control_variates_evaluation at
    dfa403d) on the same index arrays. The pool's α* is about 3.7, so CV and PPI (α = 1) differ by far more than the
    tolerance, and a swap of the two fails here."""
    from zoo.metrics.win_rate import subset_estimates

    ref = reference("cv-winrate", "cv4_bootstrap")
    gt, rm = torch.from_numpy(ref["gt"]).float(), torch.from_numpy(ref["rm"]).float()  # V4 works in float32
    idx = torch.from_numpy(ref["idx"])
    est = subset_estimates(gt[idx], rm[idx], rm, ("human", "synthetic", "cv", "ppi"))
    np.testing.assert_allclose(est["cv"].numpy(), ref["cv"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(est["human"].numpy(), ref["human"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(est["synthetic"].numpy()[0], float(rm.double().mean()), rtol=1e-12)
    np.testing.assert_allclose(ref["rm_only"].mean(), rm.double()[idx].mean(), rtol=1e-6)  # RmOnly: a bootstrap mean
    assert float(ref["alpha_star"]) > 3.0
    assert np.abs(est["ppi"].numpy() - ref["cv"]).mean() > 0.05  # PPI is a different estimator here
    alpha = (est["cv"] - est["human"]) / -(rm.double()[idx].mean(1) - rm.double().mean())
    np.testing.assert_allclose(alpha.numpy(), ref["alpha"], rtol=2e-5)  # the official α̂ per replicate


def test_bootstrap_mse_keeps_cv_and_ppi_apart_on_the_official_pool(reference) -> None:
    """Check bootstrap_mse's CV and PPI MSEs against a numpy computation of the official estimators (np.cov ddof 1
    over np.var ddof 0; α = 1) on the index arrays its seeded generator draws, on the pool with α* ≈ 3.7."""
    ref = reference("cv-winrate", "cv4_bootstrap")
    gt, rm = ref["gt"], ref["rm"]
    n_grid, reps, seed = [8, 20], 40, 11
    mse = bootstrap_mse(torch.from_numpy(gt), torch.from_numpy(rm), n_grid, reps=reps, seed=seed)
    g = torch.Generator().manual_seed(seed)
    for i, n in enumerate(n_grid):
        idx = torch.randint(len(gt), (reps, n), generator=g).numpy()
        z, h = gt[idx], rm[idx]
        alpha = np.array([np.cov(a, b)[0, 1] / np.var(b) for a, b in zip(z, h)])
        cv = z.mean(1) - alpha * (h.mean(1) - rm.mean())
        ppi = z.mean(1) - (h.mean(1) - rm.mean())
        assert float(mse["cv"][i]) == pytest.approx(((cv - gt.mean()) ** 2).mean(), rel=1e-9)
        assert float(mse["ppi"][i]) == pytest.approx(((ppi - gt.mean()) ** 2).mean(), rel=1e-9)
        assert abs(float(mse["cv"][i] - mse["ppi"][i])) > 1e-3


def test_annotation_saving_matches_the_official_compute_sample_saving(reference) -> None:
    """Check the per-pair saving (mean over model pairs of ρ²) against the official ResultGrouper.get_corr_mat +
    compute_sample_saving (threshold 100, strict >, so min_count 101 here): dropping the square on ρ, or averaging
    a pooled ρ², fails."""
    from zoo.metrics.pair_saving import AnnotationSaving

    ref = reference("cv-winrate", "pair_saving")
    m = AnnotationSaving(num_llms=3, min_count=int(ref["threshold"]) + 1)
    m.update(*(torch.from_numpy(ref[k]) for k in ("z", "z_hat", "llm_a", "llm_b")))
    assert float(m.compute()) == pytest.approx(float(ref["average_saving"]), rel=1e-6)
    per_pair = m.per_pair().numpy()
    np.testing.assert_allclose(per_pair[0, 1] ** 0.5, ref["corr_mat"][0, 1], rtol=1e-9)
    assert np.isnan(per_pair[1, 2])  # 90 comparisons: under the threshold, as in the official mask


def test_control_variates_win_rate_on_a_hand_derived_case_with_alpha_far_from_one() -> None:
    """Check CV, PPI and the standard error on a case derived by hand.

    Labelled: z = (1, 0, 1, 0), ẑ = (0.6, 0.4, 0.6, 0.4); unlabelled ẑ = (0.4, 0.4, 0.4, 0.4), so N = 8, n = 4.
    z̄_H = 0.5, ẑ̄_H = 0.5, ẑ̄_N = 3.6 / 8 = 0.45. Centred: z − z̄ = ±0.5, ẑ − ẑ̄ = ±0.1 with the same signs, so
    Σ(z − z̄)(ẑ − ẑ̄) = 4 · 0.05 = 0.2 and Σ(ẑ − ẑ̄)² = 0.04, Σ(z − z̄)² = 1.
    Official α̂ = (0.2 / 3) / (0.04 / 4) = 20 / 3; exact (ddof 1 both) α̂ = 0.2 / 0.04 = 5; ρ = 0.2 / √(1 · 0.04) = 1.
    CV = 0.5 − α̂ (0.5 − 0.45): official 0.5 − 1/3 = 1/6, exact 0.25; PPI (α = 1): 0.45.
    Saving ρ²(1 − n/N) = 0.5; se = √((1 − 0.5) · s_z² / n) with s_z² = 1/3: √(1/24).
    """
    z = torch.tensor([1.0, 0.0, 1.0, 0.0, NAN, NAN, NAN, NAN], dtype=torch.float64)
    z_hat = torch.tensor([0.6, 0.4, 0.6, 0.4, 0.4, 0.4, 0.4, 0.4], dtype=torch.float64)
    official = control_variates_win_rate(z, z_hat)
    assert official.alpha == pytest.approx(20 / 3) and official.estimate == pytest.approx(1 / 6)
    assert official.rho == pytest.approx(1.0) and official.predicted_saving == pytest.approx(0.5)
    assert official.se == pytest.approx(math.sqrt(1 / 24))
    exact = control_variates_win_rate(z, z_hat, alpha_ddof="exact")
    assert exact.alpha == pytest.approx(5.0) and exact.estimate == pytest.approx(0.25)
    assert ppi_win_rate(z, z_hat).estimate == pytest.approx(0.45)
    # a fixed α = 5, as the exact α̂: the fixed-α variance (s_z² − (1 − n/N)(2α s_zẑ − α² s_ẑ²)) / n with
    # s_zẑ = 0.2/3, s_ẑ² = 0.04/3: (1/3 − 0.5 (2/3 − 1/3)) / 4 = 1/24, the optimal-α value again
    fixed = control_variates_win_rate(z, z_hat, alpha=5.0)
    assert fixed.se == pytest.approx(math.sqrt(1 / 24)) and fixed.estimate == pytest.approx(0.25)
