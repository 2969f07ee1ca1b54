"""Training steps/s of `zoo fit -c conf/ra-sae.yaml` against bare Lightning and a plain PyTorch loop, same maths.

    python tests/benchmarks/bench_fit_speed.py [--repeats 5] [--epochs 10]

Both loops use the conf's DataModule and RASAE (candidates set the same way), Adam, grad-norm clip 1.0, and time
only the training loop (Lightning: from on_train_start to on_train_end). Validation is disabled, and with it the
conf's callbacks (stability, checkpoint), which would otherwise save a checkpoint at every epoch end instead of
after each validation; the conf's CSV logger, its logging cadence and the Rich progress bar are kept.
The bare-Lightning arm is a minimal LightningModule around the same SAE and loss (no logging) under a default
``lightning.Trainer`` (TQDM bar, no logger, no checkpointing, the same gradient clipping): what Lightning itself costs,
so the zoo's own overhead is the gap between it and ``zoo fit``. Prints the median steps/s of each and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from lightning import Callback

from zoo import hub
from zoo.lightning_cli import ZooCLI
from zoo.registry import conf_path


class _Timer(Callback):
    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.seconds = time.perf_counter() - self.start
        self.steps = trainer.global_step


def _overrides(batch_size: int | None, dim: int | None, num_atoms: int | None) -> tuple[dict, dict]:
    data = {"batch_size": batch_size} if batch_size else {}
    model = {}
    if dim:
        data["dim"] = model["dim"] = dim
    if num_atoms:
        model["num_atoms"] = model["num_candidates"] = num_atoms
    return model, data


def lightning_steps_per_second(
    epochs: int, batch_size: int | None, dim: int | None = None, num_atoms: int | None = None
) -> float:
    timer = _Timer()
    model_args, data_args = _overrides(batch_size, dim, num_atoms)
    extra = [f"--model.init_args.{k}={v}" for k, v in model_args.items()]
    extra += [f"--data.init_args.{k}={v}" for k, v in data_args.items()]
    cli = ZooCLI(
        args=[
            "-c",
            str(conf_path("ra-sae")),
            "--trainer.max_epochs",
            str(epochs),
            "--trainer.limit_val_batches",
            "0",
            "--trainer.callbacks",
            "[]",
            "--trainer.enable_checkpointing",
            "false",
            *extra,
        ],
        run=False,
    )
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return timer.steps / timer.seconds


def _model_and_data(batch_size: int | None, dim: int | None, num_atoms: int | None) -> tuple:
    """The conf's RASAE and DataModule (with overrides), candidates set as the CLI's fit sets them."""
    model_args, data_args = _overrides(batch_size, dim, num_atoms)
    model = hub.create("ra-sae", **model_args)
    dm = hub.datamodule("ra-sae", **data_args)
    dm.setup("fit")
    model.set_candidates(dm.candidate_points(model.hparams.num_candidates, seed=model.hparams.candidates_seed))
    return model, dm


def plain_steps_per_second(
    epochs: int, batch_size: int | None, dim: int | None = None, num_atoms: int | None = None
) -> float:
    model, dm = _model_and_data(batch_size, dim, num_atoms)
    sae = model.sae.train()
    opt = torch.optim.Adam(sae.parameters(), lr=model.hparams.lr)
    loader = dm.train_dataloader()
    steps, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x in loader:
            loss = model._loss(x)[0]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
            opt.step()
            steps += 1
    return steps / (time.perf_counter() - start)


class _Bare(L.LightningModule):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model._loss(batch)[0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.model.sae.parameters(), lr=self.model.hparams.lr)


def bare_lightning_steps_per_second(
    epochs: int, batch_size: int | None, dim: int | None = None, num_atoms: int | None = None
) -> float:
    model, dm = _model_and_data(batch_size, dim, num_atoms)
    timer = _Timer()
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[timer],
    )
    trainer.fit(_Bare(model), train_dataloaders=dm.train_dataloader())
    return timer.steps / timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=None, help="override the conf's data batch size")
    parser.add_argument("--dim", type=int, default=None, help="override the activation width (data and model)")
    parser.add_argument("--num-atoms", type=int, default=None, help="override the number of concepts")
    args = parser.parse_args()
    lightning, bare, plain = [], [], []
    for _ in range(args.repeats):
        scale = (args.epochs, args.batch_size, args.dim, args.num_atoms)
        plain.append(plain_steps_per_second(*scale))
        bare.append(bare_lightning_steps_per_second(*scale))
        lightning.append(lightning_steps_per_second(*scale))
    pl_med, bare_med, plain_med = statistics.median(lightning), statistics.median(bare), statistics.median(plain)
    print(f"plain loop    : {[round(v) for v in plain]} steps/s, median {plain_med:.0f}")
    print(f"bare Lightning: {[round(v) for v in bare]} steps/s, median {bare_med:.0f}")
    print(f"zoo fit       : {[round(v) for v in lightning]} steps/s, median {pl_med:.0f}")
    print(
        f"zoo fit / plain = {pl_med / plain_med:.2f}, bare Lightning / plain = {bare_med / plain_med:.2f}, "
        f"zoo fit / bare Lightning = {pl_med / bare_med:.2f}"
    )


if __name__ == "__main__":
    main()
