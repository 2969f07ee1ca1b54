"""Labelled image classification data: the embedded digits, the CIFARs and image folders, served in whole batches.

:class:`ImageDataModule` serves ``(x, y)`` batches (``(x, y, index)`` training batches with ``with_index``). Sources:

* ``"digits"`` (default, the embedded data): scikit-learn's 8×8 digits, pixels / 16, a stratified 1297 / 500 split;
* ``"photo-patches"`` (embedded, continuous-tone colour): 8×8 RGB tiles of seven scikit-image photographs, the class
  being the photograph (:func:`photo_patches`), a stratified 5100 / 500 split of 800 tiles per photograph;
* ``"cifar10"`` / ``"cifar100"``: torchvision's files under ``data_dir`` (``cifar-10-batches-py/``,
  ``cifar-100-python/``), kept as bytes, with random crop 32 (padding 4) and horizontal flips applied to whole
  training batches on tensors, and the usual per-channel normalisation;
* ``"imagefolder"`` (ImageNet-1k and the like): ``data_dir/train/<class>/*`` and ``data_dir/val/<class>/*`` (the
  ImageNet validation images sorted into class folders), random-resized crops of 224 and flips for training,
  resize 256 + centre crop 224 for evaluation, ImageNet normalisation.

DUAL's pruning workflow (indexed training batches, kept subsets, pruning from scores, label noise) is
``zoo.models.dual.data.PrunableImageDataModule``, a subclass that lives with the paper because it runs DUAL's scoring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from zoo.datamodules.base import BatchedDataModule

__all__ = ["PHOTOS", "ImageDataModule", "IndexedImageFolder", "IndexedImages", "photo_patches", "random_crop_flip"]

#: The scikit-image colour photographs of ``dataset="photo-patches"`` (shipped with scikit-image: no download).
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
_EMBEDDED = ("digits", "photo-patches")

_CIFAR_STATS = {
    "cifar10": ((125.3, 123.0, 113.9), (63.0, 62.1, 66.7)),
    "cifar100": ((129.3, 124.1, 112.4), (68.2, 65.4, 70.4)),
}


def random_crop_flip(x: Tensor, padding: int = 4, generator: torch.Generator | None = None) -> Tensor:
    """Random crops of the zero-padded images and random horizontal flips, for a whole batch ``(B, C, H, W)`` at once.

    Example:
        >>> random_crop_flip(torch.rand(5, 3, 32, 32), generator=torch.Generator().manual_seed(0)).shape
        torch.Size([5, 3, 32, 32])
    """
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator)
    left = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator)
    rows = (top + torch.arange(h))[:, None, :, None]
    cols = (left + torch.arange(w))[:, None, None, :]
    flip = torch.rand(b, generator=generator) < 0.5
    cols = torch.where(flip[:, None, None, None], cols.flip(-1), cols)
    return padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]


def photo_patches(per_class: int = 800, size: int = 8, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Non-overlapping ``size``×``size`` RGB tiles of the :data:`PHOTOS`, ``per_class`` from each, drawn at random from
    the photograph's grid of tiles; the label is the photograph. Pixels / 255, in [0, 1].

    A continuous-tone task: unlike the nearly binary digits, quantising the pixels (bit-depth reduction) destroys
    much of the class signal, so input transformations do not solve robust classification here.

    Example:
        >>> x, y = photo_patches(per_class=4)
        >>> x.shape, y.tolist()[:5], bool(0 <= x.min() and x.max() <= 1)
        (torch.Size([28, 3, 8, 8]), [0, 0, 0, 0, 1], True)
    """
    import skimage.data

    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for label, name in enumerate(PHOTOS):
        image = getattr(skimage.data, name)()[..., :3]
        rows, cols = image.shape[0] // size, image.shape[1] // size
        tiles = image[: rows * size, : cols * size].reshape(rows, size, cols, size, 3).transpose(0, 2, 4, 1, 3)
        tiles = tiles.reshape(rows * cols, 3, size, size)
        if per_class > len(tiles):
            raise ValueError(f"per_class={per_class}: {name} has only {len(tiles)} tiles of {size}×{size}")
        xs.append(tiles[rng.choice(len(tiles), per_class, replace=False)])
        ys.append(np.full(per_class, label))
    return torch.from_numpy(np.concatenate(xs)).float() / 255.0, torch.from_numpy(np.concatenate(ys)).long()


