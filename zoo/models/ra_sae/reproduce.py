"""``zoo reproduce ra-sae``: cross-run stability of RA-SAE / A-SAE against TopK SAEs, with the critique's control.

The RA-SAE card's §5 experiment, as a plain loop over the pure-torch parts (no Trainer per cell):

* data: synthetic sparse concepts (d = 32, n = 20,000; k* = 48 identifiable and k* = 256 not), raw and centred;
* each run trains on its own random 50 % subset with its own k-means seed (no shared initialisation);
* arms: (a) TopK SAE, random init; (b) TopK SAE started at the normalised k-means centroids (the critique's
  control); (c) RA-SAE, C = 64 centroids, δ = 1; (d) A-SAE (δ = 0); and two stand-ins of RA-SAE: the RA-SAE at
  initialisation (0 steps: its atoms are its k-means candidates C) and RA-SAE with W frozen at the identity
  (Λ, m and the encoder train, the archetypal mixing does not);
* metrics: stability (Hungarian-matched signed cosine) between the two runs of a seed pair, also restricted to
  atoms alive in both runs; test R²; dead-atom fraction; how far W left the identity; and the floors (two sets of
  random data points, two Gaussian dictionaries);
* the paper's two benchmarks, for every arm (``zoo.models.ra_sae.benchmarks``): identifiability on the same runs
  (matched cosine to the true concepts, best-atom AUROC at telling which concepts a test sample holds), and
  plausibility on a real backbone's activations (each arm trained on a digits CNN's 64-d penultimate layer, scored
  by its best atom cosine with each class direction of a linear probe). Both are reported, not asserted.

Seeds are run r = 0, 1, 2 (full run): each arm's results are per *seed pair* (0, 1), (0, 2), (1, 2), stored as
``<setting>/<arm>/<metric>/seed<p>`` for pair index p (R², dead fraction and W's distance from the identity are
the mean of the pair's two runs), with the means over pairs in ``<setting>/<arm>/<metric>``.

The critique (Brzozowski & Chung, 2026) says the archetypal stability comes from the shared k-means decoder
initialisation; arm (b) tests that, and the table shows it side by side with RA-SAE rather than hiding it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.claims import Check, Claim
from zoo.metrics.dictionary_stability import dictionary_stability, stability_floor_gaussian, stability_floor_points
from zoo.models.ra_sae.benchmarks import digits_backbone_activations, identifiability, plausibility, probe_directions
from zoo.models.ra_sae.sae import SparseAutoencoder, sae_loss
from zoo.nn.kmeans import kmeans_centroids
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["run", "train_arm", "ARMS"]

ARMS: dict[str, dict[str, Any]] = {
    "topk": {"label": "TopK, random init", "dictionary": "free", "free_init": False},
    "topk-kmeans": {"label": "TopK, k-means init (control)", "dictionary": "free", "free_init": True},
    "ra": {"label": "RA-SAE (delta=1)", "dictionary": "ra", "free_init": False},
    "a": {"label": "A-SAE (delta=0)", "dictionary": "a", "free_init": False},
    # Stand-ins of RA-SAE: the same k-means candidates, but untrained, or with its archetypal mixing W not trained.
    "ra-init": {"label": "RA-SAE at initialisation", "dictionary": "ra", "free_init": False, "train": False},
    "ra-frozen-w": {"label": "RA-SAE, W frozen at identity", "dictionary": "ra", "free_init": False, "freeze_w": True},
}


def train_arm(
    x: Tensor,
    arm: str,
    seed: int,
    steps: int,
    num_atoms: int = 64,
    top_k: int = 3,
    delta: float = 1.0,
    batch_size: int = 256,
    lr: float = 1e-3,
) -> tuple[SparseAutoencoder, Tensor, float]:
    """Train one arm on ``x`` ``(n, d)`` with the official loop (Adam, grad-norm clip 1.0, MSE).

    ``"ra-init"`` ignores ``steps`` and returns the RA-SAE as initialised (W = I, so D = C); ``"ra-frozen-w"``
    leaves W out of the optimiser, so it stays the identity while Λ, m and the encoder train.

    Returns ``(sae, initial_dictionary, first_batch_r2)`` (``first_batch_r2`` is NaN when nothing was trained).
    """
    spec = ARMS[arm]
    torch.manual_seed(seed)
    sae = SparseAutoencoder(x.shape[1], num_atoms, top_k, spec["dictionary"], delta=delta, num_candidates=num_atoms)
    if spec["dictionary"] != "free" or spec["free_init"]:
        sae.set_candidates(kmeans_centroids(x, num_atoms, seed=seed), free_init=spec["free_init"])
    D0 = sae.dictionary.get_dictionary().detach().clone()
    if spec.get("freeze_w"):
        sae.dictionary.W.requires_grad_(False)
    steps = steps if spec.get("train", True) else 0
    opt = torch.optim.Adam([p for p in sae.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    per_epoch = len(x) // batch_size
    first_r2 = float("nan")
    for step in range(steps):
        if step and step % per_epoch == 0:
            order = torch.randperm(len(x), generator=g)
        batch = x[order[(step % per_epoch) * batch_size : (step % per_epoch + 1) * batch_size]]
        pre, codes, x_hat = sae(batch)
        loss = sae_loss(batch, x_hat, pre, codes, None)
        if step == 0:
            first_r2 = float(1 - loss.detach() / (batch - batch.mean()).square().mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        opt.step()
    sae.dictionary.project_()
    return sae.eval(), D0, first_r2


@torch.no_grad()
def _evaluate(sae: SparseAutoencoder, x: Tensor) -> tuple[float, Tensor, Tensor]:
    _, codes, x_hat = sae(x)
    r2 = 1 - (x - x_hat).square().sum() / ((x - x.mean()).square().sum() + 1e-6)  # official scalar-mean R²
    return float(r2), (codes > 0).any(0), codes


def _w_off_identity(sae: SparseAutoencoder) -> float | None:
    """Share of each atom's mixing weight that left its own candidate, 1 − mean_i W_ii (W rows sum to 1).

    0 for the identity W = I the archetypal dictionaries start at; ``None`` for a free dictionary (no W).
    """
    if sae.kind == "free":
        return None
    W = sae.dictionary.W.detach()
    return float(1 - W.diagonal().mean())


def _constraint_violation(sae: SparseAutoencoder) -> float | None:
    """Largest violation of the archetypal constraints after training: W ≥ 0, W·1 = 1, ‖Λ_i‖ ≤ δ (0 = feasible)."""
    if sae.kind == "free":
        return None
    d = sae.dictionary
    W, lam_norms = d.W.detach(), d.Lambda.detach().norm(dim=1)
    violations = ((-W).clamp(min=0).max(), (W.sum(1) - 1).abs().max(), (lam_norms - d.delta).max())
    return max(0.0, *(float(v) for v in violations))


# --- claims -------------------------------------------------------------------------------------------------------

# Each setting's bound on "RA-SAE trained" (the smaller of the R² gained over the model at initialisation and W's
# share off the identity); calibrated in `_claims`. In raw space most RA atoms never fire and W barely moves.
_TRAINED_BOUND = {"raw/k48": 0.002, "raw/k256": 0.005, "centred/k48": 0.3, "centred/k256": 0.3}


def _gain(r: Mapping[str, Any], key: str, arm: str, over: str = "topk") -> float:
    """Stability of ``arm`` minus that of ``over`` (TopK, random init, by default) in setting ``key``."""
    return r[f"{key}/{arm}/stability"] - r[f"{key}/{over}/stability"]


def _r2_ratio(r: Mapping[str, Any], key: str, arm: str, over: str = "topk") -> float:
    return r[f"{key}/{arm}/r2"] / r[f"{key}/{over}/r2"]


def _stable_at_r2(r: Mapping[str, Any], key: str, arm: str, gain: float, ratio: float, over: str = "topk") -> float:
    """``min(stability gain over `over` − gain, R² ratio to `over` − ratio)``: ≥ 0 when both hold at once."""
    return min(_gain(r, key, arm, over) - gain, _r2_ratio(r, key, arm, over) - ratio)


def _trained_margin(r: Mapping[str, Any], key: str, arm: str) -> float:
    """The smaller of: the R² gained over the RA-SAE at initialisation, and W's share that left the identity."""
    return min(r[f"{key}/{arm}/r2"] - r[f"{key}/ra-init/r2"], r[f"{key}/{arm}/w_off_identity"])


