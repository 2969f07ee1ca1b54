"""``BatchedDataModule``: the loaders every zoo DataModule shares (batched indexing, identity collate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = ["BatchedDataModule", "TensorBatches", "identity_collate"]


def identity_collate(batch: Any) -> Any:
    """Collate for datasets with ``__getitems__``: the dataset already returns the whole batch."""
    return batch


class TensorBatches(Dataset):
    """Rows of equally long tensors, served as a tuple of whole batches by one index operation per tensor.

    Example:
        >>> data = TensorBatches(torch.arange(6).view(3, 2), torch.tensor([7, 8, 9]))
        >>> data.__getitems__([2, 0])
        (tensor([[4, 5],
                [0, 1]]), tensor([9, 7]))
    """

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors or len({len(t) for t in tensors}) != 1:
            raise ValueError(f"TensorBatches needs tensors of one length, got {[len(t) for t in tensors]}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, ...]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return tuple(t[idx] for t in self.tensors)

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)


class BatchedDataModule(LightningDataModule):
    """Base of DataModules whose datasets serve a whole batch per ``__getitems__`` call.

    Subclasses save ``batch_size`` and ``num_workers`` with ``save_hyperparameters()`` and fill ``train_set``,
    ``val_set`` and ``test_set`` in ``setup``; the loaders (shuffled for training, ordered otherwise, ``predict`` on
    the test split) come from here, with an identity collate so no per-sample Python runs in the loop.
    """

    train_set: Dataset | None = None
    val_set: Dataset | None = None
    test_set: Dataset | None = None

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for a dataloader.")
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            collate_fn=identity_collate,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
