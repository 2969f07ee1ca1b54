"""``RCSCModule``: RCSC's alternating optimisation as a manual-optimisation LightningModule, one round per step.

No official code: the objective is the card's marked reconstruction (P) on SMVSC's official code (solver.py).
SMVSC is the option ``beta=0, partition="spectral"``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.clustering import (
    AdjustedRandScore,
    ClusterAccuracy,
    NormalizedMutualInfoScore,
)

from zoo.arguments import check_range
from zoo.models.rcsc import solver as S
from zoo.module import ZooModule

__all__ = ["RCSCModule"]


class RCSCModule(ZooModule):
    """RCSC / SMVSC on V views with dimensions ``view_dims``; each ``training_step`` is one full round (W, A, Z,
    C/G, alpha) on the full batch; the objective and its relative change are logged every round.

    Example:
        >>> from lightning import Trainer
        >>> from datamodules.multiview import MultiViewDataModule
        >>> dm = MultiViewDataModule(source="synthetic", n_per=20, n_clusters=3, noise_dim=30)
        >>> model = RCSCModule(view_dims=[10, 15, 30], n_clusters=3, n_anchors=9, warmup=3, max_iter=8)
        >>> trainer = Trainer(max_epochs=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False, limit_val_batches=0)
        >>> trainer.fit(model, dm)
        >>> len(model.history) == 9 and model.history[3] < model.history[0]
        True
    """

    # zoo fit takes these from the DataModule after its setup (ZooCLI): a .mat file sets them with no model flag
    DATA_LINKS = {"view_dims": "view_dims", "n_clusters": "n_clusters"}

    def __init__(self, view_dims: list[int], n_clusters: int, n_anchors: int | None = None,
                 latent_dim: int | None = None, lam: float = 1.0, beta: float = 1.0, max_iter: int = 50,
                 tol: float = 1e-3, warmup: int = 10, inner: int = 20,
                 partition: Literal["onepass", "spectral"] = "onepass",
                 temperature: float = 1.0, seed: int = 0, view_scale: Literal["unit", "mapstd"] = "unit") -> None:
        super().__init__()
        if not isinstance(view_dims, (list, tuple)) or not view_dims:
            raise ValueError(f"Expected argument `view_dims` to be a non-empty list of view widths, but got "
                             f"{view_dims!r}.")  # fmt: skip
        for i, d in enumerate(view_dims):
            check_range(f"view_dims[{i}]", d, low=1, integer=True)
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.solver = S.RCSC(n_clusters, n_anchors, latent_dim, lam, beta, max_iter, tol, warmup, inner, partition,
                             temperature, seed, view_scale)
        m, d, K = self.solver.m, self.solver.d, n_clusters
        self.register_buffer("A", torch.zeros(d, m, dtype=torch.float64))
        self.register_buffer("C", torch.zeros(m, K, dtype=torch.float64))
        self.register_buffer("alpha", torch.full((len(view_dims),), 1.0 / len(view_dims), dtype=torch.float64))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        for i, dv in enumerate(view_dims):
            self.register_buffer(f"W{i}", torch.zeros(dv, d, dtype=torch.float64))
            self.register_buffer(f"mean{i}", torch.zeros(dv, dtype=torch.float64))
            self.register_buffer(f"std{i}", torch.ones(dv, dtype=torch.float64))
            self.register_buffer(f"scale{i}", torch.ones((), dtype=torch.float64))
        self.state: S.RCSCState | None = None
        self.history: list[float] = []
        self.rounds = 0
        self._resumed: dict[str, Any] | None = None
        self.labels_: Tensor | None = None  # the fitted partition (one-pass G, or SMVSC's spectral labels)
        metrics = MetricCollection({"accuracy": ClusterAccuracy(num_classes=K), "nmi": NormalizedMutualInfoScore(),
                                    "ari": AdjustedRandScore()})
        self.metrics = torch.nn.ModuleDict({k: metrics.clone(prefix=f"{k}/") for k in ("val", "test")})

    def configure_optimizers(self) -> Any:
        return None  # closed-form / projected updates: no optimiser

    def _check(self, views: list[Tensor]) -> None:
        dims = [int(v.shape[1]) for v in views]
        if dims != list(self.hparams.view_dims):
            raise ValueError(f"views have dimensions {dims}, the model was built for {list(self.hparams.view_dims)}")

    def _standardised(self, views: list[Tensor]) -> list[Tensor]:
        """``d_v x n`` views standardised with the statistics of the training data (kept as buffers)."""
        self._check(views)
        return [((v.double() - getattr(self, f"mean{i}")) / getattr(self, f"std{i}") * getattr(self, f"scale{i}")).T
                for i, v in enumerate(views)]  # fmt: skip

    def training_step(self, batch: tuple[list[Tensor], Tensor], batch_idx: int) -> Tensor:
        views, _ = batch
        if self.state is None:  # first round: statistics, checks and the card's initialisation (or a resumed state)
            self._check(views)
            self.solver.device = self.A.device
            self.X = self.solver.prepare(views)
            for i, (v, c) in enumerate(zip(views, self.solver.view_scales(views))):
                getattr(self, f"mean{i}").copy_(v.double().mean(0))
                getattr(self, f"std{i}").copy_(v.double().std(0).clamp_min(1e-12))
                getattr(self, f"scale{i}").fill_(c)
            if self._resumed is not None:
                self.state, self.history, self.rounds = self._restore(self._resumed)
                self._resumed = None
            else:
                self.state = self.solver.init_state(self.X)
                self.history = [S.objective(self.X, self.state, self.solver.lam, 0.0)]
        prev = self.history[-1]
        obj = self.solver.step(self.X, self.state, self.rounds)
        self.history.append(obj)
        self.rounds += 1
        last = self.solver.should_stop(self.state, self.rounds - 1)
        self._sync(final=last)
        rel = abs(prev - obj) / max(abs(prev), 1e-12)
        if self._trainer is not None:
            self.log_dict({"objective": obj, "rel_change": rel}, prog_bar=True)
            self.log_dict({f"alpha/{i}": float(a) for i, a in enumerate(self.state.alpha)})
            if last:
                self.trainer.should_stop = True
        return torch.tensor(obj)

    def _sync(self, final: bool = False) -> None:
        """Copy the solver's state into the buffers. C holds the cluster means of Z for ``cluster``: from the
        one-pass labels G while β is on (cheap, every round); otherwise (the warm-up, SMVSC) from the spectral
        labels, computed only on the last round, as they cost a k-means."""
        s = self.state
        self.A.copy_(s.A)
        self.alpha.copy_(s.alpha)
        for i, w in enumerate(s.W):
            getattr(self, f"W{i}").copy_(w)
        if final or s.G is not None:
            g = torch.as_tensor(self.solver.labels(s), dtype=torch.long) if final else s.G
            self.labels_ = g
            self.C.copy_(S.cluster_means(s.Z, g.to(s.Z.device), self.hparams.n_clusters))
            self.fitted.fill_(True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The solver's whole state (Z, G, C, the objective history, the round), so that ``--ckpt_path last`` resumes
        the alternating optimisation where it stopped instead of starting it again."""
        super().on_save_checkpoint(checkpoint)
        if self.state is not None:
            s = self.state
            checkpoint["rcsc_state"] = {
                "W": [w.cpu() for w in s.W], "A": s.A.cpu(), "Z": s.Z.cpu(), "alpha": s.alpha.cpu(),
                "C": None if s.C is None else s.C.cpu(), "G": None if s.G is None else s.G.cpu(),
                "state_history": list(s.history), "history": list(self.history), "rounds": self.rounds,
            }  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resumed = checkpoint.get("rcsc_state")

    def _restore(self, saved: dict[str, Any]) -> tuple[S.RCSCState, list[float], int]:
        if saved["Z"].shape[1] != self.X[0].shape[1]:
            raise ValueError(f"the checkpoint's anchor graph has {saved['Z'].shape[1]} samples, the data "
                             f"{self.X[0].shape[1]}: resume on the data the fit started on")  # fmt: skip
        dev = self.A.device
        state = S.RCSCState(
            W=[w.to(dev) for w in saved["W"]], A=saved["A"].to(dev), Z=saved["Z"].to(dev), alpha=saved["alpha"].to(dev),
            C=None if saved["C"] is None else saved["C"].to(dev), G=None if saved["G"] is None else saved["G"].to(dev),
            history=list(saved["state_history"]),
        )  # fmt: skip
        return state, list(saved["history"]), int(saved["rounds"])

    @torch.no_grad()
    def fit_views(self, views: list[Tensor]) -> RCSCModule:
        """Fit on ``[n, d_v]`` views without a Trainer (every round until the stop rule); returns ``self``.

        Example:
            >>> from zoo.datamodules.multiview import synthetic_views
            >>> views, y = synthetic_views(n_per=20, n_clusters=3, noise_dim=10)
            >>> model = RCSCModule(view_dims=[10, 15, 10], n_clusters=3, n_anchors=9, warmup=2, max_iter=6)
            >>> model.fit_views(views).cluster(views).shape
            torch.Size([60])
        """
        self.state, self.rounds = None, 0
        while True:
            self.training_step((views, torch.zeros(len(views[0]), dtype=torch.long)), 0)
            if self.solver.should_stop(self.state, self.rounds - 1):
                return self

    @torch.no_grad()
    def cluster(self, views: list[Tensor]) -> Tensor:
        """Labels of (possibly new) samples: the simplex QP with W, A fixed, then the nearest centroid in C.

        Raises:
            RuntimeError: the model was never fitted (its centroids are zeros: every sample would get label 0).
        """
        if not bool(self.fitted):
            raise RuntimeError("RCSCModule has not been fitted: fit it first (zoo fit -c conf/rcsc.yaml, or "
                               "Trainer.fit), or load fitted weights with zoo.load('rcsc').")  # fmt: skip
        X = self._standardised(views)
        W = [getattr(self, f"W{i}") for i in range(len(X))]
        Z = S.encode(X, W, self.A, self.alpha, self.hparams.lam)
        return torch.cdist(Z.T, self.C.T).argmin(1)

    def _evaluate(self, batch: tuple[list[Tensor], Tensor], stage: str) -> None:
        views, y = batch
        self.metrics[stage].update(self.cluster(views), y)

    def on_validation_start(self) -> None:
        # a validation during the warm-up (before G exists): label with the current Z's spectral partition first
        if self.state is not None and self.state.G is None:
            self._sync(final=True)

    def validation_step(self, batch: tuple[list[Tensor], Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.metrics["val"].compute())
        self.metrics["val"].reset()

    def test_step(self, batch: tuple[list[Tensor], Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.metrics["test"].compute())
        self.metrics["test"].reset()

    def predict_step(self, batch: tuple[list[Tensor], Tensor], batch_idx: int) -> Tensor:
        return self.cluster(batch[0])

    def forward(self, batch: tuple[list[Tensor], Tensor] | list[Tensor]) -> Tensor:
        """Cluster labels ``[n]`` of a ``(views, labels)`` batch or a list of ``[n, d_v]`` views (see ``cluster``)."""
        views = batch[0] if isinstance(batch, tuple) else batch
        return self.cluster(list(views))