class IndexedImages(Dataset):
    """Images, labels and their indices in the full set; ``__getitems__`` serves a batch with one index operation."""

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        rows: Tensor | None = None,
        with_index: bool = True,
        augment: bool = False,
        mean: Tensor | None = None,
        std: Tensor | None = None,
    ) -> None:
        self.x, self.y = x, y
        self.rows = torch.arange(len(x)) if rows is None else rows
        self.with_index, self.augment, self.mean, self.std = with_index, augment, mean, std

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, ...]:
        rows = self.rows[torch.as_tensor(indices, dtype=torch.long)]
        x = self.x[rows].float()
        if self.x.dtype == torch.uint8:  # CIFAR is kept as bytes (4x less memory) and scaled per batch
            x = x / 255.0
        if self.augment:
            x = random_crop_flip(x)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return (x, self.y[rows], rows) if self.with_index else (x, self.y[rows])

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(t[0] for t in self.__getitems__([index]))


class IndexedImageFolder(Dataset):
    """An ``ImageFolder`` tree served as ``(x, y, index)`` (training) or ``(x, y)`` batches, ``rows`` a kept subset.

    Images are decoded and transformed one by one (``num_workers`` parallelises that); labels come from ``targets``
    so that label noise applies.
    """

    def __init__(self, folder: Any, targets: Tensor, rows: Tensor | None, with_index: bool, transform: Any) -> None:
        self.folder, self.targets, self.with_index, self.transform = folder, targets, with_index, transform
        self.rows = torch.arange(len(folder)) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, ...]:
        rows = self.rows[torch.as_tensor(indices, dtype=torch.long)]
        x = torch.stack([self.transform(self.folder.loader(self.folder.samples[int(r)][0])) for r in rows])
        return (x, self.targets[rows], rows) if self.with_index else (x, self.targets[rows])

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(t[0] for t in self.__getitems__([index]))


