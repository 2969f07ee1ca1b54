"""``zoo reproduce pan-sr``: SR alone against PAN+SR and two screen stand-ins on the card's equations (card §5).

Per seed (the seed of data, noise, split, screen and SR), on the card's E1-E3 (I.12.1, I.14.3, I.25.13; p = 102,
153, 102), each with 50 same-distribution irrelevant copies per true variable, all columns permuted, 1,334 rows
split 75/25 (1,000 training rows), noiseless:

* **sr**: gplearn on all p columns;
* **pan_sr**: the PAN screen (R = 20 replicates, the paper's R, of 20 trees with bartMachine's priors, 500 + 500
  draws each: the official chain is 10k + 10k; the rank-clustering rule), then gplearn on the kept columns;
* **random_screen**: as many columns as PAN kept, drawn at random, then gplearn (the screen's stand-in);
* **lasso_screen**: the columns with nonzero coefficients of a 5-fold ``LassoCV`` on standardised X (a linear
  screen in PAN's place; every column when it keeps none), then gplearn.

gplearn runs with the card's §5 settings (population 500, 15 generations, tournament 20, MAE, parsimony 0.001,
p_crossover 0.9, {add, sub, mul, div, sqrt, log, sin, cos}) and the same seed in every arm. Per arm: test R²
clipped at 0, the SymPy solution rate, the number of irrelevant variables in the final expression, expression
size and SR seconds. Each screen also runs on E1-E4 (E4 = I.6.2, screen only) noiseless and at SNR 10: TPR (the
smallest over equations and the mean), FPR and the largest share of the p columns kept.

The claims, the stand-in arms each must reject, and their calibration are in ``CLAIMS`` below.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from zoo.claims import Check, Claim
from zoo.datamodules.symbolic import FEYNMAN, feynman_dataset, split_with_noise
from zoo.models.pan_sr.screen import PanScreen
from zoo.models.pan_sr.sr import (
    GplearnSR,
    expression_variables,
    is_solution,
    r2_zero,
    screen_rates,
    symbols_for,
)
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "SETTINGS", "lasso_select", "run"]

SR_EQUATIONS = ("I.12.1", "I.14.3", "I.25.13")  # card §5 E1-E3
SCREEN_EQUATIONS = (*SR_EQUATIONS, "I.6.2")  # plus E4, screen only
ARMS = ("pan_sr", "random_screen", "lasso_screen", "sr")  # pan_sr first: random_screen draws as many as PAN kept
SCREEN = {"replicates": 20, "num_trees": 20, "burnin": 500, "draws": 500}
SR = {"population": 500, "generations": 15}  # card §5 (SRBench's tuned run is 1,000 x 500)
SETTINGS = {"full": {"seeds": (0, 1, 2)}, "quick": {"seeds": (0,)}}
METRICS = ("r2", "solution", "bad_vars", "expr_size", "sr_seconds")
SCREEN_METRICS = ("tpr_min", "tpr", "fpr", "frac_max", "tpr_snr10", "fpr_snr10")


def lasso_select(X: np.ndarray, y: np.ndarray, seed: int = 0) -> np.ndarray:
    """The columns a 5-fold ``LassoCV`` on standardised X gives nonzero coefficients (a linear screen)."""
    from sklearn.linear_model import LassoCV
    from sklearn.preprocessing import StandardScaler

    coef = LassoCV(cv=5, random_state=seed, n_jobs=1).fit(StandardScaler().fit_transform(X), y).coef_
    return np.flatnonzero(np.abs(coef) > 1e-10)


class _Experiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``; one seed's data and PAN selections are made once."""

    def __init__(self) -> None:
        self.seed = -1
        self.data: dict[tuple[str, float], tuple[Any, ...]] = {}
        self.pan: dict[tuple[str, float], np.ndarray] = {}

    def _split(self, equation: str, snr: float, seed: int) -> tuple[Any, ...]:
        if seed != self.seed:
            self.seed, self.data, self.pan = seed, {}, {}
        if (equation, snr) not in self.data:
            X, y, names = feynman_dataset(equation, seed=seed)
            self.data[equation, snr] = (*split_with_noise(X, y, snr=snr, seed=seed), names)
        return self.data[equation, snr]

    def _select(self, arm: str, equation: str, snr: float, seed: int) -> np.ndarray:
        X_tr, _, y_tr, _, names = self._split(equation, snr, seed)
        if arm == "pan_sr":
            if (equation, snr) not in self.pan:
                self.pan[equation, snr] = PanScreen(**SCREEN, random_state=seed).fit(X_tr, y_tr).selected_
            return self.pan[equation, snr]
        if arm == "random_screen":
            size = max(len(self.pan[equation, snr]), 1)
            return np.sort(np.random.default_rng(seed).choice(len(names), size, replace=False))
        if arm == "lasso_screen":
            return lasso_select(X_tr, y_tr, seed)
        return np.arange(len(names))  # sr: no screen

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
        per_eq = [self._sr(arm, eq, seed) for eq in SR_EQUATIONS]
        out = {k: float(np.mean([m[k] for m in per_eq])) for k in per_eq[0]}
        for eq, m in zip(SR_EQUATIONS, per_eq):
            out[f"r2_{eq}"], out[f"solution_{eq}"] = m["r2"], m["solution"]
        return out | self._screens(arm, seed)

    def _sr(self, arm: str, equation: str, seed: int) -> dict[str, float]:
        X_tr, X_te, y_tr, y_te, names = self._split(equation, 0.0, seed)
        cols = self._select(arm, equation, 0.0, seed)
        if len(cols) == 0:  # the official fallback: SR on every column
            cols = np.arange(len(names))
        kept = [names[i] for i in cols]
        start = time.perf_counter()
        sr = GplearnSR(**SR, seed=seed).fit(X_tr[:, cols], y_tr, kept)
        seconds = time.perf_counter() - start
        r2 = r2_zero(y_te, sr.predict(X_te[:, cols]))
        eq = FEYNMAN[equation]
        expression = sr.expression()
        truth = _truth(equation)
        solved = r2 > 0.5 and is_solution(expression, truth, timeout=60.0)
        import sympy

        return {"r2": r2, "solution": float(bool(solved)), "sr_seconds": seconds,
                "bad_vars": float(len(expression_variables(expression) - set(eq.variables))),
                "expr_size": float(sum(1 for _ in sympy.preorder_traversal(expression)))}  # fmt: skip

    def _screens(self, arm: str, seed: int) -> dict[str, float]:
        if arm == "sr":
            return {}
        out: dict[str, float] = {}
        for snr, tag in ((0.0, ""), (10.0, "_snr10")):
            rates = []
            for eq in SCREEN_EQUATIONS:
                names = self._split(eq, snr, seed)[-1]
                cols = self._select(arm, eq, snr, seed)
                rates.append(screen_rates([names[i] for i in cols], FEYNMAN[eq].variables, names)
                             | {"frac": len(cols) / len(names)})  # fmt: skip
            out[f"tpr{tag}"] = float(np.mean([m["tpr"] for m in rates]))
            out[f"fpr{tag}"] = float(np.mean([m["fpr"] for m in rates]))
            if not tag:
                out["tpr_min"] = float(min(m["tpr"] for m in rates))
                out["frac_max"] = float(max(m["frac"] for m in rates))
        return out