_CONTROL = "the critique's control, TopK started at the k-means centroids, in the method's place (no gain over itself)"
_UNTRAINED = "RA-SAE at initialisation (0 steps, the same k-means candidates): D = C, stable, but R² far below 0"


def _claims(settings: list[str]) -> tuple[list[Claim], list[Check]]:
    """The card's §5 assertions as claims with the stand-ins they must reject, the critique's test, and checks.

    ``settings``: the ``"<prep>/k<k*>"`` settings of the run; the per-setting "RA-SAE trained" claims follow them.

    Calibration, per seed pair (0,1) / (0,2) / (1,2) (``/seed0`` / ``/seed1`` / ``/seed2``); the full run and the
    quick one at 3 seeds (``--quick`` itself runs pair (0,1) only), numbers also in /tmp/ra_sae-calib/::

        OMP_NUM_THREADS=1 python -c "from zoo.models.ra_sae.reproduce import run; run(seeds=3)"
        OMP_NUM_THREADS=1 python -c "from zoo.models.ra_sae.reproduce import run; run(quick=True, seeds=3)"

    * raw k*=256, stability gain over TopK / R² ratio to TopK (full | quick):
      RA-SAE +0.423 +0.471 +0.489 / 0.785 0.798 0.798 | +0.476 +0.590 +0.574 / 0.807 0.918 0.918;
      untrained RA-SAE +0.445 +0.491 +0.509 / -871 -858 -885 | +0.495 +0.605 +0.588 / -910 -1010 -1034;
      TopK +0 / 1. The gain alone would pass the untrained model (its atoms are the k-means centroids, stability
      0.98), so the claim also bounds the R² ratio: >= 0.75, below RA's weakest 0.785, far above the untrained's.
      Not stand-ins, and passing too: W frozen 0.746–0.757 | 0.770–0.879, A-SAE 0.72–0.74, the k-means-started TopK
      control 1.14–1.16 (gain +0.38–0.45).
    * centred k*=256, R² ratio to TopK: RA-SAE 0.991 0.991 0.988 | 0.987 0.985 0.985; untrained RA-SAE -34.3 -32.3
      -31.8 | -35.0 -32.9 -32.4. Bound 0.9 (the card's). W frozen passes too (0.92–0.94), as does the control.
    * "RA-SAE trained", min(R² gain over the untrained model, W's mass off the identity, 1 − mean_i W_ii). The
      R² gain is hundreds (raw) or ~22 (centred) for every trained arm, so the W term decides. RA-SAE's W term:
      raw k48 0.0054 0.0072 0.0105 (bound 0.002); raw k256 0.0120 0.0135 0.0122 | 0.0124 0.0137 0.0126 (bound
      0.005); centred k48 0.673 0.672 0.667 (bound 0.3); centred k256 0.692 0.691 0.681 | 0.632 0.629 0.622
      (bound 0.3). Both stand-ins, untrained and W frozen, are exactly 0 (W = I). In raw space W moves about 1 %:
      60–75 % of the RA atoms never fire and keep W_ii = 1.
    * reported, centred k*=256, stability gain over TopK at R² >= 0.9 x TopK's: RA-SAE +0.019 +0.043 +0.027 |
      +0.060 +0.051 +0.058, bound +0.01: it holds on every pair but the weakest is within the TopK baseline's
      own spread (± 0.007 over pairs), and the card says report it, not assert it. The control gains +0.015
      +0.032 +0.018 | +0.069 +0.055 +0.069 at the same R²; the untrained model +0.11–0.17 at R² -21.
    * reported, the critique: RA-SAE's stability over the k-means-started TopK control, at R² >= 0.9 x the
      control's. raw k256: +0.047 +0.041 +0.038 | +0.040 +0.038 +0.036 but R² ratio 0.69 | 0.70: does not hold;
      centred k256: +0.004 +0.011 +0.008 | -0.010 -0.003 -0.012 (bound +0.02): does not hold.
    """
    claims: list[Claim] = [
        Claim(
            "raw_k256_stability_gain>=0.20_at_r2>=0.75xtopk",
            lambda r, a: _stable_at_r2(r, "raw/k256", a, gain=0.20, ratio=0.75),
            at_least=0.0,
            method="ra",
            stand_ins={"topk": "the baseline in the method's place (no stability gain)", "ra-init": _UNTRAINED},
            text="raw, k*=256: RA-SAE is far more stable than TopK (gain >= 0.20) at a comparable reconstruction "
            "(R² >= 0.75 x TopK's); the number is the smaller of the two margins",
        ),
        Claim(
            "centred_k256_r2>=0.9xtopk",
            lambda r, a: _r2_ratio(r, "centred/k256", a),
            at_least=0.9,
            method="ra",
            stand_ins={"ra-init": _UNTRAINED},
            text="centred, k*=256: RA-SAE matches TopK's reconstruction, R²(RA) >= 0.9 R²(TopK)",
        ),
    ]
    for key in settings:
        claims.append(
            Claim(
                f"{key.replace('/', '_')}_ra_trained",
                lambda r, a, key=key: _trained_margin(r, key, a),
                at_least=_TRAINED_BOUND[key],
                method="ra",
                stand_ins={
                    "ra-init": "RA-SAE at initialisation: no R² gained, W = I",
                    "ra-frozen-w": "RA-SAE with W frozen at the identity: its R² rises through Λ, m and the encoder",
                },
                text=f"{key}: training moved RA-SAE's W off the identity and raised its R² over the model at "
                f"initialisation (the smaller of the two >= {_TRAINED_BOUND[key]:g})",
            )
        )
    claims += [
        Claim(
            "centred_k256_stability_gain>=0.01_at_r2>=0.9xtopk",
            lambda r, a: _stable_at_r2(r, "centred/k256", a, gain=0.01, ratio=0.9),
            at_least=0.0,
            method="ra",
            stand_ins={"topk": "the baseline in the method's place", "ra-init": _UNTRAINED},
            asserted=False,
            text="centred, k*=256: RA-SAE is more stable than TopK (gain >= 0.01) at equal reconstruction (R² >= 0.9 "
            "x TopK's). Card: report it, do not claim more; the weakest pair's gain, +0.019, is within the TopK "
            "baseline's own spread, and the k-means-initialised TopK control gains as much",
        ),
        *(
            Claim(
                f"{key.replace('/', '_')}_stability_over_kmeans_control>=0.02_at_r2>=0.9x",
                lambda r, a, key=key: _stable_at_r2(r, key, a, gain=0.02, ratio=0.9, over="topk-kmeans"),
                at_least=0.0,
                method="ra",
                stand_ins={"topk-kmeans": _CONTROL},
                asserted=False,
                text=f"{key}: the archetypal constraint adds stability over a TopK SAE started at the same kind of "
                "k-means centroids, at comparable R² (what the critique denies)",
            )
            for key in ("raw/k256", "centred/k256")
        ),
    ]
    violations = [f"{key}/{a}/constraint_violation" for key in settings for a in ("ra", "a", "ra-frozen-w")]
    checks = [
        Check(
            "topk_r2>=0.3_in_every_setting",
            lambda r: min(r[f"{key}/topk/r2"] for key in settings),
            at_least=0.3,
            text="the TopK baseline reconstructs in every setting",
        ),
        Check(
            "archetypal_constraints_hold",
            lambda r: max(r[k] for k in violations if k in r),
            at_most=1e-5,
            text="after training: W >= 0, rows of W sum to 1, ‖Λ_i‖ <= δ (largest violation)",
        ),
        Check(
            "raw_k256_random_points_floor>=0.85",
            lambda r: r["raw/k256/floor_points"],
            at_least=0.85,
            text="the raw cosine floor is high: two random sets of 64 data points already match at >= 0.85 (the "
            "critique's metric-design point; compare every raw stability with it)",
        ),
    ]
    return claims, checks


