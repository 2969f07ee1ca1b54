"""``zoo reproduce prodiff``: ProDiff against its baselines, its ablations and the cheap alternatives.

On the synthetic street-grid city with habitual routes (1,500 users, k = 6 windows with the time of day, split by
user; a new city per seed; :func:`~zoo.datamodules.street_grid.habit_route`: between two stops several routes are
plausible and the hour settles most of the choice), per seed:

* **ProDiff** (``prodiff``): the conf's model (UNet ch 32, prototype extractor D 64 with 8 prototypes, T 100),
  trained for the conf's steps, imputing every test window with DDIM from its two endpoints;
* baselines: **linear interpolation** (``linear``), every channel linear in the point index; an **MLP regressor on
  the endpoints** (``mlp``), what a learned imputer (SAITS, TimesNet) reduces to when only the endpoints are seen;
* ablations: **Diff+Mask** (``diff_mask``: no prototype path, no L_C1 / L_C2; the paper's), **no triplet loss**
  (``no_triplet``: L_C2 off), and **ProDiff at initialisation** (``untrained``);
* alternatives: the **5 (or 1) training windows with the nearest endpoints** (``knn5``, ``knn1``: their mean shape
  added to the linear path), a **shortest path along the streets** (``street_path``, the map's answer), and the
  **nearest-prototype lookup** (``prototype_lookup``: ProDiff's own match, the matched training windows' mean shape,
  no denoiser).

Metrics on the interior points: coverage TC@{250, 500, 1000} m (haversine), MAE in metres, the flow correlation of
point counts on a 250 m grid, the share of points within 100 m of a street; for ProDiff and its no-triplet ablation,
how many prototypes the test windows' queries use and how alike the extractor's features are (the collapse).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback
from torch import Tensor

from zoo.claims import Check, Claim
from zoo.datamodules.street_grid import latlon_to_km
from zoo.datamodules.trajectories import TrajectoryDataModule
from zoo.metrics.trajectory import TrajectoryCoverage, TrajectoryError, trajectory_correlation
from zoo.models.prodiff.baselines import (
    EndpointNeighbours,
    EndpointRegressor,
    PrototypeLookup,
    linear_interpolation,
    street_path,
)
from zoo.models.prodiff.module import ProDiff
from zoo.models.prodiff.plots import plot_reproduction
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "run"]

ARMS = (
    "prodiff", "linear", "mlp", "diff_mask", "no_triplet", "untrained", "knn5", "knn1", "street_path",
    "prototype_lookup",
)  # fmt: skip
QUICK_ARMS = ("prodiff", "linear", "untrained", "knn5", "street_path", "prototype_lookup")
LABELS = {
    "prodiff": "ProDiff",
    "linear": "linear interpolation (baseline)",
    "mlp": "MLP regressor on the endpoints (baseline)",
    "diff_mask": "Diff+Mask: no prototypes (ablation)",
    "no_triplet": "no triplet loss L_C2 (ablation)",
    "untrained": "ProDiff at initialisation (ablation)",
    "knn5": "5 nearest training windows by endpoints (alternative)",
    "knn1": "nearest training window by endpoints (alternative)",
    "street_path": "shortest path along the streets (alternative)",
    "prototype_lookup": "nearest-prototype lookup, no denoiser (alternative)",
}
_BASELINES = {
    "linear": "linear interpolation between the endpoints (the paper's simplest baseline)",
    "mlp": "an MLP regressor on the endpoints (a learned imputer that sees only the endpoints; L1, 3000 steps)",
}
_ABLATIONS = {
    "diff_mask": "the same diffusion without the prototype path and its two losses (the paper's Diff+Mask)",
    "no_triplet": "ProDiff without the triplet loss L_C2",
    "untrained": "the ProDiff model at initialisation (same seed and sampler), untrained",
}
_ALTERNATIVES = {
    "knn5": "the mean shape of the 5 training windows with the nearest endpoints (hours, lat, lon)",
    "knn1": "the shape of the training window with the nearest endpoints",
    "street_path": "a shortest path along the city's streets, points spaced by linear time",
    "prototype_lookup": "the matched prototype's mean training shape, with no denoiser",
}
DIVERSITY = ("feature_prototypes_used", "feature_cosine", "prototypes_used", "query_cosine")
METRICS = ("tc@250m", "tc@500m", "tc@1000m", "mae_m", "flow@250m", "on_street")
STEPS = 3000
EXAMPLES = 8  # windows in the map plot


def on_street_rate(windows: Tensor, within_km: float = 0.1) -> float:
    """Share of the interior points of raw windows [B, 3, k] within ``within_km`` of a street of the synthetic city
    (a line of the 1 km grid)."""
    x, y = latlon_to_km(windows[:, 1, 1:-1].cpu().numpy(), windows[:, 2, 1:-1].cpu().numpy())
    gap = np.minimum(np.abs(x - np.round(x)), np.abs(y - np.round(y)))
    return float((gap < within_km).mean())


def scores(pred: Tensor, target: Tensor) -> dict[str, float]:
    """The reproduction's metrics of imputed against true raw windows."""
    coverage, error = TrajectoryCoverage((250.0, 500.0, 1000.0)), TrajectoryError()
    coverage.update(pred, target)
    error.update(pred, target)
    return {
        **{k: float(v) for k, v in coverage.compute().items()},
        "mae_m": float(error.compute()["mae_m"]),
        "flow@250m": float(trajectory_correlation(pred, target, grid_m=250.0)),
        "on_street": on_street_rate(pred),
        "endpoint_error_deg": float((pred[..., [0, -1]] - target[..., [0, -1]])[:, 1:].abs().max()),
    }


