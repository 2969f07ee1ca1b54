"""PAN+SR: the Feynman data and SRBench files, the BART backend's priors, the screen's rules, the SR stage's metrics,
and the Lightning module's fit, hub round trip and bad-input errors."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sympy
import torch
from lightning import Trainer

from zoo import hub
from zoo.datamodules.symbolic import FEYNMAN, SymbolicDataModule, feynman_dataset, read_tsv, split_with_noise
from zoo.models.pan_sr import PanScreen, PanSR, StochtreeBART, permutation_select, rank_cluster_select, vip
from zoo.models.pan_sr.bart import sigma_prior
from zoo.models.pan_sr.screen import gse_constant
from zoo.models.pan_sr.sr import GplearnSR, PySRSR, gplearn_to_sympy, is_solution, r2_zero, screen_rates

FAST_SCREEN = {"replicates": 5, "burnin": 200, "draws": 200}
FAST_SR = {"population": 500, "generations": 10}


def _trainer() -> Trainer:
    return Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False)  # fmt: skip


# -- data ---------------------------------------------------------------------------------------------------------------
def test_irrelevant_copies_share_each_true_variables_distribution() -> None:
    X, y, names = feynman_dataset("I.6.2", n=2000, copies=50, seed=0)
    assert X.shape == (2000, 102) and len(set(names)) == 102
    assert names.index("sigma") != 0 or names.index("theta") != 1  # columns are permuted
    assert X.min() >= 1.0 and X.max() <= 3.0  # I.6.2's variables and all their copies are U[1, 3]
    X, y, names = feynman_dataset("I.10.7", n=4000, copies=50, seed=0)
    assert X.shape[1] == 153
    # 50 copies per true variable, each with that variable's range: v ~ U[1, 2], c ~ U[3, 10], m_0 ~ U[1, 5]
    highs = np.sort(np.round(X.max(0)))
    assert (highs == 2).sum() == 51 and (highs == 10).sum() == 51 and (highs == 5).sum() == 51
    cols = {n: X[:, names.index(n)] for n in ("m_0", "v", "c")}
    np.testing.assert_allclose(y, cols["m_0"] / np.sqrt(1 - cols["v"] ** 2 / cols["c"] ** 2))


def test_noise_is_added_before_the_split_at_the_asked_snr() -> None:
    X, y, _ = feynman_dataset("I.14.3", n=40000, copies=1, seed=0)
    X_tr, X_te, y_tr, y_te = split_with_noise(X, y, snr=10, seed=0)
    assert len(y_tr) == 30000 and len(y_te) == 10000
    names = feynman_dataset("I.14.3", n=40000, copies=1, seed=0)[2]
    f = lambda A: np.prod(A[:, [names.index(v) for v in ("m", "g", "z")]], axis=1)  # noqa: E731
    noise = np.concatenate([y_tr - f(X_tr), y_te - f(X_te)])  # both splits carry noise
    assert np.var(y) / np.var(noise) == pytest.approx(10, rel=0.05)
    _, _, y_tr, y_te = split_with_noise(X, y, snr=0, n_train=1000, seed=0)
    assert len(y_tr) == 1000 and len(y_te) == math.ceil(1000 / 3)
    with pytest.raises(ValueError, match="n_train=40000"):
        split_with_noise(X, y, n_train=40000)
    with pytest.raises(ValueError, match="snr"):
        split_with_noise(X, y, snr=-1)


def test_unknown_equation_names_close_matches() -> None:
    with pytest.raises(KeyError, match="I.14.3"):
        SymbolicDataModule("I.14.4x")


def _write_tsv(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        frame.to_csv(f, sep="\t", index=False)


def test_srbench_feynman_file_is_the_real_path(tmp_path: Path) -> None:
    """A file in the official generator's layout (true columns first, x_bad_*, target) through the DataModule and
    PanSR: the equation is found by name, so the solution check runs."""
    X, y, names = feynman_dataset("I.12.1", n=400, copies=5, seed=1)
    frame = pd.DataFrame(X, columns=names).assign(target=y)
    _write_tsv(tmp_path / "I.12.1" / "feynman_I.12.1.tsv.gz", frame)
    dm = SymbolicDataModule(data_dir=str(tmp_path), dataset="I.12.1")
    dm.setup()
    assert dm.formula == "mu*Nn" and sorted(dm.true_variables) == ["Nn", "mu"]
    model = PanSR(**FAST_SCREEN, **FAST_SR)
    trainer = _trainer()
    trainer.fit(model, dm)
    metrics = trainer.test(model, dm, verbose=False)[0]
    assert metrics["test/r2"] == pytest.approx(1.0) and metrics["test/solution"] == 1.0
    assert metrics["test/tpr"] == 1.0 and metrics["test/bad_vars"] == 0.0


def test_pmlb_file_without_ground_truth(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.uniform(1, 2, (200, 4)), columns=["a", "b", "c", "d"])
    frame["target"] = frame["a"] * 3 + frame["c"]
    _write_tsv(tmp_path / "toy" / "toy.tsv.gz", frame)
    X, y, names = read_tsv(tmp_path / "toy" / "toy.tsv.gz")
    assert X.shape == (200, 4) and names == ["a", "b", "c", "d"]
    dm = SymbolicDataModule(data_dir=str(tmp_path), dataset="toy", n_train=120)
    dm.setup()
    assert dm.formula is None and dm.true_variables == []
    X_tr, y_tr = next(iter(dm.train_dataloader()))  # black-box data: standardised with the training split's statistics
    assert X_tr.shape == (120, 4) and len(dm.test_set) == 40
    torch.testing.assert_close(X_tr.mean(0), torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(y_tr.std(unbiased=False), torch.tensor(1.0, dtype=torch.float64))
    raw = SymbolicDataModule(data_dir=str(tmp_path), dataset="toy", standardize=False)
    raw.setup()
    assert next(iter(raw.train_dataloader()))[0].min() >= 1.0
    with pytest.raises(FileNotFoundError, match="toy"):
        SymbolicDataModule(data_dir=str(tmp_path), dataset="tyo").setup()
    frame.drop(columns="target").to_csv(tmp_path / "bad.tsv", sep="\t", index=False)
    with pytest.raises(ValueError, match="no 'target' column"):
        read_tsv(tmp_path / "bad.tsv")


def test_pmlb_file_fits_through_the_conf(tmp_path: Path) -> None:
    """The real path a user takes: a PMLB-layout file through ``conf/pan-sr.yaml`` (short chains and search), then
    ``test``: R² on the standardised black-box data, no TPR or solution check without ground truth."""
    from zoo.hub import conf_path
    from zoo.lightning_cli import ZooCLI

    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.uniform(1, 2, (400, 12)), columns=[f"f{i}" for i in range(12)])
    frame["target"] = frame["f3"] * frame["f7"]
    _write_tsv(tmp_path / "pmlb_toy" / "pmlb_toy.tsv.gz", frame)
    small = {"replicates": 4, "burnin": 150, "draws": 150, "population": 300, "generations": 8}
    cli = ZooCLI(
        args=["-c", str(conf_path("pan-sr")), "--data.init_args.data_dir", str(tmp_path),
              "--data.init_args.dataset", "pmlb_toy", *[f"--model.init_args.{k}={v}" for k, v in small.items()],
              "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    assert set(cli.model.fitted["selected"]) >= {"f3", "f7"} and len(cli.model.fitted["selected"]) <= 4
    metrics = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0]
    assert metrics["test/r2"] > 0.95 and "test/tpr" not in metrics and "test/solution" not in metrics


# -- the BART backend ---------------------------------------------------------------------------------------------------
def test_sigma_prior_puts_mass_q_below_the_ols_estimate() -> None:
    from scipy.stats import invgamma

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 5))
    y = X @ np.arange(5.0) + rng.normal(0, 0.3, 500)
    shape, scale = sigma_prior(X, y, nu=3, q=0.9)
    design = np.column_stack([np.ones(500), X])
    resid = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    sigma_hat2 = resid @ resid / (500 - 6)
    assert shape == 1.5
    assert invgamma.cdf(sigma_hat2, shape, scale=scale) == pytest.approx(0.9, abs=1e-9)


def test_bart_split_counts_concentrate_on_the_signal() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(300, 8))
    counts = StochtreeBART(num_trees=20, burnin=100, draws=100).split_counts(X, np.sin(6 * X[:, 5]), seed=0)
    assert counts.shape == (8,) and counts[5] > 0.5 * counts.sum()


# -- the screen's rules -------------------------------------------------------------------------------------------------
def test_vip_rows_sum_to_one() -> None:
    v = vip(np.array([[3, 1, 0, 0], [0, 0, 0, 0]]))
    np.testing.assert_allclose(v, [[0.75, 0.25, 0, 0], [0, 0, 0, 0]])


def test_rank_rule_ranks_within_replicates_with_average_ties() -> None:
    # replicate 0 favours x0, replicate 1 x1; x2..x5 never split (tied at the average rank 4.5)
    vips = np.array([[0.7, 0.3, 0, 0, 0, 0], [0.4, 0.6, 0, 0, 0, 0]])
    selected, mean_rank = rank_cluster_select(vips)
    np.testing.assert_allclose(mean_rank, [1.5, 1.5, 4.5, 4.5, 4.5, 4.5])
    np.testing.assert_array_equal(selected, [0, 1])
    # averaging VIPs first would rank x0 (0.55) above x1 (0.45); averaging ranks ties them (the card's pitfall)
    assert mean_rank[0] == mean_rank[1]


def test_rank_rule_keeps_the_cluster_of_smaller_mean_rank_even_when_it_is_larger() -> None:
    # 4 clearly important variables and 2 clearly unimportant ones: the kept cluster is the larger one here
    vips = np.array([[0.25, 0.24, 0.26, 0.25, 0.0, 0.0]] * 3)
    np.testing.assert_array_equal(rank_cluster_select(vips)[0], [0, 1, 2, 3])
    assert len(rank_cluster_select(np.zeros((2, 5)))[0]) == 0  # all tied: nothing stands out


def test_permutation_rules() -> None:
    rng = np.random.default_rng(0)
    null = rng.uniform(0, 0.1, (200, 5))
    observed = np.array([0.5, 0.095, 0.2, 0.0, 0.02])
    local = permutation_select(observed, null, "local", 0.05)
    gmax = permutation_select(observed, null, "gmax", 0.05)
    gse = permutation_select(observed, null, "gse", 0.05)
    np.testing.assert_array_equal(local, [0, 1, 2])  # 0.095 beats its own 95 % quantile (0.095 > ~0.094)...
    np.testing.assert_array_equal(gmax, [0, 2])  # ...but not the quantile of the row maxima
    assert set(gse) <= set(local) and 0 in gse
    c = gse_constant(null, 0.05)
    m, s = null.mean(0), null.std(0, ddof=1)
    assert np.mean(np.all(null <= m + c * s, axis=1)) >= 0.95
    assert c == 1.0 or np.mean(np.all(null <= m + (c - 0.02) * s, axis=1)) < 0.95  # the smallest such C (tol 0.01)
    one = np.array([0.5, 0, 0, 0, 0])
    assert permutation_select(one, null, "local").tolist() == [0]
    assert permutation_select(one, null, "local", faithful_quirks=True).tolist() == []  # BART_perm.R's NA
    with pytest.raises(ValueError, match="unknown permutation rule"):
        permutation_select(one, null, "bonferroni")


def test_screen_is_a_sklearn_selector_and_finds_the_true_variables() -> None:
    from sklearn.base import clone

    X, y, names = feynman_dataset("I.14.3", n=600, copies=10, seed=0)
    screen = PanScreen(**FAST_SCREEN).fit(X, y)
    assert sorted(screen.selected_names(names)) == ["g", "m", "z"]
    assert screen.get_support().sum() == 3 and screen.transform(X).shape == (600, 3)
    assert screen.vips_.shape == (5, 33) and np.allclose(screen.vips_.sum(1), 1)
    assert clone(screen).get_params()["replicates"] == 5
    top = PanScreen(**FAST_SCREEN, max_features=2).fit(X, y)
    assert len(top.selected_) == 2 and set(top.selected_) <= set(screen.selected_)
    perm = PanScreen(rule="local", permutations=4, **FAST_SCREEN).fit(X, y)
    assert perm.null_.shape == (4, 33) and {"g", "m", "z"} <= set(perm.selected_names(names))


def test_screen_bad_input_errors() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(50, 4))
    y = X[:, 0]
    with pytest.raises(ValueError, match="NaN or infinite entries .*row 3, column 1"):
        X_nan = X.copy()
        X_nan[3, 1] = np.nan
        PanScreen(**FAST_SCREEN).fit(X_nan, y)
    with pytest.raises(ValueError, match=r"constant column\(s\) \(indices \[2\]\)"):
        X_const = X.copy()
        X_const[:, 2] = 1.0
        PanScreen(**FAST_SCREEN).fit(X_const, y)
    with pytest.raises(ValueError, match="max_features=9 but X has 4 variables"):
        PanScreen(**FAST_SCREEN, max_features=9).fit(X, y)
    with pytest.raises(ValueError, match="y is constant"):
        PanScreen(**FAST_SCREEN).fit(X, np.ones(50))
    with pytest.raises(ValueError, match="unknown rule"):
        PanScreen(rule="hclust").fit(X, y)
    with pytest.raises(ValueError, match="4 features"):
        PanScreen(**FAST_SCREEN).fit(X, y).transform(X[:, :3])


# -- the SR stage and metrics -------------------------------------------------------------------------------------------
def test_gplearn_programs_parse_to_sympy_on_the_positive_domain() -> None:
    e = gplearn_to_sympy("div(mul(q, sqrt(mul(C, C))), mul(C, C))", ["q", "C"])
    assert sympy.simplify(e - sympy.Symbol("q", positive=True) / sympy.Symbol("C", positive=True)) == 0
    assert str(gplearn_to_sympy("log(x0)", ["x0"])) == "log(x0)"  # |x0| = x0 for a positive variable


def test_solution_check_is_difference_or_ratio_constant() -> None:
    a, b = sympy.symbols("a b", positive=True)
    assert is_solution(a * b - 2.5, a * b) and is_solution(0.3 * a * b, a * b)
    assert not is_solution(a * b + a, a * b) and not is_solution(sympy.Integer(0), a * b)
    assert is_solution(sympy.sqrt(a**2) * b, a * b)


def test_r2_zero_and_screen_rates() -> None:
    y = np.array([1.0, 2.0, 3.0])
    assert r2_zero(y, y) == 1.0 and r2_zero(y, -y) == 0.0 and r2_zero(y, np.array([1, np.nan, 3])) == 0.0
    rates = screen_rates(["a", "x1"], ["a", "b"], ["a", "b", "x1", "x2", "x3", "x4"])
    assert rates == {"tpr": 0.5, "fnr": 0.5, "fpr": 0.25, "num_selected": 2.0}


def test_gplearn_backend_finds_an_exact_product() -> None:
    X = np.random.default_rng(0).uniform(1, 5, (300, 3))
    sr = GplearnSR(**FAST_SR).fit(X, X[:, 0] * X[:, 2], ["u", "v", "w"])
    assert str(sr.expression()) == "u*w" and r2_zero(X[:, 0] * X[:, 2], sr.predict(X)) == 1.0


def test_pysr_backend_says_what_it_needs() -> None:
    try:
        import pysr  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="Julia"):
            PySRSR().fit(np.ones((3, 1)), np.ones(3), ["x"])
    else:
        pytest.skip("pysr is installed here")


# -- the module ---------------------------------------------------------------------------------------------------------
def test_module_fits_saves_and_reloads_the_expression(tmp_path: Path) -> None:
    dm = SymbolicDataModule("I.25.13", copies=10, n=800, seed=0)
    model = PanSR(**FAST_SCREEN, population=500, generations=10)
    trainer = _trainer()
    trainer.fit(model, dm)
    metrics = trainer.test(model, dm, verbose=False)[0]
    assert model.fitted["selected"] == sorted(model.fitted["selected"], key=dm.feature_names.index)
    assert set(model.fitted["selected"]) == {"q", "C"} and metrics["test/tpr"] == 1.0
    assert metrics["test/r2"] > 0.99 and metrics["test/solution"] == 1.0
    hub.write_entry(model, tmp_path / "entry", zoo_meta={"name": "pan-sr"}, card_text="# pan-sr\n")
    again = PanSR.from_pretrained(tmp_path / "entry")
    assert again.fitted == model.fitted and str(again.expression) == str(model.expression)
    X = next(iter(dm.test_dataloader()))[0]
    torch.testing.assert_close(again(X), model(X), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"expected X of shape \(n, 22\)"):
        again(X[:, :5])


def test_sr_alone_and_the_empty_screen_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    X, y, names = feynman_dataset("I.12.1", n=300, copies=3, seed=0)
    alone = PanSR(screen=False, **FAST_SR)
    alone.fit_arrays(X, y, names, ["mu", "Nn"], "mu*Nn")
    assert alone.fitted["selected"] == [] and not alone.fitted["screen_fallback"]
    assert alone.evaluate_arrays(X, y)["num_selected"] == 8  # SR alone "keeps" every column

    def keep_none(self: PanScreen, X: np.ndarray, y: np.ndarray) -> PanScreen:
        self.selected_ = np.array([], dtype=np.int64)
        return self

    monkeypatch.setattr(PanScreen, "fit", keep_none)
    model = PanSR(**FAST_SR)
    model.fit_arrays(X, y, names)
    assert model.fitted["screen_fallback"] and model.fitted["expression"]


def test_module_bad_input_and_unfitted_model() -> None:
    model = PanSR()
    assert torch.equal(model(torch.ones(4, 7, dtype=torch.float64)), torch.zeros(4, dtype=torch.float64))
    X = np.ones((10, 3))
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        model.fit_arrays(X, np.arange(10.0))
    with pytest.raises(ValueError, match="2 feature names for 3 columns"):
        model.fit_arrays(np.ones((10, 3)), np.arange(10.0), ["a", "b"])
    with pytest.raises(ValueError, match="sr must be"):
        PanSR(sr="operon")


def test_feynman_table_formulas_use_their_variables() -> None:
    for name, eq in FEYNMAN.items():
        expr = sympy.sympify(eq.formula, locals={v: sympy.Symbol(v) for v in eq.variables})
        assert {str(s) for s in expr.free_symbols} == set(eq.variables), name


# -- the reproduction's claims ------------------------------------------------------------------------------------------
def _made_up_results() -> dict[str, float]:
    """Numbers shaped like one seed of ``zoo reproduce pan-sr`` (the calibration run's seed 0, rounded)."""
    arms = {
        "pan_sr": {"r2": 1.0, "solution": 1.0, "bad_vars": 0.0, "sr_seconds": 1.1, "tpr_min": 1.0, "tpr": 1.0,
                   "fpr": 0.0, "frac_max": 0.02, "tpr_snr10": 1.0},
        "lasso_screen": {"r2": 0.98, "solution": 0.67, "bad_vars": 0.0, "sr_seconds": 1.5, "tpr_min": 1.0,
                         "tpr": 1.0, "fpr": 0.009, "frac_max": 0.04, "tpr_snr10": 1.0},
        "random_screen": {"r2": 0.0, "solution": 0.0, "bad_vars": 1.7, "sr_seconds": 3.1, "tpr_min": 0.0,
                          "tpr": 0.0, "fpr": 0.02, "frac_max": 0.02, "tpr_snr10": 0.125},
        "sr": {"r2": 0.36, "solution": 0.0, "bad_vars": 0.33, "sr_seconds": 2.3},
    }  # fmt: skip
    return {f"{arm}/{k}": v for arm, metrics in arms.items() for k, v in metrics.items()}


def test_reproduction_claims_reject_their_stand_ins() -> None:
    """Check on made-up results that each claim fails for every stand-in in its place, that a screen no better
    than the Lasso fails the FPR claim and SR alone's R² fails the R² claim, and which claims are only reported."""
    from zoo.claims import evaluate
    from zoo.models.pan_sr.reproduce import ARMS, CLAIMS

    r = _made_up_results()
    out = evaluate(r, CLAIMS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0, claim.name
        assert set(claim.stand_ins) <= set(ARMS)
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins), claim.name
    asserted = {c.name for c in CLAIMS if c.asserted}
    assert "lasso_screen" in {arm for c in CLAIMS if c.asserted for arm in c.stand_ins}  # the two stand-ins
    assert {"pan_sr_fewer_bad_variables_than_sr", "pan_sr_solution_rate_at_least_0.9"}.isdisjoint(asserted)
    for key in ("fpr", "r2", "tpr_min", "tpr_snr10", "frac_max"):  # PAN no better than the Lasso screen
        r[f"pan_sr/{key}"] = r[f"lasso_screen/{key}"]
    assert evaluate(r, CLAIMS)["claims/screen_fpr_at_most_0.005_noiseless_with_tpr_1"] == 0.0
    r["pan_sr/r2"] = r["sr/r2"]
    assert evaluate(r, CLAIMS)["claims/pan_sr_mean_r2_at_least_0.99"] == 0.0
    r["pan_sr/fpr"], r["pan_sr/tpr_min"] = 0.0, 0.5  # keeping nothing irrelevant by missing a true variable
    assert evaluate(r, CLAIMS)["claims/screen_fpr_at_most_0.005_noiseless_with_tpr_1"] == 0.0


def test_lasso_screen_keeps_linear_signal_columns() -> None:
    from zoo.models.pan_sr.reproduce import lasso_select

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 20))
    assert {2, 11} <= set(lasso_select(X, 3 * X[:, 2] - 2 * X[:, 11] + 0.01 * rng.normal(size=300)).tolist())