class ImageDataModule(BatchedDataModule):
    """Image classification data: the embedded digits, CIFAR-10/100 from torchvision's files, or image folders.

    Args:
        dataset: ``"digits"``, ``"photo-patches"``, ``"cifar10"``, ``"cifar100"`` or ``"imagefolder"``.
        data_dir: folder of the torchvision CIFAR files, or of ``train/`` and ``val/`` class folders.
        augment: random crop (padding 4) + horizontal flip of training batches; default on for the CIFARs, off for
            the embedded sets (image folders always use their random-resized crops).
        with_index: training batches are ``(x, y, index)`` (index into the full training set) instead of ``(x, y)``.
        download: let torchvision download the CIFAR files into ``data_dir`` when they are absent (needs a network).
        val_size: images held out of the training split for validation (seeded); 0: the validation loader serves the
            test split, as the CIFAR papers' code evaluates.
        test_size: test images of the embedded sets (the CIFARs and image folders have their own test split).
        batch_size: images per batch.
        num_workers: DataLoader workers.
        seed: seed of the embedded sets' split (and of the photo tiles drawn) and of the validation hold-out.
        normalize: standardise the CIFARs and image folders per channel (their papers' recipe); ``False`` serves
            them in [0, 1], as adversarial attacks need (their ε is in pixel units): put any normalisation inside the
            model then. The embedded sets are always in [0, 1].

    Example:
        >>> dm = ImageDataModule(batch_size=64)
        >>> dm.setup("fit")
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> x.shape, len(dm.train_set), len(dm.test_set), dm.num_classes, dm.in_shape
        (torch.Size([64, 1, 8, 8]), 1297, 500, 10, [1, 8, 8])
    """

    def __init__(
        self,
        dataset: str = "digits",
        data_dir: str | None = None,
        augment: bool | None = None,
        with_index: bool = False,
        download: bool = False,
        val_size: int = 0,
        test_size: int = 500,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        choices = (*_EMBEDDED, "cifar10", "cifar100", "imagefolder")
        if dataset not in choices:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(map(repr, choices))}")
        if val_size < 0:
            raise ValueError(f"val_size must be ≥ 0, got {val_size}")
        self.augment, self.with_index, self.download, self.val_size = augment, with_index, download, val_size
        self.normalize = normalize
        if type(self) is ImageDataModule:  # subclasses save their own arguments (the CLI and the hub rebuild from them)
            self.save_hyperparameters()
        # imagefolder: set in setup
        self.num_classes = {"cifar100": 100, "imagefolder": 0, "photo-patches": len(PHOTOS)}.get(dataset, 10)

    @property
    def in_shape(self) -> list[int]:
        """Shape of one image ``[C, H, W]`` as the loaders serve it."""
        shapes = {"digits": [1, 8, 8], "photo-patches": [3, 8, 8], "imagefolder": [3, 224, 224]}
        return shapes.get(self.hparams.dataset, [3, 32, 32])

    def _load(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        hp = self.hparams
        if hp.dataset in _EMBEDDED:
            from sklearn.model_selection import train_test_split

            if hp.dataset == "digits":
                from sklearn.datasets import load_digits

                data = load_digits()
                x = torch.from_numpy(data.images).float()[:, None] / 16.0
                y = torch.from_numpy(data.target).long()
            else:
                x, y = photo_patches(seed=hp.seed)
            train, test = train_test_split(
                np.arange(len(y)), test_size=hp.test_size, stratify=y.numpy(), random_state=hp.seed
            )
            train, test = np.sort(train), np.sort(test)
            return x[train], y[train], x[test], y[test]
        import torchvision

        cls = torchvision.datasets.CIFAR10 if hp.dataset == "cifar10" else torchvision.datasets.CIFAR100
        if hp.data_dir is None:
            raise ValueError(f"dataset={hp.dataset!r} needs data_dir, the folder torchvision keeps it in")
        try:
            parts = [cls(hp.data_dir, train=train, download=self.download) for train in (True, False)]
        except RuntimeError as err:
            raise FileNotFoundError(
                f"{hp.dataset.upper()} is not in {hp.data_dir}: {err}. Put torchvision's files there "
                f"(download=True here, or torchvision.datasets.{cls.__name__}(root, download=True) on a machine with a network)."
            ) from err
        out = []
        for part in parts:
            out += [torch.from_numpy(part.data).permute(0, 3, 1, 2).contiguous(), torch.as_tensor(part.targets)]
        return tuple(out)

    def _folders(self) -> tuple[Any, Any]:
        import torchvision
        from torchvision import transforms as T

        root = Path(self.hparams.data_dir or "").expanduser()
        missing = [root / part for part in ("train", "val") if not (root / part).is_dir()]
        if self.hparams.data_dir is None or missing:
            raise FileNotFoundError(
                f"No image folders at {missing[0] if missing else root}: dataset='imagefolder' needs data_dir with "
                "train/<class>/<image> and val/<class>/<image> (ImageNet's validation images sorted into class folders)"
            )
        standardise = [T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))] if self.normalize else []
        train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), *standardise])
        test_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), *standardise])
        train = torchvision.datasets.ImageFolder(str(root / "train"))
        test = torchvision.datasets.ImageFolder(str(root / "val"))
        return (train, train_tf), (test, test_tf)

    # Hooks of subclasses that change the training split (label noise, a kept subset).
    def _train_labels(self, y: Tensor) -> Tensor:
        return y

    def _train_rows(self, x: Tensor | None, y: Tensor, stage: str | None) -> Tensor | None:
        """Rows of the full training set to train on (None: all); ``x`` normalised, or None for image folders."""
        return None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.dataset == "imagefolder":
            (train, train_tf), (test, test_tf) = self._folders()
            self.num_classes = len(train.classes)
            y = self._train_labels(torch.as_tensor(train.targets))
            keep, val_rows = self._hold_out(self._train_rows(None, y, stage), len(y))
            self.train_set = IndexedImageFolder(train, y, keep, self.with_index, train_tf)
            self.test_set = IndexedImageFolder(test, torch.as_tensor(test.targets), None, False, test_tf)
            self.val_set = self.test_set if val_rows is None else IndexedImageFolder(train, y, val_rows, False, test_tf)
            return
        x, y, x_test, y_test = self._load()
        y = self._train_labels(y)
        mean = std = None
        if hp.dataset in _CIFAR_STATS and self.normalize:
            m, s = _CIFAR_STATS[hp.dataset]
            mean, std = torch.tensor(m)[:, None, None] / 255, torch.tensor(s)[:, None, None] / 255
        augment = hp.dataset not in _EMBEDDED if self.augment is None else self.augment
        keep = self._train_rows(x if mean is None else (x.float() / 255 - mean) / std, y, stage)
        keep, val_rows = self._hold_out(keep, len(y))
        self.train_set = IndexedImages(x, y, keep, self.with_index, augment, mean, std)
        self.test_set = IndexedImages(x_test, y_test, None, False, False, mean, std)
        self.val_set = self.test_set if val_rows is None else IndexedImages(x, y, val_rows, False, False, mean, std)

    def _hold_out(self, keep: Tensor | None, n: int) -> tuple[Tensor | None, Tensor | None]:
        """Split ``val_size`` seeded random rows off the training rows: (training rows, validation rows or None)."""
        if not self.val_size:
            return keep, None
        rows = torch.arange(n) if keep is None else keep
        if self.val_size >= len(rows):
            raise ValueError(f"val_size={self.val_size} leaves no training images out of {len(rows)}")
        rows = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.hparams.seed))]
        return rows[self.val_size :].sort().values, rows[: self.val_size].sort().values

    @property
    def num_train(self) -> int:
        """Size of the *full* training set (the length of a training-dynamics record)."""
        self.setup("fit")
        return len(self.train_set.targets if isinstance(self.train_set, IndexedImageFolder) else self.train_set.x)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        return f"{hp.dataset}: the training split, batch {hp.batch_size}"
