"""``ZooCLI``: Lightning's ``LightningCLI`` with the zoo's defaults (subclass mode, ``--pretrained``, Rich bar)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path
from typing import Any

from lightning import LightningDataModule, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from zoo.module import ZooModule

__all__ = ["ZooCLI"]


def _check_checkpoint(path: Path) -> None:
    """Refuse a missing or corrupt Lightning checkpoint with one clear error (torch.load's is cryptic)."""
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}. Pass a .ckpt written by `zoo fit` (see its last lines).")
    # torch.save writes a zip archive: anything else is truncated or not a checkpoint at all.
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a readable checkpoint (not a torch zip archive): it is corrupt, truncated or another "
            "kind of file. Resume from another checkpoint, or drop --ckpt_path to start afresh."
        )


class ZooCLI(LightningCLI):
    """``LightningCLI`` over every ``ZooModule`` and ``LightningDataModule`` (subclass mode).

    Adds ``--pretrained NAME_OR_DIR``: after the classes are built, the hub entry's verified safetensors weights are
    loaded into the model (strict), so ``fit`` fine-tunes with a fresh optimiser and ``test`` evaluates them. A
    Rich progress bar is added unless the config has a progress bar or disables it.

    Example:
        >>> cli = ZooCLI(args=["-c", "conf/ra-sae.yaml", "--trainer.max_epochs", "1"], run=False)  # doctest: +SKIP
    """

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        self._pretrained_folder = None
        super().__init__(
            ZooModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--pretrained",
            type=str | None,
            default=None,
            help="Start from hub weights: an entry name (`zoo list`) or an entry folder. The optimiser starts fresh "
            "(fine-tuning). The model's init args must match the entry's config.json.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # LightningCLI reads --ckpt_path's hyperparameters while parsing: check the file before it does.
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            for i, arg in enumerate(argv):
                value = argv[i + 1] if arg == "--ckpt_path" and i + 1 < len(argv) else None
                value = arg.split("=", 1)[1] if arg.startswith("--ckpt_path=") else value
                if value and value not in ("last", "best", "hpc", "registry", "null"):
                    _check_checkpoint(Path(value))
        super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        # Fail early, before any data is built, on a pretrained name that does not exist.
        pretrained = self._get(self.config, "pretrained")
        if pretrained:
            from zoo import hub

            self._pretrained_folder = hub.find(pretrained)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if self._pretrained_folder is not None:
            from zoo import hub

            hub.verify_checksums(self._pretrained_folder, hub.read_config(self._pretrained_folder))
            hub.load_weights(self.model, self._pretrained_folder)
            print(f"Starting from hub weights {self._pretrained_folder}")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._get(self.config_init, "trainer", default={})
        callbacks = config.get("callbacks") or []
        wants_bar = config.get("enable_progress_bar") is not False
        if wants_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
            # Redrawn every 10 batches: at every batch Rich cost 6 % of a small model's step (measured with
            # tests/benchmarks/bench_fit_speed.py), and 10 batches still refresh many times a second.
            self.trainer_defaults["callbacks"] = [RichProgressBar(refresh_rate=10)]
        return super().instantiate_trainer(**kwargs)

    def after_fit(self) -> None:
        trainer = self.trainer
        log_dir = trainer.log_dir  # a collective call under DDP: every rank must make it
        if not trainer.is_global_zero:
            return
        print(f"\nTraining done. Logs: {log_dir}")
        ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if ckpt:
            print(
                f"Checkpoint: {ckpt}\n  resume: add --ckpt_path {ckpt}; evaluate: zoo test -c <conf> --ckpt_path {ckpt}"
            )
        metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if metrics:
            print(f"Validation metrics: {metrics}")
