"""``EFM``: Electrostatic Field Matching as a LightningModule, for generation (noise → data) and transfer."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric

from zoo.metrics import EnergyDistance
from zoo.models.efm.field import FieldTarget, TargetKind, lift
from zoo.models.efm.networks import build_field_net
from zoo.models.efm.ode import Transport, require_finite, transport
from zoo.models.efm.samplers import PlatePointSampler, SamplerKind
from zoo.module import ZooModule

__all__ = ["EFM"]


class EFM(ZooModule):
    """Electrostatic Field Matching (Kolesov et al., ICML 2025): learn the field of a capacitor, follow its lines.

    Source samples x⁺ ~ P are positive charges on the plate z = 0, target samples x⁻ ~ Q negative charges on the
    plate z = L in R^{D+1}. Each training step draws field points between the plates (``PlatePointSampler``),
    computes the Monte-Carlo field of the batch's charges there (``FieldTarget``, log space, chunked) and regresses
    f_θ onto it. Inference moves samples of P along the learned lines, dx/dz = f_x / f_z from z = ε to z = L
    (``transport``), and returns the x where they land: samples of Q. With P = N(0, I) this is a generator
    (``sample``); with P a data set it is an unpaired translator (``forward``).

    Training batches are ``(source, target)`` pairs from a pair DataModule (``ToyPairDataModule``,
    ``ImagePairDataModule``); each side of a batch is one plate's charges.

    Args:
        shape: shape of one sample: ``[D]`` for vectors, ``[C, H, W]`` for images.
        L: plate distance (card: 6 for the 2-D toy; the poster shows L = 30 mapping poorly).
        eps: the plates' margin: transport starts at z = ε and the segment sampler stays in (ε, L − ε).
        net: ``"mlp"`` (``MLPFieldNet``) or ``"unet"`` (``UNetFieldNet``, diffusers UNet2DModel + pooled z-head).
        net_kwargs: extra arguments of the field network (widths, depth, ...).
        field_target: ``"paper"`` (normalised total field, default) or ``"code_per_plate"`` (the official code's).
        gamma: γ of the code target.
        chunk_size: charges per chunk of the target computation (bounds memory).
        sampler: ``"segment"`` (default), ``"uniform"``, ``"uniform_mixing"`` or ``"mesh"``.
        sampler_kwargs: extra arguments of ``PlatePointSampler`` (noise, outer_fraction, outer_box, ...).
        num_field_points: field points per training step.
        lr: Adam learning rate.
        schedule: ``"cosine"`` decay to 0 over training (toy) or ``"constant"`` (official image runs).
        warmup_steps: linear learning-rate warm-up (official image runs: 5000).
        ode_steps: Euler steps in z at inference.
        ode_method: ``"euler"`` or ``"rk45"`` (adaptive).
        min_fz: f_z is clamped to at least this; clamped steps are counted and logged.
        behind_plate_steps: follow lines that pass through the target plate, loop behind it and come back, for at
            most this many fixed-length steps (0 = stop every line at z = L, the paper's Algorithm 2). The field
            must have been trained out there: widen ``sampler_kwargs`` ``outer_margin``/``outer_box``.
        behind_plate_step: length of those steps in (x, z) space.
        behind_plate_probe: how far past the plate the field is probed, and the band within which a returning line
            has landed: a learned field is smooth across the plate's charges, so this must exceed the width it
            smooths over (toy: 0.3 works after 1,000 and 3,000 steps; with 0.1 most lines never land).

    Example:
        >>> model = EFM(shape=[2], net_kwargs={"hidden": 32})
        >>> source, target = torch.randn(64, 2), torch.randn(64, 2) + 3
        >>> float(model.loss(source, target)) > 0
        True
        >>> model(source).shape
        torch.Size([64, 2])
    """

    def __init__(
        self,
        shape: list[int] = [2],  # noqa: B006 - jsonargparse and the hub config need a plain list
        L: float = 6.0,
        eps: float = 1e-3,
        net: Literal["mlp", "unet"] = "mlp",
        net_kwargs: dict[str, Any] | None = None,
        field_target: TargetKind = "paper",
        gamma: float = 1e-7,
        chunk_size: int = 2048,
        sampler: SamplerKind = "segment",
        sampler_kwargs: dict[str, Any] | None = None,
        num_field_points: int = 512,
        lr: float = 1e-3,
        schedule: Literal["cosine", "constant"] = "cosine",
        warmup_steps: int = 0,
        ode_steps: int = 100,
        ode_method: Literal["euler", "rk45"] = "euler",
        min_fz: float = 1e-3,
        behind_plate_steps: int = 0,
        behind_plate_step: float = 0.2,
        behind_plate_probe: float = 0.3,
    ) -> None:
        super().__init__()
        if L <= 0:
            raise ValueError(f"the plate distance L must be > 0, got {L}")
        if not 0 <= eps < L / 2:
            raise ValueError(f"the plate margin eps must be in [0, L/2), got {eps} with L = {L}")
        self.save_hyperparameters()
        self.shape = tuple(int(s) for s in shape)
        self.field_net = build_field_net(net, self.shape, L, **(net_kwargs or {}))
        self.field_target = FieldTarget(field_target, gamma=gamma, chunk_size=chunk_size)
        self.sampler = PlatePointSampler(sampler, L=L, eps=eps, **(sampler_kwargs or {}))
        self.metrics = nn.ModuleDict(
            {
                stage: nn.ModuleDict(
                    {
                        "energy_distance": EnergyDistance(),
                        "identity_energy_distance": EnergyDistance(),
                        "clamped_fraction": MeanMetric(),
                        **({"lines_lost": MeanMetric()} if behind_plate_steps > 0 else {}),
                    }
                )
                for stage in ("val", "test")
            }
        )

    # --------------------------------------------------------------------------------------------- the maths
    def field(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The learned field ``(f_x, f_z)`` at samples ``x`` ``(n, *shape)`` lifted to heights ``z`` ``(n,)``."""
        return self.field_net(x, z)

    def _check(self, x: Tensor, what: str) -> Tensor:
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"{what} has sample shape {tuple(x.shape[1:])}, but this EFM was built for {self.shape}")
        return x

    def loss(self, source: Tensor, target: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """‖f_θ(x̃) − E(x̃)/‖E(x̃)‖‖² averaged over field points drawn from one batch of both plates."""
        source, target = self._check(source, "the source batch"), self._check(target, "the target batch")
        # One NaN charge makes the Monte-Carlo field, and so the loss, of the whole batch NaN: refuse it here with
        # one host sync for both plates (the second reduction only runs to name the bad plate).
        if not bool(torch.isfinite(source).all() & torch.isfinite(target).all()):
            require_finite(source, "the source batch", "EFM trains on finite samples only")
            require_finite(target, "the target batch", "EFM trains on finite samples only")
        return self._loss(source, target, generator)

    def _loss(self, source: Tensor, target: Tensor, generator: torch.Generator | None = None) -> Tensor:
        points = self.sampler(source, target, self.hparams.num_field_points, generator=generator)
        goal = self.field_target(points, lift(source, 0.0), lift(target, self.hparams.L)).to(points.dtype)
        x = points[:, :-1].reshape(len(points), *self.shape)
        f_x, f_z = self.field(x, points[:, -1])
        pred = torch.cat([f_x.reshape(len(points), -1), f_z[:, None]], dim=1)
        return (pred - goal).square().sum(dim=1).mean()

    def transport(self, x: Tensor, steps: int | None = None, method: str | None = None) -> Transport:
        """Move source samples ``x`` ``(n, *shape)`` from z = ε to the target plate z = L; see ``ode.transport``.

        A NaN or inf row of ``x`` is refused by ``ode.transport`` (``ValueError`` naming "the input x").
        """
        self._check(x, "the input")
        return transport(
            self.field,
            x,
            self.hparams.eps,
            self.hparams.L,
            steps=self.hparams.ode_steps if steps is None else steps,
            method=self.hparams.ode_method if method is None else method,
            min_fz=self.hparams.min_fz,
            behind_steps=self.hparams.behind_plate_steps,
            behind_step=self.hparams.behind_plate_step,
            probe=self.hparams.behind_plate_probe,
        )

    def forward(self, x: Tensor | tuple[Tensor, Tensor] | list[Tensor]) -> Tensor:
        """Transported samples ``(n, *shape)``; a ``(source, target)`` batch is accepted and its target ignored."""
        if isinstance(x, (tuple, list)):
            x = x[0]
        return self.transport(x).x

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` samples of Q for a generator (a model trained with source N(0, I), e.g. ``efm-digits``)."""
        noise = torch.randn(n, *self.shape, generator=generator).to(self.device)
        return self.transport(noise).x

    # --------------------------------------------------------------------------------------------- Lightning
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        # The pair DataModules refuse non-finite files when they load them (``check_finite``), so the Trainer's step
        # skips ``loss``'s check and the host sync it costs on an accelerator.
        source, target = self._check(batch[0], "the source batch"), self._check(batch[1], "the target batch")
        loss = self._loss(source, target)
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(batch[0]))
        return loss

    def _evaluate(self, batch: tuple[Tensor, Tensor], batch_idx: int, stage: str) -> None:
        source, target = batch
        # Field points seeded by the batch index: the evaluation loss is the same number in every run.
        generator = torch.Generator(source.device).manual_seed(batch_idx)
        self.log(f"{stage}/loss", self.loss(source, target, generator), batch_size=len(source), sync_dist=True)
        moved = self.transport(source)
        m = self.metrics[stage]
        m["energy_distance"].update(moved.x, target)
        m["identity_energy_distance"].update(source, target)
        m["clamped_fraction"].update(torch.tensor(moved.clamped_fraction, device=self.device), weight=len(source))
        if self.hparams.behind_plate_steps > 0:
            m["lines_lost"].update(torch.tensor(moved.lines_lost, device=self.device), weight=len(source))
        for key, metric in m.items():
            self.log(f"{stage}/{key}", metric, prog_bar=key == "energy_distance")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch)

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup, cosine = self.hparams.warmup_steps, self.hparams.schedule == "cosine"

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if not cosine:
                return 1.0
            return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / max(total - warmup, 1)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def card_notes(self) -> str:
        hp = self.hparams
        behind = (
            f"Lines that pass through the target plate are followed behind it ({hp.behind_plate_steps} steps of "
            f"{hp.behind_plate_step} at most) until they come back; `test/lines_lost` is the share that did not."
            if hp.behind_plate_steps > 0
            else "Lines that pass through the target plate are stopped there (no behind-plate continuation)."
        )
        return (
            f"Trained with the {'paper' if hp.field_target == 'paper' else 'official code'} target "
            f"(`field_target={hp.field_target!r}`), the `{hp.sampler}` field-point sampler, L = {hp.L}. Transport is "
            f"Euler in z ({hp.ode_steps} steps) with f_z clamped at {hp.min_fz}; `test/clamped_fraction` is the "
            f"share of clamped steps. {behind} A small network on the embedded default data: a working example, not "
            "the paper's CIFAR-10 checkpoint."
        )