def _truth(equation: str) -> Any:
    import sympy

    eq = FEYNMAN[equation]
    return sympy.sympify(eq.formula, locals=symbols_for(eq.variables))


_RANDOM = "as many columns as PAN kept, drawn uniformly at random, in PAN's place"
_LASSO = "a 5-fold LassoCV on standardised X (a linear screen) in PAN's place"
_SR = "SR alone on all p columns: no screen"

# Calibration: ``zoo reproduce pan-sr --out /tmp/pan-full`` (seeds 0, 1, 2; ``--quick`` is seed 0 of it), per seed:
# R² (E1-E3 mean) pan_sr 1.000 / 1.000 / 1.000, sr 0.363 / 0.658 / 0.641, random_screen 0.000 / 0.325 / 0.000,
# lasso_screen 0.983 / 0.889 / 1.000; noiseless screen FPR (E1-E4 mean) pan_sr 0 / 0 / 0 with TPR 1 on every
# equation, lasso_screen 0.0092 / 0.0883 / 0.0392 (TPR 1 too), random_screen 0.020 / 0.013 / 0.020 (TPR 0-0.375);
# TPR at SNR 10 pan_sr 1 / 1 / 1, random 0.125; kept share of p pan_sr 0.020 (exactly p_0 columns on every
# equation), lasso up to 0.167. Irrelevant variables in SR alone's programs 0.33 / 0 / 0 (so claim iii holds on one
# seed of three), solution rates pan_sr 1 / 1 / 1, lasso 0.67 / 0.67 / 1, sr 0 / 0 / 0.
CLAIMS = (
    Claim(
        "pan_sr_mean_r2_at_least_0.99",
        lambda r, a: r[f"{a}/r2"],
        at_least=0.99,
        method="pan_sr",
        stand_ins={"sr": _SR, "random_screen": _RANDOM},
        text="PAN+SR's test R² (E1-E3 mean) beats SR alone (card §5 assertion ii: expected about 0.99 vs 0.9); "
        "asserted as a level each stand-in misses on every seed (PAN+SR 1.000, SR alone at most 0.66)",
    ),
    Claim(
        "screen_keeps_every_true_variable_in_a_fifth_of_p",
        lambda r, a: r[f"{a}/tpr_min"] if r[f"{a}/frac_max"] <= 0.2 else 0.0,
        at_least=1.0,
        method="pan_sr",
        stand_ins={"random_screen": _RANDOM},
        text="noiseless, the screen keeps every true variable of E1-E4 (TPR = 1) and at most 0.2 p columns "
        "(card §5 assertion i)",
    ),
    Claim(
        "screen_fpr_at_most_0.005_noiseless_with_tpr_1",
        lambda r, a: r[f"{a}/fpr"] if r[f"{a}/tpr_min"] == 1.0 else 1.0,
        at_most=0.005,
        method="pan_sr",
        stand_ins={"lasso_screen": _LASSO, "random_screen": _RANDOM},
        text="noiseless, the screen misses no true variable and keeps almost no irrelevant one (card Fig. 3: FNR "
        "about 0, FPR about 1 %); the linear screen keeps every true variable too, but 0.9-8.8 % of the rest",
    ),
    Claim(
        "screen_tpr_at_least_0.9_at_snr_10",
        lambda r, a: r[f"{a}/tpr_snr10"],
        at_least=0.9,
        method="pan_sr",
        stand_ins={"random_screen": _RANDOM},
        text="at SNR 10 the screen's mean TPR over E1-E4 is ≥ 0.9 (card §5 assertion i)",
    ),
    Claim(
        "pan_sr_fewer_bad_variables_than_sr",
        lambda r, a: r["sr/bad_vars"] - r[f"{a}/bad_vars"],
        at_least=0.05,
        method="pan_sr",
        stand_ins={"random_screen": _RANDOM},
        asserted=False,
        text="the final expressions hold fewer irrelevant variables with the screen (card §5 assertion iii); "
        "reported: SR alone's programs held none on two seeds of three, the tie the card's review foresaw",
    ),
    Claim(
        "pan_sr_solution_rate_at_least_0.9",
        lambda r, a: r[f"{a}/solution"],
        at_least=0.9,
        method="pan_sr",
        stand_ins={"lasso_screen": _LASSO, "sr": _SR, "random_screen": _RANDOM},
        asserted=False,
        text="PAN+SR recovers the exact formulas (SymPy check) where SR alone recovers none; reported, as the card "
        "asks (do not assert recovery counts), and the Lasso screen solved all three on one seed",
    ),
    Claim(
        "sr_stage_at_most_half_the_seconds_of_sr",
        lambda r, a: r[f"{a}/sr_seconds"] / r["sr/sr_seconds"],
        at_most=0.5,
        method="pan_sr",
        stand_ins={"random_screen": _RANDOM},
        asserted=False,
        text="the SR stage is faster on the screened columns (card §5 assertion iv); reported: its review says the "
        "gap comes from gplearn's early stop at an exact fit, not from p, and wall times vary with the load",
    ),
)
CHECKS = (
    Check(
        "sr_alone_r2_at_most_0.8",
        lambda r: r["sr/r2"],
        at_most=0.8,
        text="SR alone on all p columns stays far from exact (the card's review measured R² 0.23-0.66): the "
        "problem needs a screen",
    ),
)


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms over 3 seeds (``quick``: seed 0), print the tables and claims, and (with ``out``) write
    ``pan-sr.json`` and ``pan-sr.png``.

    Returns:
        flat results: ``<arm>/<metric>`` (``r2``, ``solution``, ``bad_vars``, ``expr_size``, ``sr_seconds``, the
        per-equation ``r2_<eq>`` / ``solution_<eq>``, and for the screens ``tpr``, ``tpr_min``, ``fpr``,
        ``frac_max``, ``tpr_snr10``, ``fpr_snr10``), each also per seed, and the verdicts.
    """
    import warnings

    settings = SETTINGS["quick" if quick else "full"]
    start = time.perf_counter()
    r: dict[str, Any] = {"num_seeds": len(settings["seeds"])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LassoCV's convergence chatter on 150 irrelevant columns
        run_arms(list(ARMS), settings["seeds"], _Experiment(), results=r)
    r["seconds"] = time.perf_counter() - start
    n = len(settings["seeds"])
    tables = [
        arm_table(r, ARMS, METRICS, f"SR stage on E1-E3 (p = 102-153, n_train = 1,000, noiseless), {n} seed(s)"),
        arm_table(r, ARMS[:3], SCREEN_METRICS, "screens on E1-E4, noiseless and SNR 10"),
    ]
    notes = ["R² per equation (pan_sr | sr): " + ", ".join(
        f"{eq} {r[f'pan_sr/r2_{eq}']:.3f} | {r[f'sr/r2_{eq}']:.3f}" for eq in SR_EQUATIONS) +
        f"; total {r['seconds']:.0f} s"]  # fmt: skip
    return conclude("pan-sr", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=tables, notes=notes)


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric, title in zip(axes, ("r2", "solution", "bad_vars"),
                                 ("test R² (E1-E3)", "SymPy solution rate", "irrelevant variables in f̂")):  # fmt: skip
        ax.bar(ARMS, [r[f"{a}/{metric}"] for a in ARMS], color=["C2", "C7", "C1", "C0"])
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("PAN+SR vs SR alone and two screen stand-ins (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
