"""``PrunableImageDataModule``: image classification with indexed training batches and a pruned subset (DUAL).

It lives with the paper, not in ``datamodules/``: pruning runs DUAL's scoring and selection, and data never depends
on a model package. It subclasses the shared :class:`datamodules.images.ImageDataModule`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from zoo.datamodules.images import ImageDataModule
from zoo.models.dual.pruning import METHODS, load_record, prune_indices, score_run
from zoo.models.dual.scores import keep_count

__all__ = ["PrunableImageDataModule"]


class PrunableImageDataModule(ImageDataModule):
    """Image classification with indexed training batches and an optional kept subset (DUAL's pruning workflow).

    Args:
        dataset: ``"digits"``, ``"cifar10"``, ``"cifar100"`` or ``"imagefolder"``.
        data_dir: folder of the torchvision CIFAR files, or of ``train/`` and ``val/`` class folders.
        keep_indices: training subset: indices into the full training set, or a ``.npy`` file of them.
        prune_ratio: fraction of the training set to prune, in (0, 1) (None: keep all or ``keep_indices``).
        prune_method: ``"dual_beta"`` (default), ``"dual"``, ``"dyn_unc"``, ``"el2n"``, ``"aum"``, ``"ccs"`` (CCS over
            AUM, as its paper runs it) or ``"random"``.
        scores: ``dynamics.npz`` / score ``.npy`` path, or ``"auto"`` (score here with DUAL's short run).
        score_epochs: T, the recorded epochs DUAL scores: the length of the ``"auto"`` scoring run (its cosine is built
            for 200), and the epochs a ``dynamics.npz`` must hold at least.
        hard_cut: CCS's hard cut, the fraction of lowest-margin samples dropped before stratifying, in [0, 1).
        c_d: DUAL + β's c_D.
        prune_seed: seed of the scoring run and of the sampling.
        label_noise: fraction of training labels flipped uniformly to another class, in [0, 1).
        noise_seed: seed of the flips.
        test_size: test images of ``digits`` (the CIFARs have their own test split).
        batch_size: images per batch.
        num_workers: DataLoader workers.
        seed: seed of the ``digits`` split.

    Training batches are ``(x, y, index)``; the validation loader serves the test split (as the official DUAL code
    evaluates).

    Example:
        >>> dm = PrunableImageDataModule(batch_size=64)
        >>> dm.setup("fit")
        >>> x, y, index = next(iter(dm.train_dataloader()))
        >>> x.shape, len(dm.train_set), dm.num_classes
        (torch.Size([64, 1, 8, 8]), 1297, 10)
    """

    def __init__(
        self,
        dataset: str = "digits",
        data_dir: str | None = None,
        keep_indices: list[int] | str | None = None,
        prune_ratio: float | None = None,
        prune_method: str = "dual_beta",
        scores: str | None = None,
        score_epochs: int = 30,
        c_d: float = 4.0,
        hard_cut: float = 0.2,
        prune_seed: int = 0,
        label_noise: float = 0.0,
        noise_seed: int = 0,
        test_size: int = 500,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(
            dataset,
            data_dir,
            with_index=True,
            test_size=test_size,
            batch_size=batch_size,
            num_workers=num_workers,
            seed=seed,
        )
        if not 0 <= hard_cut < 1:
            raise ValueError(f"hard_cut must be in [0, 1), got {hard_cut}")
        if score_epochs < 2:
            raise ValueError(f"score_epochs must be >= 2 (DUAL's windows need two epochs), got {score_epochs}")
        if not 0 <= label_noise < 1:
            raise ValueError(f"label_noise must be in [0, 1), got {label_noise}")
        if prune_ratio is not None:
            keep_count(1, prune_ratio)  # checks 0 < ratio < 1
            if keep_indices is not None:
                raise ValueError("give keep_indices or prune_ratio, not both")
            if prune_method not in METHODS:
                raise ValueError(f"unknown prune_method {prune_method!r}; choose one of {METHODS}")
            if prune_method != "random" and scores is None:
                raise ValueError(f"prune_method={prune_method!r} needs scores: a dynamics.npz, a .npy or 'auto'")
        self.save_hyperparameters(ignore=["augment", "with_index"])
        self.noisy: Tensor | None = None

    def _keep(self, n: int) -> Tensor | None:
        keep = self.hparams.keep_indices
        if keep is None:
            return None
        if isinstance(keep, str):
            path = Path(keep).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"No index file at {path}: keep_indices is an .npy file of training indices")
            keep = np.load(path, allow_pickle=False)
        array = np.asarray(keep)
        if array.size and not np.issubdtype(array.dtype, np.integer):  # 3.7 would silently become index 3
            source = self.hparams.keep_indices
            where = f"the keep_indices file {source}" if isinstance(source, str) else "keep_indices"
            raise ValueError(
                f"{where} must hold integer sample indices, got dtype {array.dtype}: save them as int64 "
                "(np.save(path, indices.astype(np.int64)))"
            )
        rows = torch.as_tensor(array, dtype=torch.long).flatten()
        if len(rows) == 0 or int(rows.min()) < 0 or int(rows.max()) >= n:
            raise ValueError(f"keep_indices must index the {n} training samples (0 … {n - 1})")
        if len(rows.unique()) != len(rows):
            raise ValueError("keep_indices holds duplicates")
        return rows.sort().values

    def _train_labels(self, y: Tensor) -> Tensor:
        """Flip ``label_noise`` of the labels uniformly to another class (seeded); marks them in ``noisy``."""
        y = y.clone()
        g = torch.Generator().manual_seed(self.hparams.noise_seed)
        self.noisy = torch.rand(len(y), generator=g) < self.hparams.label_noise
        shift = torch.randint(1, self.num_classes, (len(y),), generator=g)
        y[self.noisy] = (y[self.noisy] + shift[self.noisy]) % self.num_classes
        return y

    def _train_rows(self, x: Tensor | None, y: Tensor, stage: str | None) -> Tensor | None:
        keep = self._keep(len(y))
        # Evaluation never needs the pruned split.
        if self.hparams.prune_ratio is not None and stage in (None, "fit"):
            keep = self._prune(x, y).sort().values
        return keep

    def _prune(self, x: Tensor | None, y: Tensor) -> Tensor:
        hp = self.hparams
        record = None
        if hp.prune_method != "random":
            if hp.scores == "auto":
                if hp.dataset != "digits":
                    raise ValueError(
                        "scores='auto' runs the small MLP scoring loop of the embedded digits; for "
                        f"{hp.dataset} record the dynamics with conf/dual-score.yaml and pass its dynamics.npz"
                    )
                record = score_run(
                    x,
                    y,
                    epochs=hp.score_epochs,
                    batch_size=hp.batch_size,
                    seed=hp.prune_seed,
                )
            else:
                record = load_record(hp.scores, len(y))
        return prune_indices(
            hp.prune_method,
            hp.prune_ratio,
            record,
            len(y),
            c_d=hp.c_d,
            seed=hp.prune_seed,
            epochs=hp.score_epochs,
            hard_cut=hp.hard_cut,
        )

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        subset = "all of the training split" if hp.keep_indices is None else "a kept subset of the training split"
        if hp.prune_ratio is not None:
            source = "DUAL's 30-epoch scoring run" if hp.scores == "auto" else f"`{hp.scores}`"
            subset = (
                f"{1 - hp.prune_ratio:.0%} of the training split, pruned by `{hp.prune_method}` at "
                f"r = {hp.prune_ratio} (scores from {source})"
            )
        noise = f", {hp.label_noise:.0%} symmetric label noise (seed {hp.noise_seed})" if hp.label_noise else ""
        return f"{hp.dataset}: {subset}{noise}, batch {hp.batch_size}"
