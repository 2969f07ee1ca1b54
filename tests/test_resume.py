"""Interrupted fits resume exactly: a fit killed and resumed from last.ckpt ends bit for bit where an uninterrupted one
does (weights and metrics), at an epoch boundary and mid-epoch; the resumable loaders; `--ckpt_path last` in the CLI.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from lightning import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import RandomSampler

from zoo.callbacks import TrainingDynamics
from zoo.cli import main
from zoo.datamodules.activations import ActivationsDataModule
from zoo.datamodules.base import (
    ResumableDataLoader,
    ResumableRandomSampler,
    ResumableSequentialSampler,
    TensorBatches,
    identity_collate,
)
from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.models.cludi import CLUDIModule
from zoo.models.dual import DualClassifier
from zoo.models.dual.data import PrunableImageDataModule
from zoo.models.ra_sae import RASAE
from zoo.registry import CONF_DIR, conf_path

Make = Callable[[], tuple[LightningModule, LightningDataModule]]


class _Killed(Exception):
    """Stands in for whatever ends a fit early (a crash, a lost node, Ctrl-C): no checkpoint is written for it."""


class _KillAt(Callback):
    """Raise ``_Killed`` when the fit is about to train optimiser step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise _Killed(f"killed before step {self.step}")


def _fit(
    make: Make,
    root: Path,
    epochs: int,
    *,
    every_n_train_steps: int | None = None,
    kill_at: int | None = None,
    ckpt_path: str | None = None,
    callbacks: Callable[[], list[Callback]] = list,
) -> tuple[LightningModule, Trainer]:
    """One fit as a conf runs it (seed_everything, then build), with last.ckpt kept in ``root``."""
    seed_everything(0, verbose=False)
    model, datamodule = make()
    keep_last = ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=every_n_train_steps)
    trainer = Trainer(
        max_epochs=epochs,
        callbacks=[*callbacks(), keep_last, *([_KillAt(kill_at)] if kill_at is not None else [])],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=2,
    )
    if kill_at is None:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    else:
        with pytest.raises(_Killed):
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, trainer


def _assert_resume_is_exact(make: Make, root: Path, epochs: int, kill_at: int, **kwargs: Any) -> None:
    """Fit ``epochs`` epochs; fit again, killed before step ``kill_at``; resume that from last.ckpt to ``epochs``.
    The resumed fit must end with the uninterrupted one's exact weights and validation metrics."""
    whole, whole_trainer = _fit(make, root / "whole", epochs, **kwargs)
    _fit(make, root / "killed", epochs, kill_at=kill_at, **kwargs)
    resumed, resumed_trainer = _fit(make, root / "killed", epochs, ckpt_path="last", **kwargs)
    assert resumed_trainer.global_step == whole_trainer.global_step
    expected, got = whole.state_dict(), resumed.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), f"{key} differs after the resume"
    metrics = {k: float(v) for k, v in whole_trainer.callback_metrics.items() if k.startswith("val/")}
    assert metrics, "the fit logged no validation metric to compare"
    assert {k: float(resumed_trainer.callback_metrics[k]) for k in metrics} == metrics


def _ra_sae() -> tuple[LightningModule, LightningDataModule]:
    # conf/ra-sae.yaml's model and data, on 2,000 samples: 7 batches an epoch.
    return RASAE(dim=32, num_atoms=64, top_k=3, num_candidates=64), ActivationsDataModule(n_samples=2000, center=True)


def _cludi() -> tuple[LightningModule, LightningDataModule]:
    # Diffusion noise, feature perturbations and self-conditioning coins come from the global RNG at every step, and
    # its learning-rate schedule reads trainer.estimated_stepping_batches; digits give 5 batches of 256 an epoch.
    model = CLUDIModule(emb_dim=8, batch_diffusion=2, train_steps=2, eval_steps=2, eval_samples=2)
    return model, FeatureClusteringDataModule(batch_size=256)


def _dual_scoring() -> tuple[LightningModule, LightningDataModule]:
    # DUAL's scoring run on a pruned subset (the DataModule's own short scoring run and Beta sampling): 11 batches.
    data = PrunableImageDataModule(prune_ratio=0.5, prune_method="dual_beta", scores="auto", score_epochs=3)
    return DualClassifier(backbone="mlp", in_shape=[1, 8, 8], num_classes=10, lr=0.05), data


