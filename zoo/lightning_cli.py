"""``ZooCLI``: Lightning's ``LightningCLI`` with the zoo's defaults (subclass mode, ``--pretrained``, Rich bar)."""

from __future__ import annotations

import re
import shlex
import sys
import zipfile
from pathlib import Path
from typing import Any

from lightning import LightningDataModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from zoo.module import ZooModule

__all__ = ["ZooCLI"]


def _last_checkpoints(trainer: Trainer) -> list[Path]:
    """Every ``last.ckpt`` (``last-v1.ckpt``...) the trainer's checkpoint callbacks may have written in earlier runs.

    Lightning looks for ``--ckpt_path last`` only in the folder this run will write to, and with a versioned logger
    that is a new ``version_N/checkpoints`` folder, always empty. So this searches the checkpoint folders of every
    version under the logger's ``save_dir/name`` (or ``default_root_dir/checkpoints`` without a logger), and any
    callback's explicit ``dirpath``.
    """
    folders: set[Path] = set()
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            folders.add(Path(callback.dirpath))
    if trainer.loggers:
        logger = trainer.loggers[0]
        root = Path(logger.save_dir if logger.save_dir is not None else trainer.default_root_dir) / str(logger.name)
        folders.update(p for p in root.glob("*/checkpoints") if p.is_dir())
    else:
        folders.add(Path(trainer.default_root_dir) / "checkpoints")
    last = re.compile(rf"^{ModelCheckpoint.CHECKPOINT_NAME_LAST}(-v\d+)?$")
    return [p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt") if last.match(p.stem)]


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
        self._argv: list[str] | None = None
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
        self._argv = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else None  # for the resume command
        if isinstance(argv, (list, tuple)):
            for i, arg in enumerate(argv):
                value = argv[i + 1] if arg == "--ckpt_path" and i + 1 < len(argv) else None
                value = arg.split("=", 1)[1] if arg.startswith("--ckpt_path=") else value
                if value and value not in ("last", "best", "hpc", "registry", "null"):
                    _check_checkpoint(Path(value))
        super().parse_arguments(parser, args)

    def before_fit(self) -> None:
        # `--ckpt_path last`: the newest last.ckpt of this conf's earlier runs (see _last_checkpoints), as a path.
        config = self.config_init[self.subcommand]
        if config.get("ckpt_path") == "last":
            found = _last_checkpoints(self.trainer)
            if not found:
                raise FileNotFoundError(
                    "--ckpt_path last: no last.ckpt to resume from in the checkpoint folders of this conf's runs "
                    "(written by a ModelCheckpoint with save_last: true). Drop --ckpt_path to start afresh, or give "
                    "a checkpoint file."
                )
            config["ckpt_path"] = str(max(found, key=lambda p: p.stat().st_mtime))
            if self.trainer.is_global_zero:
                print(f"Resuming from {config['ckpt_path']}")

    def before_instantiate_classes(self) -> None:
        # Fail early, before any data is built, on a pretrained name that does not exist.
        pretrained = self._get(self.config, "pretrained")
        if pretrained:
            from zoo import hub

            self._pretrained_folder = hub.find(pretrained)
        self._link_data_to_model()

    def _link_data_to_model(self) -> None:
        """Set the model's init args that its class takes from the data (``DATA_LINKS``: init arg -> DataModule
        attribute after ``setup``), e.g. RCSC's view widths and cluster count from a ``.mat`` file, so one data flag
        is enough. A DataModule init arg of the same name gets the same value (Lightning refuses to log hyperparameters
        that differ between the two). A value given for the model that the data contradicts is replaced, with a note.
        """
        from jsonargparse import Namespace

        from zoo.registry import import_object

        prefix = f"{self.subcommand}." if self.subcommand else ""
        model, data = self.config.get(f"{prefix}model"), self.config.get(f"{prefix}data")
        if not isinstance(model, Namespace) or not isinstance(data, Namespace) or not model.get("class_path"):
            return
        links = getattr(import_object(model.class_path), "DATA_LINKS", None)
        if not links:
            return
        data_args = dict(data.get("init_args") or {})
        dm = import_object(data.class_path)(**data_args)
        dm.setup("fit")
        for arg, attribute in links.items():
            value = getattr(dm, attribute)
            given = model.init_args.get(arg)
            if given is not None and given != value:
                print(f"Note: model.init_args.{arg} set to {value} from the data (the config said {given})")
            self.config[f"{prefix}model.init_args.{arg}"] = value
            if arg in data_args:
                self.config[f"{prefix}data.init_args.{arg}"] = value

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

    def _command(self, subcommand: str, ckpt_path: str, everything: bool) -> str:
        """``zoo <subcommand>`` with this run's configs (``everything``: all its arguments) and ``ckpt_path``."""
        argv = list(self._argv or [])
        if not argv or argv[0] != "fit":
            return f"zoo {subcommand} -c <conf> --ckpt_path {ckpt_path}"
        kept, i = [subcommand], 1
        while i < len(argv):
            arg = argv[i]
            if arg == "--ckpt_path" or arg.startswith("--ckpt_path="):
                i += 1 if "=" in arg else 2
            elif arg in ("-c", "--config") and i + 1 < len(argv):
                kept += argv[i : i + 2]
                i += 2
            else:
                kept += [arg] if everything else []
                i += 1
        return "zoo " + shlex.join([*kept, "--ckpt_path", ckpt_path])

    def after_fit(self) -> None:
        trainer = self.trainer
        log_dir = trainer.log_dir  # a collective call under DDP: every rank must make it
        if not trainer.is_global_zero:
            return
        print(f"\nTraining done. Logs: {log_dir}")
        callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        best = next((c.best_model_path for c in callbacks if c.monitor and c.best_model_path), "")
        last = next((c.last_model_path for c in callbacks if c.last_model_path), "")
        if best:
            print(f"Best checkpoint: {best}\n  evaluate: {self._command('test', best, everything=False)}")
        if last:
            # last.ckpt is the latest state (weights, optimiser, loops, data order, random states): resuming from it
            # ends where an uninterrupted fit would have; raise --trainer.max_epochs / max_steps to train longer.
            print(f"Last checkpoint: {last}\n  resume: {self._command('fit', 'last', everything=True)}")
        metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if metrics:
            print(f"Validation metrics: {metrics}")