class _LossTrace(Callback):
    """Every training step's loss (for the loss-decrease check)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


class _Arms:
    """``fn(arm, seed)`` for :func:`zoo.reporting.run_arms`: trains (or builds) one arm on the seed's city and scores
    its imputations of every test window. The ProDiff arm's model is kept for the lookup and untrained arms."""

    def __init__(self, steps: int, sampling_steps: int | None = None) -> None:
        self.steps, self.sampling_steps = steps, sampling_steps
        self._seed: int | None = None
        self.examples: dict[str, Tensor] = {}

    def _data(self, seed: int) -> TrajectoryDataModule:
        if self._seed != seed:
            self._seed, self.dm = seed, TrajectoryDataModule(seed=seed, relative_time=False)
            self.dm.setup("fit")
            self.dm.setup("test")
            self.trained: ProDiff | None = None
            self.initial: dict[str, Tensor] | None = None
        return self.dm

    def _model(self, arm: str, seed: int) -> ProDiff:
        from lightning import seed_everything

        seed_everything(seed, verbose=False)
        return ProDiff(prototypes=arm != "diff_mask", triplet_weight=0.0 if arm == "no_triplet" else 1.0, seed=seed)

    def _fit(self, model: ProDiff) -> dict[str, float]:
        from lightning import Trainer

        trace = _LossTrace()
        trainer = Trainer(
            max_steps=self.steps,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[trace],
        )
        start = time.perf_counter()
        trainer.fit(model, self.dm)
        seconds = time.perf_counter() - start
        n = max(1, len(trace.losses) // 10)
        first, last = sum(trace.losses[:n]) / n, sum(trace.losses[-n:]) / n
        return {"train_seconds": seconds, "loss_drop": 1 - last / first}

    def _impute(self, model: ProDiff, raw: Tensor, seed: int) -> tuple[Tensor, float]:
        model.eval()
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        pred = torch.cat([model.impute(w, steps=self.sampling_steps, generator=generator) for w in raw.split(1024)])
        return pred, len(raw) / (time.perf_counter() - start)

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        dm = self._data(seed)
        raw = dm.test_set.tensors[-1]
        extra: dict[str, float] = {}
        train = dm.train_set.tensors[-1]
        if arm in ("prodiff", "diff_mask", "no_triplet"):
            model = self._model(arm, seed)
            if arm == "prodiff":
                self.initial = {k: v.clone() for k, v in model.state_dict().items()}
            extra = self._fit(model)
            pred, extra["windows_per_second"] = self._impute(model, raw, seed)
            if model.pce is not None:
                extra.update(model.prototype_diversity(raw))
            if arm == "prodiff":
                self.trained = model
                extra.update(self._official_grid(model, raw, pred, seed))
        elif arm == "linear":
            pred = linear_interpolation(raw)
        elif arm == "mlp":
            torch.manual_seed(seed)
            start = time.perf_counter()
            pred = EndpointRegressor(k=raw.shape[-1]).fit(train, steps=self.steps, seed=seed).impute(raw)
            extra = {"train_seconds": time.perf_counter() - start}
        elif arm in ("knn5", "knn1"):
            pred = EndpointNeighbours(train, n_neighbours=int(arm[3:]))(raw)
        elif arm == "street_path":
            pred = street_path(raw)
        elif arm == "prototype_lookup":
            pred = PrototypeLookup(self._trained(arm), train)(raw)
        elif arm == "untrained":  # the ProDiff arm's weights before its first step, with the split's scaler
            model = self._model("prodiff", seed)
            model.load_state_dict({**self._initial(arm), "data_min": self._trained(arm).data_min,
                                   "data_max": self._trained(arm).data_max})  # fmt: skip
            pred, _ = self._impute(model, raw, seed)
        else:
            raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
        if seed == self._first_seed:
            self.examples[arm] = pred[self._example_index(len(raw))]
            self.examples["true"] = raw[self._example_index(len(raw))]
        return {**scores(pred, raw), **extra}

    _first_seed = 0

    def _official_grid(self, model: ProDiff, raw: Tensor, pred: Tensor, seed: int) -> dict[str, float]:
        """The official DDIM grid (last step on t = 0, adding 0.01 ε̂) on the same noise: its scores and how far
        its points land from the default grid's (median, metres)."""
        from zoo.metrics.trajectory import haversine

        model.hparams.ddim_grid = "official"
        try:
            official, _ = self._impute(model, raw, seed)
        finally:
            model.hparams.ddim_grid = "trailing"
        gap = haversine(official[:, 1, 1:-1], official[:, 2, 1:-1], pred[:, 1, 1:-1], pred[:, 2, 1:-1])
        s = scores(official, raw)
        return {"official_grid_tc@500m": s["tc@500m"], "official_grid_mae_m": s["mae_m"],
                "official_grid_gap_m": float(gap.median())}  # fmt: skip

    @staticmethod
    def _example_index(n: int) -> Tensor:
        return torch.linspace(0, n - 1, EXAMPLES).long()

    def _trained(self, arm: str) -> ProDiff:
        if self.trained is None:
            raise RuntimeError(f"the {arm!r} arm needs the 'prodiff' arm of the same seed to run first")
        return self.trained

    def _initial(self, arm: str) -> dict[str, Tensor]:
        if self.initial is None:
            raise RuntimeError(f"the {arm!r} arm needs the 'prodiff' arm of the same seed to run first")
        return self.initial


def _gain_over(reference: str, metric: str = "tc@500m") -> Any:
    return lambda r, arm: r[f"{arm}/{metric}"] - r[f"{reference}/{metric}"]


def _kinds(arms: Sequence[str], drop: Sequence[str] = ()) -> dict[str, Any]:
    """The stand-ins by kind among ``arms`` (a quick run has fewer), less ``drop``; an empty kind says why."""
    kinds = {
        name: {a: why for a, why in kind.items() if a in arms and a not in drop}
        for name, kind in (("baselines", _BASELINES), ("ablations", _ABLATIONS), ("alternatives", _ALTERNATIVES))
    }
    why = {
        name: "run in the full reproduction only (--quick leaves it out)" for name, kind in kinds.items() if not kind
    }
    return {**kinds, "why_none": why}


# Calibration: see the notes of the recorded run (docs/papers/prodiff.md). Every claim is reported, not asserted:
# the shortest path along the streets and the nearest-endpoints lookup beat ProDiff on the embedded city.
def claims(arms: Sequence[str] = ARMS) -> list[Claim]:
    """The claims, with the stand-ins among ``arms`` (the ablation claim needs Diff+Mask)."""
    out = [
        Claim(
            "prodiff_tc500_beats_linear_by_0.05",
            _gain_over("linear"),
            at_least=0.05,
            method="prodiff",
            **_kinds(arms, drop=("linear",)),
            asserted=False,
            text="ProDiff beats linear interpolation: TC@0.5km(ProDiff) ≥ TC@0.5km(linear) + 0.05 (interior points; "
            "card §5), where the other baselines, the ablations and the alternatives do not",
        ),
        Claim(
            "prodiff_prototypes_help_tc500_by_0.01",
            _gain_over("diff_mask"),
            at_least=0.01,
            method="prodiff",
            **_kinds(arms, drop=("diff_mask",)),
            asserted=False,
            text="the paper's ablation (Table 3): the prototypes raise coverage over Diff+Mask by ≥ 0.01 at TC@0.5km",
        ),
    ]
    return out if "diff_mask" in arms else out[:1]


CHECKS = [
    Check(
        "endpoints_within_1e-4_deg",
        lambda r: max(r[f"{a}/endpoint_error_deg"] for a in ("prodiff", "untrained")),
        at_most=1e-4,
        text="the imputed windows keep the given endpoints (within 1e-4°, about 10 m, after inverse scaling)",
    ),
    Check(
        "extractor_features_stay_spread_cosine_at_most_0.999",
        lambda r: r["prodiff/feature_cosine"],
        at_most=0.999,
        text="the prototype extractor's full-window features do not collapse: their mean cosine to their mean stays "
        "≤ 0.999 (collapsed: 1.00000, one prototype nearest to every window). The masked queries the model matches "
        "with are reported beside it (query cosine, prototypes used), not checked: they stay near-constant by design",
    ),
    Check(
        "training_loss_drops_30_percent",
        lambda r: r["prodiff/loss_drop"],
        at_least=0.3,
        text="ProDiff's training loss falls by ≥ 30 % from the first to the last tenth of the steps",
    ),
]
CLAIMS = claims()


def _needs(item: Claim | Check) -> set[str]:
    """The arms a check reads."""
    return {"prodiff", "untrained"}


def _reproduce(quick: bool = False, out: Path | str | None = None, seeds: Sequence[int] | None = None,
               steps: int = STEPS) -> dict[str, Any]:  # fmt: skip
    """:func:`run` with the seeds and steps open (calibration runs more seeds than ``quick``'s one)."""
    start = time.perf_counter()
    seeds = tuple(seeds if seeds is not None else ((0,) if quick else (0, 1, 2)))
    arms = QUICK_ARMS if quick else ARMS
    fn = _Arms(steps)
    fn._first_seed = seeds[0]
    r: dict[str, Any] = {"steps": steps, "num_seeds": len(seeds)}
    run_arms(arms, seeds, fn, results=r)
    r["seconds"] = time.perf_counter() - start
    checks = [c for c in CHECKS if _needs(c) <= set(arms)]
    tables = [
        arm_table(
            r, arms, METRICS, f"street-grid city, k = 6, interior points; mean ± std of {len(seeds)} seed(s)", LABELS
        )
    ]
    notes = [
        (
            f"ProDiff trains {steps} steps in {r['prodiff/train_seconds']:.0f} s and imputes "
            f"{r['prodiff/windows_per_second']:.0f} windows/s (DDIM, {fn.sampling_steps or 'the default'} steps); "
            f"total {r['seconds']:.0f} s"
        )
    ]
    proto_arms = [a for a in ("prodiff", "no_triplet") if a in arms]
    tables.append(arm_table(r, proto_arms, DIVERSITY, "prototype collapse: the extractor on the test windows", LABELS))
    notes.append(
        f"the official DDIM grid (last step on t = 0, adding 0.01 ε̂) on the same noise: TC@0.5km "
        f"{r['prodiff/official_grid_tc@500m']:.3f} against {r['prodiff/tc@500m']:.3f}, MAE "
        f"{r['prodiff/official_grid_mae_m']:.0f} m against {r['prodiff/mae_m']:.0f} m; its points land a median "
        f"{r['prodiff/official_grid_gap_m']:.0f} m from the default grid's"
    )
    if "diff_mask" in arms:
        gaps = ", ".join(
            f"{r[f'prodiff/tc@500m/seed{s}'] - r[f'diff_mask/tc@500m/seed{s}']:+.3f} (seed {s})" for s in seeds
        )
        notes.append(f"ProDiff − Diff+Mask TC@0.5km: {gaps} (the paper's ablation gap)")
    return conclude(
        "prodiff",
        r,
        claims(arms),
        checks,
        out=out,
        plot=lambda r, p: plot_reproduction(r, p, fn.examples, ARMS, LABELS, METRICS[:3]),
        tables=tables,
        notes=notes,
    )


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms, print the tables and claims, and (with ``out``) write ``prodiff.json`` and ``prodiff.png``.

    ``quick`` runs seed 0 only and leaves out the Diff+Mask arm (and the claims and checks that read it); the
    steps are the full run's, so its numbers are the full run's first seed.

    Returns:
        flat results: ``<arm>/<metric>`` means over seeds and ``<arm>/<metric>/seed<s>``, training seconds and
        imputed windows per second, and the claims' and checks' verdicts and numbers (``claims/``, ``reported/``,
        ``checks/``, ``values/``, ``rejects/``, ``seeds_held/``). All values are numbers.
    """
    return _reproduce(quick, out)
