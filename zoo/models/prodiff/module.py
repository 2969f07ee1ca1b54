"""``ProDiff``: prototype-guided diffusion that imputes a trajectory window from its two endpoints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.metrics.trajectory import TrajectoryCoverage, TrajectoryError
from zoo.models.prodiff.diffusion import DDIMGrid, EndpointDiffusion, Sampler, hold_endpoints
from zoo.models.prodiff.prototypes import (
    IterativeKMeans,
    TrajectoryTransformer,
    cluster_consistency_loss,
    match_prototypes,
    prototype_triplet_loss,
)
from zoo.models.prodiff.unet import GuidedUNet1D, WideAndDeep
from zoo.module import ZooModule

__all__ = ["ProDiff"]

Scaler = Literal["global", "per_batch"]


def _check_windows(x: Tensor, k: int, name: str = "windows") -> None:
    if x.ndim != 3 or x.shape[1] != 3 or x.shape[2] != k:
        raise ValueError(f"{name} must be [B, 3, {k}] (hours, latitude, longitude channels), got {list(x.shape)}")
    if not torch.isfinite(x[..., [0, -1]]).all():
        raise ValueError(f"{name}: the endpoints hold NaN or infinite values")
    lat = x[:, 1, [0, -1]]
    if (lat.abs() > 90).any():
        raise ValueError(f"{name}: latitudes must lie in [-90, 90], got {float(lat.abs().max()):g}")


class ProDiff(ZooModule):
    """ProDiff (Bu et al., ICML 2025): impute the k − 2 interior points (hours, latitude, longitude) of a window
    from its two endpoints with a 1-D UNet conditioned on the endpoints and on a prototype matched to them.

    Training minimises L = L_J + 0.1 L_C1 + 1.0 L_C2 (the official weights):

    * L_J: the L1 error of the guided ε̂ = (1 + w) ε_θ(x_t, t, J_c) − w ε_θ(x_t, t, J_u) on the interior, where J_c
      sums MLPs of the two endpoints and of the matched prototype, and J_u is a second such module fed zeros;
    * L_C1: cross-entropy of the full windows' features against prototypes, with K-means labels;
    * L_C2: a triplet hinge pulling each feature to its nearest prototype and away from its farthest.

    The prototype is matched from the window with its interior zeroed (all the model sees at test time), under
    ``no_grad``. ``prototypes=False`` is the paper's Diff+Mask ablation: no prototype branch and no L_C1 / L_C2.

    Windows are min-max scaled per channel. ``scaler="global"`` uses the training split's statistics, copied from
    the DataModule's ``scaler`` when a fit starts and saved with the model. ``"per_batch"`` fits them on every
    batch, the official behaviour; at test time it sees the hidden interior points (a leak), so it is not the
    default. Predictions are clamped to [0, 1] before the inverse transform, and the given endpoints are copied into
    the result afterwards.

    Args:
        k: window length (points, both endpoints included).
        ch: UNet base width; ``ch_mult``, ``num_res_blocks``, ``groups`` and ``dropout`` shape the UNet.
        d_model: prototype-extractor width D; ``pce_layers``, ``pce_heads`` and ``pce_ff`` shape its encoder.
        n_prototypes: N.
        prototypes: use the prototype path (False: Diff+Mask).
        guidance: w of the guided ε̂ (2 in the official code).
        num_timesteps: T.
        beta_start: first β of the linear schedule.
        beta_end: last β (0.25 for T = 100 keeps ᾱ_T ≈ 0, as 0.05 does for the official T = 500).
        temperature: of the prototype matching softmax (None: √D, the official near-uniform weighting).
        matched_labels: relabel the K-means clusters to prototypes by a Hungarian assignment before L_C1.
        ce_weight: weight of L_C1.
        triplet_weight: weight of L_C2.
        margin: the triplet margin.
        kmeans_memory: batches of features the K-means refits on.
        lr: AdamW learning rate (default 2e-3; the official 2e-4 leaves the card's short runs undertrained: after
            1500 steps on the city's first version, TC@0.5km 0.15 against 0.32 at 1e-3 and linear's 0.49).
        pce_lr: the prototype extractor's learning rate (default 2e-4, the official rate; ``None``: ``lr``). The
            denoiser's 10× rate collapses the extractor and L_C1 makes the collapse complete (city, seed 0, 1000
            steps; features' cosine to their mean, prototypes nearest to some feature): all at 2e-3, 1.00000 and 1;
            without L_C1 at 2e-3, 0.952 and 1; without L_C2, 0.99999 and 1; all at 2e-4, 0.493 and 7; the extractor
            alone at 2e-4 (the rest 2e-3), 0.560 and 8.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up from lr / warmup_steps, then cosine decay (per step).
        sampler: ``"ddim"`` or ``"ddpm"`` for validation, test and ``impute``.
        sampling_steps: DDIM steps (default 10: on the card's city more steps score lower, 25 by 0.02-0.03 and
            50 by 0.05 at TC@0.5km, as the finer low-noise steps add the denoiser's error).
        eta: DDIM noise scale (0 to 1).
        ddim_grid: ``"trailing"`` (default: the last DDIM step returns x̂_0) or ``"official"`` (the official grid, whose
            last step lands on t = 0 and adds 0.01 ε̂; see :mod:`zoo.models.prodiff.diffusion`).
        scaler: ``"global"`` or ``"per_batch"``.
        centered: scale to [−1, 1] (the usual DDPM data range; default) instead of the official [0, 1]. On the
            card's city, with the rest of the conf, the official range reaches TC@0.5km 0.586 against centred 0.632
            (seed 0, 3000 steps, DDIM 10, 512 test windows; linear interpolation 0.557).
        thresholds_m: coverage thresholds in metres for the validation and test metrics.
        seed: seed of the evaluation noise.

    Example:
        >>> model = ProDiff(k=6, ch=16, groups=4, d_model=16, pce_layers=1, pce_heads=2, pce_ff=32, n_prototypes=4)
        >>> windows = torch.tensor([[[0.0, 0, 0, 0, 0, 1.0], [35.68] * 5 + [35.70], [139.76] * 5 + [139.78]]])
        >>> model.set_scaler([0.0, 35.6, 139.7], [24.0, 35.8, 139.9])  # a fit copies the DataModule's
        >>> out = model.impute(windows, steps=3)
        >>> out.shape, bool(torch.equal(out[..., [0, -1]], windows[..., [0, -1]].double()))
        (torch.Size([1, 3, 6]), True)
    """

    def __init__(
        self,
        k: int = 6,
        ch: int = 32,
        ch_mult: Sequence[int] = (1, 2),
        num_res_blocks: int = 1,
        groups: int = 8,
        dropout: float = 0.1,
        d_model: int = 64,
        pce_layers: int = 2,
        pce_heads: int = 4,
        pce_ff: int = 128,
        n_prototypes: int = 8,
        prototypes: bool = True,
        guidance: float = 2.0,
        num_timesteps: int = 100,
        beta_start: float = 1e-4,
        beta_end: float = 0.25,
        temperature: float | None = None,
        matched_labels: bool = False,
        ce_weight: float = 0.1,
        triplet_weight: float = 1.0,
        margin: float = 1.0,
        kmeans_memory: int = 10,
        lr: float = 2e-3,
        pce_lr: float | None = 2e-4,
        weight_decay: float = 0.01,
        warmup_steps: int = 150,
        sampler: Sampler = "ddim",
        sampling_steps: int = 10,
        eta: float = 0.0,
        ddim_grid: DDIMGrid = "trailing",
        scaler: Scaler = "global",
        centered: bool = True,
        thresholds_m: Sequence[float] = (250.0, 500.0, 1000.0),
        seed: int = 0,
    ) -> None:
        super().__init__()
        if k < 3:
            raise ValueError(f"a window needs at least one interior point besides its two endpoints: k >= 3, got {k}")
        if scaler not in ("global", "per_batch"):
            raise ValueError(f"scaler must be 'global' or 'per_batch', got {scaler!r}")
        if sampler not in ("ddim", "ddpm"):
            raise ValueError(f"sampler must be 'ddim' or 'ddpm', got {sampler!r}")
        if ddim_grid not in ("trailing", "official"):
            raise ValueError(f"ddim_grid must be 'trailing' or 'official', got {ddim_grid!r}")
        if not 1 <= sampling_steps <= num_timesteps:
            raise ValueError(f"sampling_steps must be in [1, num_timesteps = {num_timesteps}], got {sampling_steps}")
        if lr <= 0 or (pce_lr is not None and pce_lr <= 0):
            raise ValueError(f"lr and pce_lr must be > 0, got lr={lr}, pce_lr={pce_lr}")
        if not 0 <= eta <= 1:
            raise ValueError(f"eta must be in [0, 1], got {eta}")
        self.save_hyperparameters()
        self.unet = GuidedUNet1D(ch, ch_mult, num_res_blocks, groups, dropout)
        proto_dim = d_model if prototypes else None
        self.joint = WideAndDeep(self.unet.emb_dim, proto_dim)
        self.place = WideAndDeep(self.unet.emb_dim, proto_dim)  # fed zeros: J_u of the guided ε̂
        self.pce = (
            TrajectoryTransformer(k, d_model, pce_layers, pce_heads, pce_ff, dropout, n_prototypes)
            if prototypes
            else None
        )
        self.diffusion = EndpointDiffusion(num_timesteps, beta_start, beta_end)
        self.kmeans = IterativeKMeans(n_prototypes, memory=kmeans_memory) if prototypes else None
        # The training split's per-channel min and max (set from the DataModule's scaler when a fit starts).
        self.register_buffer("data_min", torch.zeros(3, dtype=torch.float64))
        self.register_buffer("data_max", torch.ones(3, dtype=torch.float64))
        for stage in ("val", "test"):
            self.add_module(f"{stage}_coverage", TrajectoryCoverage(thresholds_m))
            self.add_module(f"{stage}_error", TrajectoryError())

    # ----------------------------------------------------------------------------------------------- scaling
    def _bounds(self, raw: Tensor) -> tuple[Tensor, Tensor]:
        if self.hparams.scaler == "per_batch":  # the official code: statistics of this very batch (leaks at test)
            lo, hi = raw.amin((0, 2)), raw.amax((0, 2))
        else:
            lo, hi = self.data_min, self.data_max
        return lo.to(raw.device, torch.float64).view(1, 3, 1), hi.to(raw.device, torch.float64).view(1, 3, 1)

    def scale(self, raw: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Raw windows → scaled float32 windows (in [0, 1], or [−1, 1] when ``centered``) and the (min, max) used."""
        lo, hi = self._bounds(raw)
        unit = (raw.double() - lo) / (hi - lo).clamp_min(1e-12)
        return (unit * 2 - 1 if self.hparams.centered else unit).float(), (lo, hi)

    def unscale(self, scaled: Tensor, bounds: tuple[Tensor, Tensor]) -> Tensor:
        """Scaled windows → raw units (float64), clamped to the scaler's range first (as the official code)."""
        lo, hi = bounds
        unit = (scaled.double() + 1) / 2 if self.hparams.centered else scaled.double()
        return unit.clamp(0, 1) * (hi - lo) + lo

    # ------------------------------------------------------------------------------------------- the model
    def condition(self, x0: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """(prototypes, features of ``x0``, matched prototype of the masked ``x0``); all None for Diff+Mask."""
        if self.pce is None:
            return None, None, None
        prototypes, features = self.pce(x0)
        with torch.no_grad():  # the query: the window with its interior zeroed, as at test time
            masked = torch.zeros_like(x0)
            masked[..., 0], masked[..., -1] = x0[..., 0], x0[..., -1]
            query = self.pce(masked)[1]
        return prototypes, features, match_prototypes(query, prototypes, self.hparams.temperature)

    def eps(self, x_t: Tensor, t: Tensor, ends: Tensor, matched: Tensor | None) -> Tensor:
        """The guided ε̂ = (1 + w) ε_θ(x_t, t, J_c) − w ε_θ(x_t, t, J_u), both passes in one batch."""
        start, end = ends[..., 0], ends[..., -1]
        zero = torch.zeros_like(start)
        j_c = self.joint(start, end, matched)
        j_u = self.place(zero, zero, None if matched is None else torch.zeros_like(matched))
        both = self.unet(torch.cat([x_t, x_t]), torch.cat([t, t]), torch.cat([j_c, j_u]))
        e_c, e_u = both.chunk(2)
        w = self.hparams.guidance
        return (1 + w) * e_c - w * e_u

    def forward(self, windows: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """Impute ``windows`` [B, 3, k] (raw units; only the endpoints are read); a DataModule batch
        ``(scaled, raw)`` is accepted and its raw windows used."""
        if isinstance(windows, (tuple, list)):
            windows = windows[-1]
        return self.impute(windows, generator=torch.Generator().manual_seed(self.hparams.seed))

    @torch.no_grad()
    def impute(self, windows: Tensor, sampler: Sampler | None = None, steps: int | None = None,
               eta: float | None = None, generator: torch.Generator | None = None,
               progress: bool = False) -> Tensor:  # fmt: skip
        """The imputed windows [B, 3, k] in raw units (float64), endpoints equal to the given ones.

        ``windows`` holds hours, latitude and longitude per point; its interior is ignored except by the
        ``per_batch`` scaler (the official leak). Defaults for ``sampler``, ``steps`` and ``eta`` come from the
        hyperparameters.
        """
        hp = self.hparams
        _check_windows(windows, hp.k)
        if steps is not None and not 1 <= steps <= hp.num_timesteps:
            raise ValueError(f"steps must be in [1, num_timesteps = {hp.num_timesteps}], got {steps}")
        if hp.scaler == "global":
            self._check_in_range(windows)
        x0, (lo, hi) = self.scale(windows.to(self.device))
        if self.hparams.scaler != "per_batch":
            x0 = hold_endpoints(torch.zeros_like(x0), x0)  # nothing of the interior reaches the model
        matched = self.condition(x0)[2]
        scaled = self.diffusion.sample(
            lambda x, t: self.eps(x, t, x0, matched), x0, sampler or hp.sampler,
            hp.sampling_steps if steps is None else steps, hp.eta if eta is None else eta, generator, progress,
            hp.ddim_grid,
        )  # fmt: skip
        out = self.unscale(scaled, (lo, hi))
        return hold_endpoints(out, windows.to(out))

    def fit_scaler(self, windows: Tensor) -> None:
        """Set the global scaler to the per-channel min and max of raw ``windows`` [B, 3, k] (a fit copies the
        DataModule's training-split scaler instead)."""
        _check_windows(windows, self.hparams.k)
        self.set_scaler(windows.double().amin((0, 2)), windows.double().amax((0, 2)))

    def set_scaler(self, data_min: Sequence[float] | Tensor, data_max: Sequence[float] | Tensor) -> None:
        """Set the global scaler's per-channel (hours, latitude, longitude) minimum and maximum, e.g. from a
        DataModule's ``scaler`` (a fit does this itself)."""
        lo = torch.as_tensor(data_min, dtype=torch.float64).flatten()
        hi = torch.as_tensor(data_max, dtype=torch.float64).flatten()
        if lo.shape != (3,) or hi.shape != (3,) or not (hi > lo).all() or not torch.isfinite(torch.cat([lo, hi])).all():
            raise ValueError(
                f"the scaler needs 3 finite (min, max) pairs with max > min, got {lo.tolist()}, {hi.tolist()}"
            )
        self.data_min.copy_(lo)
        self.data_max.copy_(hi)

    def _check_in_range(self, windows: Tensor, slack: float = 0.25) -> None:
        """Refuse an unset scaler, and endpoints whose coordinates lie more than ``slack`` of the training range
        outside it: their imputations would be clamped into the training area."""
        lo, hi = self.data_min.cpu(), self.data_max.cpu()
        if torch.equal(lo, torch.zeros(3, dtype=lo.dtype)) and torch.equal(hi, torch.ones(3, dtype=hi.dtype)):
            raise ValueError(
                "the model's scaler was never set (min 0, max 1 per channel): fit the model on a DataModule, load a "
                "trained checkpoint, or call set_scaler(data_min, data_max)"
            )
        ends = windows[..., [0, -1]].detach().cpu().double()
        for c, name in ((1, "latitude"), (2, "longitude")):
            span = float(hi[c] - lo[c])
            low, high = float(lo[c]) - slack * span, float(hi[c]) + slack * span
            bad = (ends[:, c] < low) | (ends[:, c] > high)
            if bad.any():
                i = int(bad.any(1).nonzero()[0])
                raise ValueError(
                    f"windows[{i}]: endpoint {name} {ends[i, c].tolist()} lies outside the model's training range "
                    f"[{float(lo[c]):.4f}, {float(hi[c]):.4f}] (± {slack:.0%}); its imputation would be clamped into "
                    "the training area. Impute windows from the area the model was trained on."
                )

    @torch.no_grad()
    def prototype_diversity(self, windows: Tensor, min_share: float = 0.01) -> dict[str, float]:
        """How distinct the prototype path is on raw ``windows`` [B, 3, k] (a collapse shows as one prototype used and
        cosines near 1): ``prototypes_used``, the prototypes that are the best cosine match of ProDiff's query (the
        window with its interior zeroed) for at least ``min_share`` of the windows, and ``feature_prototypes_used``,
        the same for the full windows' features (what L_C1 and L_C2 train); ``feature_cosine`` and ``query_cosine``,
        the mean cosine of the features and of the queries to their mean."""
        if self.pce is None:
            raise ValueError("prototype_diversity needs the prototype path (prototypes=True)")
        was_training = self.training
        self.eval()
        x0, _ = self.scale(windows.to(self.device))
        prototypes, features = self.pce(x0)
        query = self.pce(hold_endpoints(torch.zeros_like(x0), x0))[1]
        self.train(was_training)

        def used(v: Tensor) -> float:
            best = (F.normalize(v, dim=-1) @ F.normalize(prototypes, dim=-1).T).argmax(-1)
            share = torch.bincount(best, minlength=len(prototypes)).double() / len(best)
            return float((share >= min_share).sum())

        def to_mean(v: Tensor) -> float:
            return float(F.cosine_similarity(v, v.mean(0, keepdim=True)).mean())

        return {"prototypes_used": used(query), "feature_prototypes_used": used(features),
                "feature_cosine": to_mean(features), "query_cosine": to_mean(query)}  # fmt: skip

    # -------------------------------------------------------------------------------------------- training
    def on_fit_start(self) -> None:
        scaler = getattr(getattr(self.trainer, "datamodule", None), "scaler", None)
        if self.hparams.scaler == "global" and scaler is not None:
            self.set_scaler(scaler.min, scaler.max)

    def on_train_epoch_start(self) -> None:
        if self.kmeans is not None:
            self.kmeans.reset()  # the official code re-creates its K-means every epoch

    def losses(self, raw: Tensor, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """The loss terms on a batch of raw windows; ``generator`` fixes t and ε (evaluation)."""
        hp = self.hparams
        x0, _ = self.scale(raw)
        prototypes, features, matched = self.condition(x0)
        terms: dict[str, Tensor] = {}
        if prototypes is not None:
            # K-means draws its initial centres only when it has none (a loaded model): from a generator of its own,
            # so that t and ε below do not depend on whether the model was loaded or trained in this process.
            km_generator = None if generator is None else torch.Generator().manual_seed(generator.initial_seed() + 1)
            labels = self.kmeans.update(features, generator=km_generator)
            centers = self.kmeans.centers if hp.matched_labels else None
            terms["cluster_ce"] = cluster_consistency_loss(features, prototypes, labels, centers)
            terms["triplet"] = prototype_triplet_loss(features, prototypes, hp.margin)
        device = x0.device
        t = torch.randint(0, hp.num_timesteps, (len(x0),), generator=generator).to(device)
        noise = torch.randn(x0.shape, generator=generator).to(device)
        e = self.eps(self.diffusion.q_sample(x0, t, noise), t, x0, matched)
        terms["diffusion"] = (e - noise)[..., 1:-1].abs().mean()
        terms["loss"] = (
            terms["diffusion"] + hp.ce_weight * terms.get("cluster_ce", 0) + hp.triplet_weight * terms.get("triplet", 0)
        )
        return terms

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        terms = self.losses(batch[-1])
        loss = terms.pop("loss")
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch[-1]))
        self.log_dict({f"train/{k}": v for k, v in terms.items()}, batch_size=len(batch[-1]))
        return loss

    # ------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, batch: tuple[Tensor, ...], batch_idx: int, stage: str) -> Tensor:
        raw = batch[-1]
        seed = self.hparams.seed + batch_idx
        kmeans_state = (self.kmeans.centers, self.kmeans._bank) if self.kmeans is not None else None
        loss = self.losses(raw, generator=torch.Generator().manual_seed(seed))["diffusion"]
        if self.kmeans is not None:  # evaluation must not move the training K-means
            self.kmeans.centers, self.kmeans._bank = kmeans_state
        # A generator of its own: the K-means above draws from its generator only when it has no centres yet (a
        # loaded model), and the imputations must not depend on that.
        pred = self.impute(raw, generator=torch.Generator().manual_seed(seed))
        getattr(self, f"{stage}_coverage").update(pred, raw)
        getattr(self, f"{stage}_error").update(pred, raw)
        self.log(f"{stage}/diffusion_loss", loss, batch_size=len(raw), sync_dist=True)
        return pred

    def _log_metrics(self, stage: str) -> None:
        for name in ("coverage", "error"):
            metric = getattr(self, f"{stage}_{name}")
            self.log_dict({f"{stage}/{k}": v for k, v in metric.compute().items()}, sync_dist=True)
            metric.reset()

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        pred = self._evaluate(batch, batch_idx, "test")
        if batch_idx == 0:
            self._log_map(pred, batch[-1])

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def _log_map(self, pred: Tensor, raw: Tensor, n: int = 8) -> None:
        from zoo.callbacks.images import log_figure
        from zoo.models.prodiff.plots import plot_imputations

        log_figure(self.trainer, "test/imputations", plot_imputations(pred[:n], raw[:n]))

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self.impute(batch[-1], generator=torch.Generator().manual_seed(self.hparams.seed + batch_idx))

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        extractor = list(self.pce.parameters()) if self.pce is not None else []
        ids = {id(p) for p in extractor}
        groups = [{"params": [p for p in self.parameters() if id(p) not in ids]}]
        if extractor:
            groups.append({"params": extractor, "lr": hp.lr if hp.pce_lr is None else hp.pce_lr})
        opt = torch.optim.AdamW(groups, lr=hp.lr, weight_decay=hp.weight_decay)
        total = max(int(self.trainer.estimated_stepping_batches), hp.warmup_steps + 1)

        def schedule(step: int) -> float:  # warm-up from lr / warmup_steps (not 0, card §8), then cosine
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - hp.warmup_steps) / (total - hp.warmup_steps))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def card_notes(self) -> str:
        return (
            "Imputes the interior points of a trajectory window (hours, latitude, longitude) from its two endpoints. "
            "`test/tc@<τ>m` is the fraction of interior points within τ metres (haversine) of the truth; the "
            "official metric also counts the two endpoints, which are exact by construction. Trained on the card's "
            "synthetic street-grid city (a scaled-down UNet and prototype extractor); the paper's WuXi and "
            "FourSquare results are not reproduced."
        )
