"""``TimestepExpertsSchedule``: TimeStep Master's two stages, fostering then assembling, in one ``zoo fit``."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from zoo.nn.timestep_experts import interval_bounds

__all__ = ["TimestepExpertsSchedule"]

Phase = tuple[str, int, tuple[int, int], int]  # (stage, scale, timestep range, steps)


class TimestepExpertsSchedule(Callback):
    """Run the LoRA timestep experts' schedule on a module with ``set_phase`` (``zoo.models.tsm.TSMDiffusion``).

    Stage 1 (fostering): for each scale n_j, finest first, each of its n_j experts trains on timesteps drawn inside its
    own interval (the integers the routing sends to it: [⌈i·T/n_j⌉, ⌈(i+1)·T/n_j⌉)), for one of two budgets:

    * ``steps_per_expert`` (the paper's recipe: every expert trains as long as one LoRA would): each expert that
      many steps, so scale j costs n_j times as much as one LoRA;
    * ``steps_per_scale`` (the TSM card's §6 budget, used when ``steps_per_expert`` is None): each expert
      ``steps_per_scale // n_j`` steps, so every scale gets the same budget and every timestep region as many samples
      as one LoRA of ``steps_per_scale`` steps gives it.

    Stage 2 (assembling): the experts are
    frozen and the router trains for ``router_steps`` steps on timesteps over [0, T). At each switch the optimiser is
    rebuilt from the module's ``configure_optimizers`` (fresh AdamW state: an expert that stops training is not moved
    on by momentum). Training stops when the schedule ends; the module is left assembled (with ``router_steps=0`` the
    zero router makes that "core experts only", TSM-1stage). Logs ``tsm/phase`` (its index) and ``tsm/scale``.

    A ``trainer.max_steps`` shorter than the schedule (a smoke test: ``--trainer.max_steps 10``) scales every phase
    down in proportion, at least one step each, and drops the last phases that still do not fit, with a warning that
    says which ran.

    Args:
        steps_per_scale: optimiser steps per scale in stage 1 (when ``steps_per_expert`` is None).
        steps_per_expert: optimiser steps per expert in stage 1 (None: ``steps_per_scale // n_j``).
        router_steps: optimiser steps of stage 2 (0: no assembling).
        scales: the module's scales to foster, by index (None: all).

    Example:
        >>> schedule = TimestepExpertsSchedule(steps_per_scale=8, router_steps=3)
        >>> [(s, j, r, n) for s, j, r, n in schedule.phases((4, 2, 1), 1000)][:3]
        [('foster', 0, (0, 250), 2), ('foster', 0, (250, 500), 2), ('foster', 0, (500, 750), 2)]
        >>> schedule.total_steps((4, 2, 1), 1000)
        27
        >>> TimestepExpertsSchedule(steps_per_expert=8, router_steps=3).total_steps((4, 2, 1), 1000)  # 7 × 8 + 3
        59
    """

    def __init__(
        self,
        steps_per_scale: int = 800,
        router_steps: int = 300,
        scales: list[int] | None = None,
        steps_per_expert: int | None = None,
    ) -> None:
        if steps_per_scale < 1 or router_steps < 0:
            raise ValueError(f"steps_per_scale must be ≥ 1 and router_steps ≥ 0, got {steps_per_scale}, {router_steps}")
        if steps_per_expert is not None and steps_per_expert < 1:
            raise ValueError(f"steps_per_expert must be ≥ 1 or None, got {steps_per_expert}")
        self.steps_per_scale, self.router_steps, self.scales = steps_per_scale, router_steps, scales
        self.steps_per_expert = steps_per_expert
        self._phases: list[Phase] = []
        self._starts: list[int] = []
        self._current = -1

    def phases(self, scales: tuple[int, ...], num_timesteps: int) -> list[Phase]:
        """The schedule: fostering phases per (scale, interval), then the assembling phase."""
        out: list[Phase] = []
        for j, n in enumerate(scales):
            if self.scales is not None and j not in self.scales:
                continue
            if self.steps_per_expert is None and self.steps_per_scale < n:
                raise ValueError(
                    f"steps_per_scale={self.steps_per_scale} leaves no step for the {n} experts of scale {j}"
                )
            steps = self.steps_per_expert or self.steps_per_scale // n
            for bounds in interval_bounds(n, num_timesteps):
                out.append(("foster", j, bounds, steps))
        if self.router_steps and len(scales) > 1:
            out.append(("assemble", 0, (0, num_timesteps), self.router_steps))
        return out

    def total_steps(self, scales: tuple[int, ...], num_timesteps: int) -> int:
        return sum(steps for *_, steps in self.phases(scales, num_timesteps))

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not hasattr(pl_module, "set_phase") or getattr(pl_module.hparams, "mode", None) != "tsm":
            raise TypeError(f"{type(self).__name__} needs a TSMDiffusion in mode='tsm', got {type(pl_module).__name__}")
        hp = pl_module.hparams
        self._phases = self.phases(tuple(hp.scales), hp.num_train_timesteps)
        if not self._phases:
            raise ValueError("the TSM schedule is empty: foster at least one scale or give router_steps > 0")
        total = sum(steps for *_, steps in self._phases)
        if 0 < trainer.max_steps < total and not trainer.fast_dev_run:
            self._phases = self._fit_to(self._phases, trainer.max_steps)
        self._starts, start = [], 0
        for *_, steps in self._phases:
            self._starts.append(start)
            start += steps
        self._current = -1
        self._enter(trainer, pl_module, 0, rebuild=False)  # before configure_optimizers: it sees phase 0's weights

    @staticmethod
    def _fit_to(phases: list[Phase], max_steps: int) -> list[Phase]:
        """The schedule scaled to ``max_steps``: every phase in proportion (≥ 1 step), the tail dropped if need be."""
        total = sum(steps for *_, steps in phases)
        scaled = [(stage, j, bounds, max(1, steps * max_steps // total)) for stage, j, bounds, steps in phases]
        kept, used = [], 0
        for phase in scaled:
            if used + phase[3] > max_steps:
                break
            kept.append(phase)
            used += phase[3]
        ran = ", ".join(f"{stage} scale {j} t∈{list(bounds)} × {steps}" for stage, j, bounds, steps in kept)
        dropped = len(phases) - len(kept)
        rank_zero_warn(
            f"trainer.max_steps={max_steps} is shorter than the TSM schedule ({total} steps): every phase is scaled "
            f"down to fit; phases run: {ran}"
            + (f"; the last {dropped} phase(s) do not fit and are skipped" if dropped else "")
        )
        return kept

    def _enter(self, trainer: Trainer, pl_module: LightningModule, index: int, rebuild: bool = True) -> None:
        stage, scale, t_range, steps = self._phases[index]
        pl_module.set_phase(stage, scale, t_range)
        self._current = index
        if rebuild:
            trainer.strategy.setup_optimizers(trainer)
        rank_zero_info(
            f"TSM phase {index + 1}/{len(self._phases)}: {stage} scale {scale}, t in {t_range}, {steps} steps"
        )

    def _index(self, step: int) -> int:
        """The phase that trains optimiser step ``step`` (0-based)."""
        return max(i for i, start in enumerate(self._starts) if start <= step)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # A resumed fit: `setup` entered phase 0, but `configure_optimizers` (it runs after this hook) must build the
        # optimiser of the phase the checkpoint's optimiser state belongs to, the phase of its last step. That state
        # then loads into the same parameter groups, and the next batch switches phase (with a fresh optimiser)
        # exactly where the uninterrupted fit did.
        if not self._phases:  # not fitting (`zoo test --ckpt_path`): no schedule
            return
        index = self._index(max(int(checkpoint.get("global_step", 0)) - 1, 0))
        if index != self._current:
            self._enter(trainer, pl_module, index, rebuild=False)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step >= self._starts[-1] + self._phases[-1][3]:
            trainer.should_stop = True
            return
        index = self._index(step)
        if index != self._current:
            self._enter(trainer, pl_module, index)
        pl_module.log("tsm/phase", float(self._current), on_step=True, on_epoch=False)
        pl_module.log("tsm/scale", float(self._phases[self._current][1]), on_step=True, on_epoch=False)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Stop right after the schedule's last step: a flag raised at the next batch's start lets that batch train.
        if trainer.global_step >= self._starts[-1] + self._phases[-1][3]:
            trainer.should_stop = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pl_module.set_phase("assemble")