def test_ra_sae_resumed_at_an_epoch_boundary_matches_the_uninterrupted_fit(tmp_path: Path) -> None:
    """Check that ra-sae killed in epoch 2 and resumed from last.ckpt (end of epoch 1) ends bit for bit where the
    uninterrupted 3-epoch fit does: the epochs after the resume get the same shuffled orders."""
    _assert_resume_is_exact(_ra_sae, tmp_path, epochs=3, kill_at=17)


def test_ra_sae_resumed_mid_epoch_matches_the_uninterrupted_fit(tmp_path: Path) -> None:
    """Check that ra-sae resumed from a checkpoint written mid-epoch (step 10 of 21, every 5 steps) continues the
    interrupted epoch's permutation at its next batch and ends bit for bit where the uninterrupted fit does."""
    _assert_resume_is_exact(_ra_sae, tmp_path, epochs=3, kill_at=12, every_n_train_steps=5)


def test_cludi_resumed_mid_epoch_matches_the_uninterrupted_fit(tmp_path: Path) -> None:
    """Check that CLUDI (random noise in every training step, a step-based schedule built from
    estimated_stepping_batches) resumed from step 6 (epoch 1, batch 1) ends bit for bit where the uninterrupted fit
    does."""
    _assert_resume_is_exact(_cludi, tmp_path, epochs=2, kill_at=7, every_n_train_steps=3)


def test_dual_scoring_run_resumes_with_its_training_dynamics(tmp_path: Path) -> None:
    """Check that DUAL's scoring fit on its Beta-sampled subset resumes exactly and that TrainingDynamics carries its
    record through the checkpoint: the resumed record equals the uninterrupted one, the epochs before the resume
    included (the samples pruned away stay NaN in both)."""
    records: list[TrainingDynamics] = []

    def dynamics() -> list[Callback]:
        records.append(TrainingDynamics(epochs=3, stop=False, save_dir=str(tmp_path / f"dyn{len(records)}")))
        return [records[-1]]

    _assert_resume_is_exact(_dual_scoring, tmp_path, epochs=3, kill_at=25, callbacks=dynamics)
    whole, _, resumed = (r.record() for r in records)
    assert whole["target_probs"].shape[0] == 3 and not torch.isnan(whole["target_probs"][:, whole["labels"] >= 0]).any()
    for key, value in whole.items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=0, equal_nan=True, msg=key)


def test_checkpoint_random_states_load_weights_only_and_only_when_fitting(tmp_path: Path) -> None:
    """Check that last.ckpt holds the random states in types a weights_only torch.load reads, and that loading the
    checkpoint to evaluate (load_from_checkpoint) leaves the caller's random streams alone."""
    _fit(_ra_sae, tmp_path, epochs=1)
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert {"torch", "numpy", "python", "cuda"} <= set(checkpoint["zoo_rng_states"])

    def draws_after(load: Callable[[], object]) -> tuple[float, float, float]:
        torch.manual_seed(123), np.random.seed(123), random.seed(123)
        load()
        return float(torch.rand(())), float(np.random.rand()), random.random()

    # The module's own init draws random numbers either way; the checkpoint's saved states must not be applied.
    built = draws_after(lambda: RASAE(**checkpoint["hyper_parameters"]))
    assert draws_after(lambda: RASAE.load_from_checkpoint(tmp_path / "last.ckpt")) == built


# ---------------------------------------------------------------------------------------------- the loaders
def test_resumable_random_sampler_draws_the_numbers_of_random_sampler() -> None:
    """Check that ResumableRandomSampler gives RandomSampler's orders from the same global seed, pass after pass, so
    fits that are never interrupted train on the same orders as before."""
    data = range(50)
    torch.manual_seed(7)
    expected = [list(RandomSampler(data)) for _ in range(3)]
    torch.manual_seed(7)
    sampler = ResumableRandomSampler(data)
    assert [list(sampler) for _ in range(3)] == expected


