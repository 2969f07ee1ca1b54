"""``BatchedDataModule``: the loaders every zoo DataModule shares (batched indexing, identity collate)."""

from __future__ import annotations

from typing import Any

from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

__all__ = ["BatchedDataModule", "identity_collate"]


def identity_collate(batch: Any) -> Any:
    """Collate for datasets with ``__getitems__``: the dataset already returns the whole batch."""
    return batch


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