# --- the experiment -------------------------------------------------------------------------------------------------


def run(quick: bool = False, out: Path | str | None = None, seeds: int | None = None) -> dict[str, Any]:
    """Run the card's grid, print the tables and claims, and (with ``out``) write ``ra-sae.json`` and ``ra-sae.png``.

    ``quick``: 1,500 steps, one seed pair, k* = 256 only, arms topk, topk-kmeans, ra and the two RA stand-ins (about
    1–2 minutes). Full: 3,000 steps, 3 seeds (3 pairs), k* ∈ {48, 256}, all six arms. ``seeds`` overrides the
    number of seeds (calibration).

    Returns:
        flat results, e.g. ``results["raw/k256/ra/stability"]`` (mean over seed pairs) and
        ``results["raw/k256/ra/stability/seed0"]`` (pair 0), plus ``claims/...`` (1.0 when a claim holds).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and does not stall on a shared CPU
    try:
        return _run(quick, out, seeds)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, out: Path | str | None, seeds: int | None) -> dict[str, Any]:
    from zoo.datamodules.activations import make_sparse_concepts

    steps = 1500 if quick else 3000
    n_seeds = seeds or (2 if quick else 3)
    kstars = (256,) if quick else (48, 256)
    arms = ("topk", "topk-kmeans", "ra", "ra-init", "ra-frozen-w") if quick else tuple(ARMS)
    pairs = list(itertools.combinations(range(n_seeds), 2))
    results: dict[str, Any] = {}
    start = time.perf_counter()
    settings: list[str] = []
    for kstar in kstars:
        pool, true_atoms, true_codes = make_sparse_concepts(20_000, 32, kstar, 3, 0.05, seed=0, return_codes=True)
        test = pool[:4000]  # held out from every run
        truth = (true_atoms, true_codes[:4000] > 0)  # the identifiability benchmark's ground truth on the test rows
        train_pool = pool[4000:]
        subsets = [
            torch.randperm(len(train_pool), generator=torch.Generator().manual_seed(100 + r))[: len(train_pool) // 2]
            for r in range(n_seeds)
        ]
        for prep in ("raw", "centred"):
            key = f"{prep}/k{kstar}"
            settings.append(key)
            g = torch.Generator().manual_seed(kstar)
            centre = train_pool.mean(0) if prep == "centred" else torch.zeros(32)
            results[f"{key}/floor_points"] = float(stability_floor_points(train_pool - centre, 64, generator=g))
            results[f"{key}/floor_gaussian"] = float(stability_floor_gaussian(64, 32, generator=g))
            one_run = _run_cache(train_pool, test, subsets, prep == "centred", steps, truth)
            run_arms(arms, range(len(pairs)), _pair_metrics(one_run, pairs), prefix=f"{key}/", results=results)
    _plausibility(arms, range(len(pairs) if quick else n_seeds), steps, results)
    claims, checks = _claims(settings)
    results["seconds"] = time.perf_counter() - start
    tables = [
        arm_table(
            results,
            arms,
            ("stability", "stability_alive", "r2", "dead_fraction", "w_off_identity", "identifiability_cosine",
             "identifiability_auroc"),
            title=f"{key}: stability across runs ({len(pairs)} seed pair(s), {steps} steps); floors: random points "
            f"{results[f'{key}/floor_points']:.2f}, Gaussian {results[f'{key}/floor_gaussian']:.2f}",
            labels={a: ARMS[a]["label"] for a in arms},
            prefix=f"{key}/",
        )
        for key in settings
    ] + [
        arm_table(
            results,
            arms,
            ("plausibility", "r2"),
            title="plausibility: best atom cosine with each class direction of a linear probe, averaged over the 10 "
            f"classes (a digits CNN's 64-d penultimate activations, test accuracy "
            f"{results['plausibility/backbone_accuracy']:.3f}; probe accuracy "
            f"{results['plausibility/probe_accuracy']:.3f})",
            labels={a: ARMS[a]["label"] for a in arms},
            prefix="plausibility/",
        )
    ]
    return conclude(
        "ra-sae",
        results,
        claims,
        checks,
        out=out,
        plot=lambda r, path: _plot(r, settings, arms, path),
        tables=tables,
        notes=_notes(results, settings),
    )


def _plausibility(arms: Sequence[str], seeds: Sequence[int], steps: int, results: dict[str, Any]) -> None:
    """The plausibility benchmark for every arm: SAEs on a real (small) backbone's activations, scored against the
    class directions of a linear probe on the same activations (``zoo.models.ra_sae.benchmarks``)."""
    acts = digits_backbone_activations(seed=0)
    x, labels = acts["train"], acts["train_labels"]
    directions = probe_directions(x, labels)
    # The probe's own held-out accuracy, so the directions are known to carry the classes.
    scores = acts["test"] @ directions.T
    results["plausibility/probe_accuracy"] = float((scores.argmax(1) == acts["test_labels"]).float().mean())
    results["plausibility/backbone_accuracy"] = float(acts["test_accuracy"])
    # A fresh k-means start per arm and seed, as in the stability grid; the activations are left raw (post-ReLU,
    # non-negative, as vision backbones' are).
    spare = acts["test"]

    def arm(name: str, seed: int) -> dict[str, float]:
        sae, _, _ = train_arm(x, name, seed=seed, steps=steps)
        r2, _, _ = _evaluate(sae, spare)
        return {"plausibility": plausibility(sae.dictionary.get_dictionary(), directions), "r2": r2}

    run_arms(arms, seeds, arm, prefix="plausibility/", results=results)


def _run_cache(
    train_pool: Tensor, test: Tensor, subsets: list[Tensor], centred: bool, steps: int, truth: tuple[Tensor, Tensor]
) -> Callable[[str, int], dict[str, Any]]:
    """``one_run(arm, r)``: train arm ``arm`` on run ``r``'s subset once (cached: each run is in two seed pairs)."""
    cache: dict[tuple[str, int], dict[str, Any]] = {}

    def one_run(arm: str, r: int) -> dict[str, Any]:
        if (arm, r) not in cache:
            x = train_pool[subsets[r]]
            mu = x.mean(0) if centred else torch.zeros(x.shape[1])  # each run centres with its own subset
            sae, D0, _ = train_arm(x - mu, arm, seed=r, steps=steps)
            r2, alive, codes = _evaluate(sae, test - mu)
            D = sae.dictionary.get_dictionary()
            found = identifiability(D, codes, *truth)
            cache[(arm, r)] = {
                "identifiability_cosine": found["matched_cosine"],
                "identifiability_auroc": found["auroc"],
                "D": D,
                "alive": alive,
                "r2": r2,
                "moved": float(1 - torch.nn.functional.cosine_similarity(D, D0, dim=1).mean()),
                "w_off_identity": _w_off_identity(sae),
                "constraint_violation": _constraint_violation(sae),
            }
        return cache[(arm, r)]

    return one_run