def test_resumable_loader_continues_the_interrupted_pass_at_its_next_batch() -> None:
    """Check that a loader restored from a mid-pass state serves the rest of the same permutation, then fresh passes;
    and that a state saved at the end of a pass, or in another epoch, starts a fresh pass."""

    def loader() -> ResumableDataLoader:
        data = TensorBatches(torch.arange(10))
        sampler = ResumableRandomSampler(data)
        return ResumableDataLoader(data, batch_size=3, sampler=sampler, collate_fn=identity_collate)

    torch.manual_seed(0)
    first = loader()
    it = iter(first)
    seen = [next(it)[0], next(it)[0]]
    state = first.state_dict()
    rest = [b[0] for b in it]
    assert state["position"] == 6 and first.state_dict()["position"] == 10
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b[0].tolist() for b in resumed] == [b.tolist() for b in rest]
    assert sorted(torch.cat(seen + rest).tolist()) == list(range(10))
    for other in ({**state, "position": 10}, {**state, "epoch": 1}):
        fresh = loader()
        fresh.load_state_dict(other)
        assert sum(len(b[0]) for b in fresh) == 10


def test_resumable_sequential_sampler_resumes_an_ordered_pass() -> None:
    """Check that an ordered training pass (a stream's fit) resumes at its next chunk."""
    data = TensorBatches(torch.arange(7))
    loader = ResumableDataLoader(
        data, batch_size=2, sampler=ResumableSequentialSampler(data), collate_fn=identity_collate
    )
    loader.load_state_dict({"epoch": 0, "seed": None, "position": 4})
    assert [b[0].tolist() for b in loader] == [[4, 5], [6]]
    assert [b[0].tolist() for b in loader][0] == [0, 1]


# ---------------------------------------------------------------------------------------------- confs and the CLI
@pytest.mark.parametrize("conf", sorted(p.name for p in CONF_DIR.glob("*.yaml")))
def test_conf_keeps_the_latest_state_in_last_ckpt(conf: str) -> None:
    """Check that every conf has a ModelCheckpoint that writes last.ckpt at every save and has no monitor (a monitor
    callback's last.ckpt is only rewritten when the monitored value improves)."""
    callbacks = yaml.safe_load((CONF_DIR / conf).read_text())["trainer"].get("callbacks") or []
    checkpoints = [c.get("init_args") or {} for c in callbacks if c["class_path"].endswith(".ModelCheckpoint")]
    assert any(args.get("save_last") is True and not args.get("monitor") for args in checkpoints), conf
    assert not any(args.get("save_last") and args.get("monitor") for args in checkpoints), conf


FAST = [
    "--trainer.limit_train_batches",
    "3",
    "--trainer.limit_val_batches",
    "2",
    "--trainer.check_val_every_n_epoch",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]


def test_cli_ckpt_path_last_resumes_the_newest_run_and_prints_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Check that `zoo fit ... --ckpt_path last` finds last.ckpt in the previous run's version folder (Lightning only
    looks in the new, empty one), resumes it, and that the end-of-fit message shows that resume command."""
    conf = str(conf_path("ra-sae"))
    dirs = ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    main(["fit", "-c", conf, "--trainer.max_epochs", "1", *FAST, *dirs])
    first = capsys.readouterr().out
    assert f"resume: zoo fit -c {conf} --trainer.max_epochs 1" in first and first.rstrip().count("--ckpt_path last")
    (previous,) = (tmp_path / "ra-sae").glob("version_0/checkpoints/last.ckpt")
    main(["fit", "-c", conf, "--trainer.max_epochs", "2", *FAST, *dirs, "--ckpt_path", "last"])
    assert f"Resuming from {previous}" in capsys.readouterr().out
    (resumed,) = (tmp_path / "ra-sae").glob("version_1/checkpoints/last.ckpt")
    assert torch.load(resumed, weights_only=True)["global_step"] == 6  # 3 steps of epoch 0 restored, 3 more trained


def test_cli_ckpt_path_last_without_a_previous_run_fails_with_one_line(tmp_path: Path) -> None:
    """Check that `--ckpt_path last` with nothing to resume stops before training with one clear line (Lightning
    would warn and silently train from scratch)."""
    dirs = ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="zoo fit: --ckpt_path last: no last.ckpt to resume from"):
        main(["fit", "-c", str(conf_path("ra-sae")), *FAST, *dirs, "--ckpt_path", "last"])
