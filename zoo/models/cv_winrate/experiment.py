"""The two experiments of ``zoo reproduce cv-winrate`` (card §5), every estimator and evaluator on the same draws.

* **Part A (statistics)**: simulated human labels with ties and biased logistic synthetic scores at three
  correlations (ρ² ≈ 0.06, 0.21, 0.41; the variance-optimal α* ≈ 0.28, 0.60, 0.94, so PPI's α = 1 is far from it on
  the weak scores) and a random score, a pool of N = 20,000; for each human budget n, thousands of labelled subsets
  drawn uniformly without replacement. Every estimator runs on the same subsets; stratified sampling (which chooses
  which pairs to label) is scored by its exact design variance: it is unbiased by design, and its Monte-Carlo
  estimate, on draws of its own, would carry ±0.03 of noise in its saving at these replicate counts.
* **Part B (tiny arena)**: six synthetic LLMs and a Bradley–Terry MLP reward model: off-the-shelf (trained on a
  shifted population that also hides one feature), fine-tuned on this arena's labels leaving out the evaluated LLM
  (one fold per LLM), and the fine-tuning's stand-ins: the off-the-shelf model trained as many more steps on its own
  population (no arena labels), and the off-the-shelf scores recalibrated by isotonic regression on the same arena
  labels the fine-tuning sees; plus a random score. For every held-out LLM and model pair, the official bootstrap
  (indices with replacement from the pair's pool, n from 20 to 2,000) gives each estimator's MSE against the pair's
  true win rate (stratified sampling: its exact variance with replacement).

Savings are ``1 − MSE / MSE_human`` on the same draws, judged for n ≥ 100 (α̂'s O(1/n) cost, the card's review).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import torch
from torch import Tensor

from zoo.metrics.win_rate import subset_estimates
from zoo.models.cv_winrate.alternatives import isotonic_recalibration, ratio_estimates, stratified_variance
from zoo.models.cv_winrate.scorer import MLPScorer, bradley_terry_loss

__all__ = ["ESTIMATORS", "EVALUATORS", "a_draws", "fit_scorer", "part_a", "part_b", "pool_stats", "simulate_feedback"]

POOL = 20_000  # part A: scored pairs N
NOISES = (2.5, 1.2, 0.6)  # part A: score noise; ρ² ≈ 0.06, 0.21, 0.41
STRATA = 5  # stratified sampling: quintiles of the score, the practitioner's first choice
JUDGED = 100  # savings and biases are judged for n ≥ 100
STEPS = 300  # reward-model training steps (off-the-shelf, and each fine-tuning)
ESTIMATORS = ("cv", "human", "synthetic", "ppi", "ratio", "stratified")
EVALUATORS = ("off-the-shelf", "fine-tuned", "more-shifted", "isotonic", "random")


def simulate_feedback(
    n: int,
    noise: float,
    bias: float = 0.6,
    seed: int = 0,
    informative: bool = True,
    link: Literal["logistic", "calibrated"] = "logistic",
) -> tuple[Tensor, Tensor]:
    """Part A data: human labels ``z`` (ties at 0.5) and biased synthetic scores ``ẑ`` sharing a latent ``u``.

    ``u ~ N(0, 1)``; ``h = u + ε_h / 2``; ``z = 1[h > 0]``, a tie (0.5) when ``|h| < 0.1``; the evaluator sees
    ``s = u + noise·ε_s``. ``link="logistic"`` (the card's): ``ẑ = σ(2s + bias)``, miscalibrated, so E[z | ẑ] bends.
    ``link="calibrated"``: ``ẑ = E[z | s]`` in closed form (h | s is normal with mean s / (1 + noise²) and variance
    noise² / (1 + noise²) + 1/4), so E[z | ẑ] = ẑ: a straight line with slope α* = 1 (``bias`` is unused).
    ``informative=False``: the random-score stand-in, ``u`` in ``s`` replaced by an independent draw (the same
    marginal, ρ ≈ 0; ``z`` unchanged).

    Example:
        >>> z, z_hat = simulate_feedback(1000, noise=1.2, seed=0)
        >>> sorted(set(z.tolist())), bool((z_hat > 0).all() and (z_hat < 1).all()), float(z_hat.mean() - z.mean()) > 0
        ([0.0, 0.5, 1.0], True, True)
    """
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, generator=g, dtype=torch.float64)
    h = u + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    z = (h > 0).double()
    z[h.abs() < 0.1] = 0.5
    eps = torch.randn(n, generator=g, dtype=torch.float64)
    latent = u if informative else torch.randn(n, generator=g, dtype=torch.float64)
    s = latent + noise * eps
    if link == "logistic":
        return z, torch.sigmoid(2.0 * s + bias)
    if link != "calibrated":
        raise ValueError(f"Expected argument `link` to be one of 'logistic', 'calibrated', but got {link!r}.")
    normal = torch.distributions.Normal(0.0, 1.0)
    mu, tau = s / (1 + noise**2), (noise**2 / (1 + noise**2) + 0.25) ** 0.5
    # E[z | s] = P(h > 0.1) + P(|h| < 0.1) / 2
    return z, 1 - 0.5 * normal.cdf((0.1 - mu) / tau) - 0.5 * normal.cdf((-0.1 - mu) / tau)


def pool_stats(z: Tensor, z_hat: Tensor) -> tuple[float, float]:
    """(ρ², α*) of a pool: the squared correlation and the variance-optimal coefficient Cov(z, ẑ) / Var(ẑ)."""
    c = torch.cov(torch.stack([z, z_hat]))
    return float(c[0, 1] ** 2 / (c[0, 0] * c[1, 1])), float(c[0, 1] / c[1, 1])


def a_sizes(quick: bool) -> tuple[int, tuple[int, ...]]:
    """(subsets per budget, budgets n) of part A."""
    return (1000, (100, 200)) if quick else (4000, (50, 100, 200, 500))


def a_draws(z: Tensor, z_hat: Tensor, n: int, reps: int, alpha_star: float, g: torch.Generator) -> dict[str, Tensor]:
    """Every estimator but stratified sampling over ``reps`` size-``n`` subsets of the pool drawn uniformly without
    replacement; chunks keep the (chunk, N) random keys small."""
    chunks: list[dict[str, Tensor]] = []
    for start in range(0, reps, 500):
        chunk = min(500, reps - start)
        idx = torch.rand(chunk, len(z), generator=g).topk(n, dim=1).indices  # top-n of iid keys: a uniform subset
        zs, hs = z[idx], z_hat[idx]
        est = subset_estimates(zs, hs, z_hat, ("human", "synthetic", "cv", "ppi"))
        est["ratio"] = ratio_estimates(zs, hs, z_hat)
        est["cv_oracle_alpha"] = zs.mean(1) - alpha_star * (hs.mean(1) - z_hat.mean())
        chunks.append(est)
    return {m: torch.cat([c[m] for c in chunks]) for m in chunks[0]}


@lru_cache(maxsize=None)  # run() clears it
def part_a(seed: int, quick: bool) -> dict[str, dict[str, float]]:
    """Part A metrics of each arm (``A/<estimator>``, ``A/cv_random_score``) on one seed.

    Per score (``noise<σ>`` or ``random``) and budget n: the estimator's bias in units of the human mean's
    Monte-Carlo SE (one yardstick for every estimator), its saving over the human mean, and the predicted
    ``ρ²(1 − n/N)``. Summaries over n ≥ 100: ``bias_in_se_max`` (|·|), ``saving_min`` and ``saving_mean`` over every
    informative score, ``saving_err`` (the signed relative error (saving − predicted) / predicted of largest size,
    over the scores with ρ² ≥ 0.2; the random-score arm: over the random score), and, at the largest n,
    ``saving_at_nmax`` (the ρ² ≈ 0.2 score).
    """
    reps, budgets = a_sizes(quick)
    g = torch.Generator().manual_seed(1000 + seed)
    scores = {f"noise{noise}": simulate_feedback(POOL, noise, seed=seed) for noise in NOISES}
    scores["random"] = simulate_feedback(POOL, NOISES[1], seed=seed, informative=False)
    arms = [*(f"A/{e}" for e in (*ESTIMATORS, "cv_oracle_alpha")), "A/cv_random_score"]
    m: dict[str, dict[str, float]] = {arm: {} for arm in arms}
    for tag, (z, z_hat) in scores.items():
        rho2, alpha_star = pool_stats(z, z_hat)
        p_star = float(z.mean())
        for n in budgets:
            est = a_draws(z, z_hat, n, reps, alpha_star, g)
            se = float(est["human"].std()) / reps**0.5
            mse_human = float((est["human"] - p_star).square().mean())
            targets = {"cv": "A/cv_random_score"} if tag == "random" else {e: f"A/{e}" for e in (*est, "stratified")}
            for estimator, arm in targets.items():
                cell = f"{tag}/n{n}"
                m[arm][f"{tag}/rho2"], m[arm][f"{tag}/alpha_star"] = rho2, alpha_star
                m[arm][f"{cell}/saving_predicted"] = rho2 * (1 - n / POOL)
                if estimator == "stratified":  # exact: unbiased by design, its variance in closed form (no MC noise)
                    human = float(z.var()) / n * (1 - n / POOL)
                    m[arm][f"{cell}/bias_in_se"] = 0.0
                    m[arm][f"{cell}/saving"] = 1 - stratified_variance(z, z_hat, n, STRATA, replace=False) / human
                    continue
                m[arm][f"{cell}/bias_in_se"] = (float(est[estimator].mean()) - p_star) / se
                m[arm][f"{cell}/saving"] = 1 - float((est[estimator] - p_star).square().mean()) / mse_human
    for arm, metrics in m.items():
        tags = ["random"] if arm == "A/cv_random_score" else [f"noise{x}" for x in NOISES]
        cells = [f"{t}/n{n}" for t in tags for n in budgets if n >= JUDGED]
        strong = [c for c in cells if metrics[f"{c.split('/')[0]}/rho2"] >= 0.15 or arm == "A/cv_random_score"]
        metrics["bias_in_se_max"] = max(abs(metrics[f"{c}/bias_in_se"]) for c in cells)
        metrics["saving_min"] = min(metrics[f"{c}/saving"] for c in cells)
        metrics["saving_mean"] = sum(metrics[f"{c}/saving"] for c in cells) / len(cells)
        errors = [(metrics[f"{c}/saving"] - metrics[f"{c}/saving_predicted"]) / max(metrics[f"{c}/saving_predicted"],
                                                                                    1e-12) for c in strong]  # fmt: skip
        metrics["saving_err"] = max(errors, key=abs)
        metrics["saving_at_nmax"] = metrics[f"{tags[min(1, len(tags) - 1)]}/n{budgets[-1]}/saving"]
    synthetic = m["A/synthetic"]
    synthetic["abs_bias_min"] = min(abs(float(s[1].mean() - s[0].mean())) for t, s in scores.items() if t != "random")
    return m


def fit_scorer(
    scorer: MLPScorer, data: dict[str, Tensor], steps: int, lr: float = 1e-2, batch_size: int = 256, seed: int = 0
) -> MLPScorer:
    """Train ``scorer`` with the Bradley–Terry loss on ``data`` (dict with x, a, b, z; ties ignored), plain AdamW."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.nonzero(data["z"] != 0.5).squeeze(1)
    opt = torch.optim.AdamW(scorer.parameters(), lr=lr)
    for _ in range(steps):
        i = keep[torch.randint(len(keep), (batch_size,), generator=g)]
        loss = bradley_terry_loss(scorer(data["x"][i], data["a"][i]) - scorer(data["x"][i], data["b"][i]), data["z"][i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return scorer.eval()


def b_sizes(quick: bool) -> tuple[int, list[int], range]:
    """(bootstrap replicates, n grid, folds) of part B; the official grid runs n from 10 to 2,000."""
    if quick:
        return 300, [20, 50, 100, 200, 400, 1000], range(3)
    return 1000, [20, 30, 50, 75, 100, 150, 200, 300, 400, 700, 1000, 2000], range(6)


def _bootstrap(z: Tensor, z_hat: Tensor, n_grid: Sequence[int], reps: int, seed: int) -> dict[str, Tensor]:
    """Each estimator's MSE against the pool's human mean over the official bootstrap (with replacement), per n."""
    g = torch.Generator().manual_seed(seed)
    p_star = z.mean()
    out: dict[str, list[Tensor]] = {e: [] for e in ESTIMATORS}
    for n in n_grid:
        idx = torch.randint(len(z), (reps, n), generator=g)
        est = subset_estimates(z[idx], z_hat[idx], z_hat, ("human", "synthetic", "cv", "ppi"))
        est["ratio"] = ratio_estimates(z[idx], z_hat[idx], z_hat)
        for e in ESTIMATORS:
            if e == "stratified":  # exact: its MSE is its design variance (unbiased), no MC noise
                exact = stratified_variance(z, z_hat, n, STRATA) / (float(z.var(correction=0)) / n)
                out[e].append((est["human"] - p_star).square().mean() * exact)  # on the human draws' scale
            else:
                out[e].append((est[e] - p_star).square().mean())
    return {e: torch.stack(v) for e, v in out.items()}


def _score(scorer: MLPScorer, data: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        return torch.sigmoid(scorer(data["x"], data["a"]) - scorer(data["x"], data["b"])).double()


@lru_cache(maxsize=None)  # run() clears it
def part_b(seed: int, quick: bool) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Part B metrics of each arm ``B/<evaluator>/<estimator>`` on one seed, and the mean MSE curves.

    Per arm, means over held-out LLMs and their model pairs: ``rho2`` and ``alpha_star`` of the evaluator's
    scores, ``saving`` (mean over n ≥ 100 of ``1 − MSE / MSE_human``), ``saving_at_nmax`` (at the largest n), the
    MSE at the first and last n, and ``saving_err``: (mean saving − mean ρ²) / mean ρ², as the paper compares the
    averaged saving with the averaged ρ².
    """
    from zoo.datamodules.preferences import PreferenceDataModule

    reps, n_grid, folds = b_sizes(quick)
    torch.manual_seed(seed)
    shifted = PreferenceDataModule(population="shifted", seed=seed + 1)  # other LLMs and prompts (the offshelf conf)
    shifted.setup("fit")
    shifted_data = shifted.train_set.__getitems__(range(len(shifted.train_set)))
    offshelf = fit_scorer(MLPScorer(8, 32), shifted_data, STEPS, seed=seed)
    # the fine-tuning's ablation: as many more steps, on the off-the-shelf population, no arena label
    more = fit_scorer(copy.deepcopy(offshelf).train(), shifted_data, STEPS, seed=7 + 100 * seed)
    big = torch.tensor([n >= JUDGED for n in n_grid])
    per_pair: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, list[Tensor]] = {}
    for k in folds:
        dm = PreferenceDataModule(population="arena", holdout_llm=k, seed=seed)
        dm.setup("fit")
        train = dm.train_set.__getitems__(range(len(dm.train_set)))
        tuned = fit_scorer(copy.deepcopy(offshelf).train(), train, STEPS, seed=k + 100 * seed)
        test = dm.test_comparisons()
        scores = {"off-the-shelf": _score(offshelf, test), "fine-tuned": _score(tuned, test),
                  "more-shifted": _score(more, test)}  # fmt: skip
        scores["isotonic"] = isotonic_recalibration(_score(offshelf, train), train["z"])(scores["off-the-shelf"])
        g = torch.Generator().manual_seed(10_000 + k + 100 * seed)
        scores["random"] = torch.rand(len(test["z"]), generator=g, dtype=torch.float64)
        for evaluator, z_hat in scores.items():
            for rows in dm.pairs("test").values():
                z, h = test["z"][rows].double(), z_hat[rows]
                rho2, alpha_star = pool_stats(z, h)
                mse = _bootstrap(z, h, n_grid, reps, seed=k + 100 * seed)
                for e, values in mse.items():
                    curves.setdefault(f"{evaluator}/{e}", []).append(values)
                    p = per_pair.setdefault(f"B/{evaluator}/{e}", {})
                    for key, value in (("rho2", rho2), ("alpha_star", alpha_star),
                                       ("saving", float((1 - values[big] / mse["human"][big]).mean())),
                                       ("saving_at_nmax", float(1 - values[-1] / mse["human"][-1])),
                                       ("mse_first", float(values[0])), ("mse_last", float(values[-1]))):  # fmt: skip
                        p.setdefault(key, []).append(value)
    arms = {arm: {key: sum(v) / len(v) for key, v in p.items()} for arm, p in per_pair.items()}
    for m in arms.values():  # the paper compares the mean saving with the mean ρ² over pairs
        m["saving_err"] = (m["saving"] - m["rho2"]) / max(m["rho2"], 1e-12)
    return arms, {key: torch.stack(v).mean(0).tolist() for key, v in curves.items()}