def _pair_metrics(
    one_run: Callable[[str, int], dict[str, Any]], pairs: list[tuple[int, int]]
) -> Callable[[str, int], dict[str, float]]:
    """``fn(arm, p)`` for ``run_arms``: the stability of seed pair ``p`` and the mean per-run metrics of its runs."""

    def fn(arm: str, p: int) -> dict[str, float]:
        i, j = pairs[p]
        a, b = one_run(arm, i), one_run(arm, j)
        metrics = {
            "stability": float(dictionary_stability(a["D"], b["D"])),
            "stability_alive": float(dictionary_stability(a["D"], b["D"], alive=a["alive"], alive_ref=b["alive"])),
            "r2": (a["r2"] + b["r2"]) / 2,
            "dead_fraction": 1 - float((a["alive"].float().mean() + b["alive"].float().mean()) / 2),
            "moved": (a["moved"] + b["moved"]) / 2,
            **{k: (a[k] + b[k]) / 2 for k in ("identifiability_cosine", "identifiability_auroc")},
        }
        if a["w_off_identity"] is not None:
            metrics["w_off_identity"] = (a["w_off_identity"] + b["w_off_identity"]) / 2
            metrics["constraint_violation"] = max(a["constraint_violation"], b["constraint_violation"])
        return metrics

    return fn


