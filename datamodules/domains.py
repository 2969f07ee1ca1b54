"""Images of a source and a target domain for diffusion fine-tuning (TimeStep Master's domain adaptation).

:class:`DomainShiftDataModule` serves ``(x, y)`` batches of images in [−1, 1] from :class:`ImageDataModule`'s sources:

* ``"digits"`` (default, the embedded data): the TSM card's shift: the *source* domain is digits 0–4, the *target*
  domain digits 5–9 with inverted contrast (x → −x), 8×8 pixels / 8 − 1;
* ``"imagefolder"`` and the CIFARs: the real path, ``domain`` picks the classes (``classes``) and ``invert`` the
  polarity; image folders are read at ``image_size`` (resize + centre crop) for a diffusion model of that size.

A held-out validation split (``val_fraction`` of the domain's training images, seeded) scores denoising losses.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches

__all__ = ["DomainShiftDataModule"]


class DomainShiftDataModule(BatchedDataModule):
    """A source or target domain of images in [−1, 1], with a seeded validation split.

    Args:
        domain: ``"source"`` or ``"target"``.
        dataset: ``"digits"``, ``"cifar10"``, ``"cifar100"`` or ``"imagefolder"`` (see :class:`ImageDataModule`).
        data_dir: where the CIFARs or the image folders are.
        source_classes: the source domain's classes (digits: 0–4).
        target_classes: the target domain's classes (digits: 5–9).
        invert_target: flip the target images' sign (the card's contrast inversion).
        image_size: image folders: side of the square images.
        val_fraction: held-out fraction of the domain's training images.
        batch_size: images per batch.
        num_workers: DataLoader workers.
        seed: seed of the splits.

    Example:
        >>> dm = DomainShiftDataModule("target", batch_size=32)
        >>> dm.setup("fit")
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> x.shape, int(y.min()) >= 5, float(x.max()) <= 1.0, len(dm.train_set) + len(dm.val_set)
        (torch.Size([32, 1, 8, 8]), True, True, 896)
    """

    def __init__(
        self,
        domain: Literal["source", "target"] = "target",
        dataset: str = "digits",
        data_dir: str | None = None,
        source_classes: Sequence[int] = (0, 1, 2, 3, 4),
        target_classes: Sequence[int] = (5, 6, 7, 8, 9),
        invert_target: bool = True,
        image_size: int = 32,
        val_fraction: float = 0.2,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if domain not in ("source", "target"):
            raise ValueError(f"domain must be 'source' or 'target', got {domain!r}")
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.save_hyperparameters()

    @property
    def in_shape(self) -> list[int]:
        return [int(s) for s in self._require().tensors[0].shape[1:]]

    def _require(self) -> TensorBatches:
        if self.train_set is None:
            raise RuntimeError("call setup() first")
        return self.train_set

    def _images(self) -> tuple[Tensor, Tensor]:
        """All images of the dataset in [−1, 1] and their labels."""
        hp = self.hparams
        if hp.dataset == "digits":
            from sklearn.datasets import load_digits

            data = load_digits()
            return torch.from_numpy(data.images).float()[:, None] / 8.0 - 1.0, torch.from_numpy(data.target).long()
        from zoo.datamodules.images import ImageDataModule

        images = ImageDataModule(hp.dataset, hp.data_dir, augment=False, test_size=1)
        if hp.dataset != "imagefolder":
            x, y, x_test, y_test = images._load()
            return torch.cat([x, x_test]).float() / 127.5 - 1.0, torch.cat([y, y_test]).long()
        from torchvision import transforms as T

        (train, _), _ = images._folders()
        tf = T.Compose([T.Resize(hp.image_size), T.CenterCrop(hp.image_size), T.ToTensor()])
        x = torch.stack([tf(train.loader(path)) for path, _ in train.samples]) * 2 - 1
        return x, torch.as_tensor(train.targets)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        x, y = self._images()
        classes = hp.source_classes if hp.domain == "source" else hp.target_classes
        keep = torch.isin(y, torch.as_tensor(list(classes)))
        if not bool(keep.any()):
            raise ValueError(f"no images of classes {list(classes)} in {hp.dataset}")
        x, y = x[keep], y[keep]
        if hp.domain == "target" and hp.invert_target:
            x = -x
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(hp.seed))
        n_val = max(1, round(hp.val_fraction * len(y)))
        val, train = order[:n_val].sort().values, order[n_val:].sort().values
        self.train_set = TensorBatches(x[train], y[train])
        self.val_set = self.test_set = TensorBatches(x[val], y[val])

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        classes = hp.source_classes if hp.domain == "source" else hp.target_classes
        inverted = ", inverted" if hp.domain == "target" and hp.invert_target else ""
        return (
            f"{hp.dataset} {hp.domain} domain: classes {list(classes)}{inverted}, in [-1, 1]; "
            f"{1 - hp.val_fraction:.0%} / {hp.val_fraction:.0%} split (seed {hp.seed}), batch {hp.batch_size}"
        )
