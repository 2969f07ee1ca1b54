"""Tests of the TimeStep Master callbacks: TimestepExpertsSchedule's phases and a short real fit through them (which
expert slices move when, the router, the stop), and DiffusionSamples' PNG under a CSVLogger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from zoo.callbacks.diffusion_samples import DiffusionSamples
from zoo.callbacks.timestep_experts import TimestepExpertsSchedule
from zoo.datamodules.domains import DomainShiftDataModule
from zoo.models.tsm import TSMDiffusion

T = 1000


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run this file's tiny UNets on one thread: on a busy 2-core machine OpenMP's waits cost seconds a test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def quiet_trainer(**kwargs: Any) -> Trainer:
    return Trainer(
        **{
            "max_epochs": -1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            **kwargs,
        }
    )


# ------------------------------------------------------------------------------------------------ the schedule
def test_phases_foster_each_interval_finest_first_then_assemble() -> None:
    """Check the schedule: per-interval fostering, finest scale first, steps_per_scale // n_j steps each (the same
    budget per scale), then one assembling phase over [0, T); and total_steps."""
    schedule = TimestepExpertsSchedule(steps_per_scale=10, router_steps=3)
    assert schedule.phases((4, 2, 1), T) == [
        ("foster", 0, (0, 250), 2),
        ("foster", 0, (250, 500), 2),
        ("foster", 0, (500, 750), 2),
        ("foster", 0, (750, 1000), 2),
        ("foster", 1, (0, 500), 5),
        ("foster", 1, (500, 1000), 5),
        ("foster", 2, (0, 1000), 10),
        ("assemble", 0, (0, 1000), 3),
    ]
    assert schedule.total_steps((4, 2, 1), T) == 4 * 2 + 2 * 5 + 10 + 3
    assert TimestepExpertsSchedule(steps_per_scale=8, router_steps=3).total_steps((8, 4, 2, 1), T) == 4 * 8 + 3
    ranges = [r for _, j, r, _ in TimestepExpertsSchedule(steps_per_scale=8).phases((8, 4, 2, 1), T) if j == 0][:8]
    assert ranges == [(125 * i, 125 * (i + 1)) for i in range(8)]  # the intervals tile [0, T)


def test_phase_selection_and_its_edge_cases() -> None:
    """Check scales=[] (assembling only), a subset of scales, router_steps=0 (no assembling) and one scale only (no
    router to train)."""
    assert TimestepExpertsSchedule(router_steps=7, scales=[]).phases((4, 2, 1), T) == [("assemble", 0, (0, T), 7)]
    assert TimestepExpertsSchedule(steps_per_scale=4, router_steps=0, scales=[1]).phases((4, 2, 1), T) == [
        ("foster", 1, (0, 500), 2),
        ("foster", 1, (500, 1000), 2),
    ]
    no_router = TimestepExpertsSchedule(steps_per_scale=4, router_steps=0)
    assert [stage for stage, *_ in no_router.phases((4, 2, 1), T)] == ["foster"] * 7
    assert no_router.total_steps((4, 2, 1), T) == 12
    assert TimestepExpertsSchedule(steps_per_scale=4, router_steps=5).phases((1,), T) == [("foster", 0, (0, T), 4)]


def test_bad_schedules_are_refused() -> None:
    """Check that steps_per_scale below a scale's interval count, steps_per_scale < 1 or router_steps < 0 raise."""
    with pytest.raises(ValueError, match="leaves no step for the 4 experts of scale 0"):
        TimestepExpertsSchedule(steps_per_scale=3).phases((4, 2, 1), T)
    TimestepExpertsSchedule(steps_per_scale=3, scales=[1, 2]).phases((4, 2, 1), T)  # scale 0 skipped: fine
    for kwargs in ({"steps_per_scale": 0}, {"router_steps": -1}):
        with pytest.raises(ValueError, match="steps_per_scale must be"):
            TimestepExpertsSchedule(**kwargs)


@pytest.mark.parametrize("mode", ["pretrain", "lora"])
def test_schedule_needs_a_tsm_module(mode: str) -> None:
    """Check that fitting a module that is not a TSMDiffusion in mode "tsm" raises a TypeError at setup."""
    schedule = TimestepExpertsSchedule(steps_per_scale=4, router_steps=2)
    with pytest.raises(TypeError, match="mode='tsm'"):
        quiet_trainer(max_steps=14, callbacks=[schedule]).fit(TSMDiffusion(mode=mode), DomainShiftDataModule())


def test_max_steps_shorter_than_the_schedule_scales_the_phases_with_a_warning() -> None:
    """Check that a smoke-test max_steps (shorter than the schedule) runs a scaled schedule instead of refusing: every
    phase at least one step, in proportion, the tail dropped when even that does not fit, and a warning naming them."""
    phases = TimestepExpertsSchedule(steps_per_scale=40, router_steps=20).phases((4, 2, 1), T)  # 140 steps, 8 phases
    with pytest.warns(UserWarning, match=r"max_steps=70 is shorter than the TSM schedule \(140 steps\)"):
        half = TimestepExpertsSchedule._fit_to(phases, 70)
    assert [p[3] for p in half] == [5, 5, 5, 5, 10, 10, 20, 10] and [p[:3] for p in half] == [p[:3] for p in phases]
    with pytest.warns(UserWarning, match=r"the last 3 phase\(s\) do not fit"):
        tiny = TimestepExpertsSchedule._fit_to(phases, 5)
    assert [p[3] for p in tiny] == [1] * 5
    schedule = TimestepExpertsSchedule(steps_per_scale=4, router_steps=2)
    trainer = quiet_trainer(max_steps=10, callbacks=[schedule])
    with pytest.warns(UserWarning, match="phases run"):
        trainer.fit(TSMDiffusion(mode="tsm"), DomainShiftDataModule())
    assert trainer.global_step <= 10 and trainer.state.finished


