"""Epoch time of DUAL's scoring fit with and without ``callbacks.TrainingDynamics`` (the issue asks for <= 10 %).

    python tests/benchmarks/bench_training_dynamics.py [--repeats 5] [--epochs 10] [--threads 1]

The conf's classifier (MLP 64-256-128-10) and DataModule (digits, batch 64) through the Trainer, with logging,
checkpointing, validation and the progress bar off so the callback is the only difference; the callback records
target probabilities (and, with ``--probs``, the full softmax). Prints the median seconds per epoch of each.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from lightning import Callback, Trainer

from zoo.callbacks import TrainingDynamics
from zoo.models.dual import DualClassifier
from zoo.models.dual.data import PrunableImageDataModule


class _EpochTimer(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.times.append(time.perf_counter() - self.start)


def _epoch_seconds(with_callback: bool, epochs: int, probs: bool) -> float:
    timer = _EpochTimer()
    callbacks = [timer] + (
        [TrainingDynamics(epochs=epochs, record_probs=probs, stop=False, save_dir=tempfile.mkdtemp())]
        if with_callback
        else []
    )
    trainer = Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(DualClassifier(schedule_epochs=200), PrunableImageDataModule(batch_size=64))
    return statistics.median(timer.times[1:])  # the first epoch warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probs", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    without, with_cb = [], []
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
        without.append(_epoch_seconds(False, args.epochs, args.probs))
        with_cb.append(_epoch_seconds(True, args.epochs, args.probs))
    a, b = statistics.median(without), statistics.median(with_cb)
    print(
        f"seconds per epoch (median of {args.repeats} runs): without {a * 1e3:.1f} ms, with {b * 1e3:.1f} ms "
        f"({100 * (b / a - 1):+.1f} %)"
    )


if __name__ == "__main__":
    main()