def _notes(r: Mapping[str, Any], settings: list[str]) -> list[str]:
    """What the critique's control and the RA stand-ins show, in numbers from this run."""

    def arm(key: str, name: str) -> str:
        return f"{r[f'{key}/{name}/stability']:.3f} (R² {r[f'{key}/{name}/r2']:.3f})"

    notes = []
    for key in settings:
        if f"{key}/topk-kmeans/stability" not in r:
            continue
        dead = r[f"{key}/ra/dead_fraction"]
        gain, ratio = _gain(r, key, "ra", "topk-kmeans"), _r2_ratio(r, key, "ra", "topk-kmeans")
        notes.append(
            f"{key}: stability (R²): random-init TopK {arm(key, 'topk')}; TopK started at the k-means centroids "
            f"(the critique's control) {arm(key, 'topk-kmeans')}; RA-SAE {arm(key, 'ra')}; RA-SAE with W frozen "
            f"at the identity {arm(key, 'ra-frozen-w')}; untrained RA-SAE {arm(key, 'ra-init')}. RA-SAE vs the "
            f"control: {gain:+.3f} stability at {ratio:.2f}x its R². RA-SAE's W moved "
            f"{r[f'{key}/ra/w_off_identity']:.3f} of its mass off the identity"
            + (f"; {dead:.0%} of its atoms never fire and stay at their centroids." if dead > 0.05 else ".")
        )
    notes.append(
        "The untrained RA-SAE's stability is that of two sets of k-means centroids alone; compare every stability "
        "with it, with the control, and with the random-points floor (raw: "
        + ", ".join(f"{key} {r[f'{key}/floor_points']:.2f}" for key in settings if key.startswith("raw"))
        + ")."
    )
    return notes