def test_fostering_intervals_match_the_routing_when_n_does_not_divide_t() -> None:
    """Check that with n = 3 every timestep a fostering phase draws routes to that phase's expert (i·T//n would
    send t = 333 and 666 to the neighbouring expert's phase), and the intervals tile [0, T)."""
    from zoo.nn.timestep_experts import expert_index

    phases = TimestepExpertsSchedule(steps_per_scale=9, router_steps=0).phases((3, 1), T)
    fostering = [(i, r) for i, (_, j, r, _) in enumerate(phases) if j == 0]
    assert [r for _, r in fostering] == [(0, 334), (334, 667), (667, 1000)]
    for expert, (lo, hi) in enumerate(r for _, r in fostering):
        assert set(expert_index(torch.arange(lo, hi), 3, T).tolist()) == {expert}


# ------------------------------------------------------------------------------------------------ a real fit
class Snapshots(Callback):
    """Record the expert tensors (per scale), the router and the schedule's phase index before and after every step."""

    def __init__(self, schedule: TimestepExpertsSchedule) -> None:
        self.schedule = schedule
        self.states: list[dict[str, Tensor]] = []
        self.phases: list[int] = []

    @staticmethod
    def state(module: LightningModule) -> dict[str, Tensor]:
        return {
            name: p.detach().clone()
            for name, p in module.unet.named_parameters()
            if "lora_" in name or ".router." in name or ".time_gate." in name
        }

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.states.append(self.state(pl_module))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.states.append(self.state(pl_module))
        self.phases.append(self.schedule._current)


def test_a_short_fit_runs_the_schedule() -> None:
    """Check a 14-step fit (scales (4, 2, 1), 4 steps a scale, 2 router steps): it stops at the schedule's end though
    max_steps allows more; a scale's expert tensors change only in its own phases and, within a fostering phase, only
    the active interval's slice (the others stay bit-identical: fresh AdamW state per phase); the router stays zero
    until assembling and moves then; no base UNet weight moves; the module ends in the "assemble" phase."""
    torch.manual_seed(0)
    model = TSMDiffusion(mode="tsm", scales=(4, 2, 1), lr=1e-2, router_lr=1e-2)
    schedule = TimestepExpertsSchedule(steps_per_scale=4, router_steps=2)
    phases = schedule.phases((4, 2, 1), T)
    snapshots = Snapshots(schedule)
    base = {k: v.clone() for k, v in model.unet.state_dict().items() if k not in Snapshots.state(model)}
    trainer = quiet_trainer(max_steps=40, callbacks=[schedule, snapshots])
    trainer.fit(model, DomainShiftDataModule("target", batch_size=16))

    assert trainer.global_step == schedule.total_steps((4, 2, 1), T) == 14
    assert snapshots.phases == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7]
    assert model.phase == "assemble" and model.t_range == (0, T)
    assert all(layer.stage == "assemble" for layer in model.experts.values())
    assert all(torch.equal(model.unet.state_dict()[k], v) for k, v in base.items())  # the base UNet stays frozen

    routers = [name for name in snapshots.states[0] if ".router." in name or ".time_gate." in name]
    moved_interval = set()
    for step, index in enumerate(snapshots.phases):
        before, after = snapshots.states[step], snapshots.states[step + 1]
        stage, scale, (lo, hi), _ = phases[index]
        changed = {name for name in before if not torch.equal(before[name], after[name])}
        if stage == "assemble":
            assert changed and all(name in routers for name in changed), step
            continue
        assert all(not after[name].any() for name in routers), step  # the router is still zero
        n = (4, 2, 1)[scale]
        interval = lo * n // T
        assert all(name.endswith((f"lora_A.{scale}", f"lora_B.{scale}")) for name in changed), step
        for name in changed:  # only the active interval's slice of scale `scale` moved
            others = [i for i in range(n) if i != interval]
            assert torch.equal(before[name][others], after[name][others]), (step, name)
            assert not torch.equal(before[name][interval], after[name][interval])
        assert any("lora_B" in name for name in changed), step  # B leaves zero on the expert's first step
        moved_interval.add((scale, interval))
    assert moved_interval == {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)}
    assert all(snapshots.states[-1][name].any() for name in routers if "time_gate" in name)


# ------------------------------------------------------------------------------------------------ samples
def test_diffusion_samples_writes_a_png_after_validation(tmp_path: Path) -> None:
    """Check that one validation epoch with a CSVLogger writes samples_step<k>.png under the log dir's images/
    folder, and that the sanity check writes none."""
    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=1,
        num_sanity_val_steps=1,
        logger=logger,
        callbacks=[DiffusionSamples(num_images=4, steps=2)],
    )
    trainer.fit(TSMDiffusion(mode="pretrain"), DomainShiftDataModule("target", batch_size=16))
    pngs = sorted((Path(logger.log_dir) / "images").glob("*.png"))
    assert [p.name for p in pngs] == ["samples_step1.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