def _plot(r: Mapping[str, Any], settings: list[str], arms: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [s + i * width for s in range(len(settings))]
        axes[0].bar(xs, [r[f"{k}/{arm}/stability"] for k in settings], width, label=ARMS[arm]["label"])
        axes[1].bar(xs, [r[f"{k}/{arm}/r2"] for k in settings], width, label=ARMS[arm]["label"])
    for s, key in enumerate(settings):
        span = (s - width / 2, s + 0.8 - width / 2)
        axes[0].hlines(
            r[f"{key}/floor_points"],
            *span,
            colors="k",
            linestyles="--",
            label="floor: random data points" if s == 0 else None,
        )
        axes[0].hlines(
            r[f"{key}/floor_gaussian"],
            *span,
            colors="grey",
            linestyles=":",
            label="floor: Gaussian dictionaries" if s == 0 else None,
        )
    low = -0.25  # the untrained RA-SAE's R² is far below 0 (hundreds raw): clip its bars and print their value
    for i, arm in enumerate(arms):
        for s, key in enumerate(settings):
            if r[f"{key}/{arm}/r2"] < low:
                axes[1].text(s + i * width, low + 0.02, f"{r[f'{key}/{arm}/r2']:.0f}", ha="center", fontsize=6)
    for ax, title, bottom in zip(axes, ("stability across runs (matched cosine)", "test R² (clipped below)"), (0, low)):
        ax.set_xticks([s + 0.4 - width / 2 for s in range(len(settings))], settings)
        ax.set_title(title)
        ax.set_ylim(bottom, 1.05)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=4)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
