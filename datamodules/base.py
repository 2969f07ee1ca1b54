"""``BatchedDataModule``: the loaders every zoo DataModule shares (batched indexing, identity collate), resumable.

The training loader is a :class:`ResumableDataLoader` over a :class:`ResumableRandomSampler` (or, for ordered data, a
:class:`ResumableSequentialSampler`): Lightning saves its position in every checkpoint (the ``state_dict`` /
``load_state_dict`` protocol of stateful loaders), so a fit resumed from a checkpoint written mid-epoch serves the
rest of the same permutation instead of starting the epoch over. The shuffled order of each pass is drawn from the
global torch RNG exactly as ``RandomSampler`` does (same numbers), and ``zoo.ZooModule`` keeps that RNG in the
checkpoint, so an epoch that starts after a resume gets the order it would have had without the interruption.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lightning import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

__all__ = [
    "BatchedDataModule",
    "DictBatches",
    "FullBatchDataModule",
    "ResumableDataLoader",
    "ResumableRandomSampler",
    "ResumableSequentialSampler",
    "TensorBatches",
    "identity_collate",
]


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


class DictBatches(Dataset):
    """Rows of a dict of equally long tensors, served as a dict of whole batches by one index operation per tensor
    (for data with several named modalities).

    Example:
        >>> data = DictBatches({"x": torch.arange(6).view(3, 2), "y": torch.tensor([7, 8, 9])})
        >>> data.__getitems__([2, 0])["y"], len(data)
        (tensor([9, 7]), 3)
    """

    def __init__(self, data: dict[str, Tensor]) -> None:
        if not data or len({len(t) for t in data.values()}) != 1:
            raise ValueError(f"DictBatches needs tensors of one length, got { {k: len(t) for k, t in data.items()} }")
        self.data = data

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {k: v[idx] for k, v in self.data.items()}

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {k: v[index] for k, v in self.data.items()}


class _ResumableOrder:
    """What the resumable samplers share: the pass's epoch, seed and start, and a pending resume point.

    ``epoch`` is set by Lightning (``set_epoch``) before every pass. ``seed`` is the seed of the current pass's
    permutation (None when the order is not random) and ``start`` the position in it where the pass began. A resume
    point given to ``resume`` applies to the next pass only if that pass is of the same epoch (a checkpoint written
    at the end of an epoch resumes with a fresh pass of the next one) and lies strictly inside it.
    """

    epoch: int = 0
    seed: int | None = None
    start: int = 0
    _resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before each training epoch."""
        self.epoch = epoch

    def resume(self, state: dict[str, Any]) -> None:
        """Start the next pass of epoch ``state["epoch"]`` at ``state["position"]`` with seed ``state["seed"]``."""
        self._resume = dict(state)

    def resumes_mid_pass(self) -> bool:
        """Whether the next pass continues a pass of this epoch part-way (the pending resume point applies)."""
        return _applies(self._resume, self.epoch, len(self))  # type: ignore[arg-type]

    def _begin(self) -> tuple[int | None, int, bool]:
        """(seed, start, resumed) of the pass that starts now; consumes the pending resume point."""
        applies, state, self._resume = self.resumes_mid_pass(), self._resume, None
        if applies:
            return state.get("seed"), int(state["position"]), True
        return None, 0, False


def _applies(state: dict[str, Any] | None, epoch: int | None, size: int) -> bool:
    """Whether a resume point lies strictly inside a pass of ``size`` samples of the sampler's current epoch."""
    return state is not None and epoch is not None and state.get("epoch") == epoch and 0 < state["position"] < size


class ResumableRandomSampler(_ResumableOrder, RandomSampler):
    """``RandomSampler`` (without replacement) that can start a pass part-way through the same permutation.

    Each pass draws its seed from the global torch RNG when it starts, as ``RandomSampler`` does, so the orders are
    the same numbers; it records that seed, and ``resume`` replays it from a position. Lightning's DDP sampler
    injection still recognises it as a shuffling sampler (a ``RandomSampler``) and swaps in a ``DistributedSampler``.

    Example:
        >>> sampler = ResumableRandomSampler(range(6))
        >>> _ = torch.manual_seed(0)
        >>> full = list(sampler)
        >>> sampler.resume({"epoch": 0, "seed": sampler.seed, "position": 4})
        >>> list(sampler) == full[4:]
        True
    """

    def __init__(self, data_source: Sequence[Any] | Dataset) -> None:
        super().__init__(data_source)

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        seed, start, resumed = self._begin()
        if not resumed or seed is None:
            seed, start = int(torch.empty((), dtype=torch.int64).random_().item()), 0
        self.seed, self.start = seed, start
        yield from torch.randperm(n, generator=torch.Generator().manual_seed(seed))[start:].tolist()


class ResumableSequentialSampler(_ResumableOrder, SequentialSampler):
    """``SequentialSampler`` that can start a pass part-way (ordered data, e.g. a stream's ``fit`` pass).

    Example:
        >>> sampler = ResumableSequentialSampler(range(5))
        >>> sampler.resume({"epoch": 0, "seed": None, "position": 3})
        >>> list(sampler), list(sampler)
        ([3, 4], [0, 1, 2, 3, 4])
    """

    def __init__(self, data_source: Sequence[Any] | Dataset) -> None:
        super().__init__(data_source)

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        _, start, _ = self._begin()
        self.seed, self.start = None, start
        yield from range(start, n)


class _LazyCountingIterator:
    """The loader's iterator, made at the first batch and counting the batches it hands out.

    Made lazily because Lightning calls ``iter()`` on the training loader once more than it uses when a fit resumes
    at an epoch boundary: a ``DataLoader`` iterator draws its worker base seed from the global torch RNG when it is
    made, and that extra draw would shift every later random number. Counted here, in the main process, so batches
    that workers prefetch are not counted. With a sampler that cannot resume, the batches already trained on are
    read and dropped instead.
    """

    def __init__(self, loader: ResumableDataLoader) -> None:
        self._loader, self._inner = loader, None

    def __iter__(self) -> _LazyCountingIterator:
        return self

    def __next__(self) -> Any:
        loader = self._loader
        if self._inner is None:
            self._inner = loader._new_iterator()
            loader._fast_forward(self._inner)
        batch = next(self._inner)
        loader._served += 1
        return batch

    def __len__(self) -> int:
        return len(self._loader)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` that Lightning can checkpoint mid-epoch: ``state_dict`` says how far the current pass got.

    Lightning stores the state of a training loader that has ``state_dict``/``load_state_dict`` in every checkpoint
    and gives it back when a fit restarts inside an epoch. With a :class:`ResumableRandomSampler` or
    :class:`ResumableSequentialSampler` the next pass then starts at the first batch not yet trained on (no batch is
    loaded twice). With another sampler whose order is a function of the epoch (the ``DistributedSampler`` Lightning
    injects under DDP) the batches already seen are read and dropped. Exact for in-process loading; with
    ``num_workers > 0`` the workers' own RNG (random augmentation in workers) starts afresh after a resume.

    Example:
        >>> loader = ResumableDataLoader(TensorBatches(torch.arange(10)), batch_size=4, collate_fn=identity_collate,
        ...                              sampler=ResumableSequentialSampler(range(10)))
        >>> it = iter(loader)
        >>> next(it)[0].tolist(), loader.state_dict()["position"]
        ([0, 1, 2, 3], 4)
        >>> loader.load_state_dict(loader.state_dict())
        >>> [b[0].tolist() for b in loader]
        [[4, 5, 6, 7], [8, 9]]
    """

    _served = 0
    _pending: dict[str, Any] | None = None

    def __iter__(self) -> _LazyCountingIterator:  # type: ignore[override]
        self._served = 0
        if isinstance(self.sampler, _ResumableOrder):
            self.sampler.seed, self.sampler.start = None, 0  # not started: a checkpoint now resumes with a fresh pass
        return _LazyCountingIterator(self)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, seed and position (samples into the pass; per process under DDP) of the current pass."""
        sampler = self.sampler
        if isinstance(sampler, _ResumableOrder) and sampler._resume is not None and not self._served:
            return dict(sampler._resume)  # a resume point not reached yet is still where this fit stands
        start = sampler.start if isinstance(sampler, _ResumableOrder) else 0
        size = len(sampler)  # type: ignore[arg-type]
        # A finished pass (drop_last may leave a few samples unserved) is at its end: a resume starts the next one.
        position = size if self._served >= len(self) else min(start + self._served * (self.batch_size or 1), size)
        return {"epoch": getattr(sampler, "epoch", None), "seed": getattr(sampler, "seed", None), "position": position}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the next pass there (if it is the same epoch and the position lies inside the pass)."""
        if isinstance(self.sampler, _ResumableOrder):
            self.sampler.resume(state_dict)
        else:
            self._pending = dict(state_dict)

    def _new_iterator(self) -> Iterator[Any]:
        """``DataLoader.__iter__``, without its draw from the global torch RNG where the uninterrupted fit made none.

        Making an iterator draws the workers' base seed. The uninterrupted fit draws it at every pass (at the first
        only, with persistent workers); a resumed fit makes a new iterator also where the uninterrupted one was
        part-way through a pass (or reused its persistent workers), and that draw would shift all later numbers.
        """
        sampler = self.sampler
        epoch = getattr(sampler, "epoch", None)
        if isinstance(sampler, _ResumableOrder):
            mid_pass = sampler.resumes_mid_pass()
        else:
            mid_pass = _applies(self._pending, epoch, len(sampler))  # type: ignore[arg-type]
        persistent = self.persistent_workers and self.num_workers > 0
        if not (mid_pass or (persistent and self._iterator is None and (epoch or 0) > 0)):
            return DataLoader.__iter__(self)
        state = torch.get_rng_state()
        try:
            return DataLoader.__iter__(self)
        finally:
            torch.set_rng_state(state)

    def _fast_forward(self, inner: Iterator[Any]) -> None:
        """At the first batch of a pass with a sampler that cannot resume: skip the batches already trained on."""
        sampler, state, self._pending = self.sampler, self._pending, None
        if isinstance(sampler, _ResumableOrder) or state is None or state.get("epoch") is None:
            return  # a resumable sampler started at the resume point itself; `start` records it
        if getattr(sampler, "epoch", None) != state["epoch"]:
            return
        skip = int(state.get("position", 0)) // (self.batch_size or 1)
        if skip < len(self):
            for _ in range(skip):
                next(inner)
            self._served = skip


class BatchedDataModule(LightningDataModule):
    """Base of DataModules whose datasets serve a whole batch per ``__getitems__`` call.

    Subclasses save ``batch_size`` and ``num_workers`` with ``save_hyperparameters()`` and fill ``train_set``,
    ``val_set`` and ``test_set`` in ``setup``; the loaders (shuffled for training, ordered otherwise, ``predict`` on
    the test split) come from here, with an identity collate so no per-sample Python runs in the loop.

    The training loader's position is also part of this DataModule's ``state_dict`` (which Lightning keeps in every
    checkpoint) and is handed to the next training loader made after ``load_state_dict``. That covers the fits where
    Lightning's own restore of a stateful loader is skipped: a module whose ``configure_optimizers`` reads
    ``trainer.estimated_stepping_batches`` makes Lightning build the training loader before the loops are restored,
    and the loops' saved loader state is then never applied. Subclasses overriding ``state_dict`` merge
    ``super().state_dict()``.
    """

    train_set: Dataset | None = None
    val_set: Dataset | None = None
    test_set: Dataset | None = None
    _train_loader: ResumableDataLoader | None = None
    _train_loader_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {} if self._train_loader is None else {"train_loader": self._train_loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._train_loader_state = state_dict.get("train_loader")

    def _loader(
        self,
        dataset: Dataset | None,
        shuffle: bool,
        *,
        train: bool = False,
        drop_last: bool = False,
        batch_size: int | None = None,
    ) -> DataLoader:
        """A loader over ``dataset``; ``train`` makes it resumable mid-epoch (see the module docstring)."""
        if dataset is None:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for a dataloader.")
        kwargs: dict[str, Any] = {
            "batch_size": batch_size or self.hparams.batch_size,
            "drop_last": drop_last,
            "collate_fn": identity_collate,
            "num_workers": self.hparams.num_workers,
            "persistent_workers": self.hparams.num_workers > 0,
        }
        if not train:
            return DataLoader(dataset, shuffle=shuffle, **kwargs)
        sampler: Sampler[int] = ResumableRandomSampler(dataset) if shuffle else ResumableSequentialSampler(dataset)
        loader = ResumableDataLoader(dataset, sampler=sampler, **kwargs)
        if self._train_loader_state is not None:  # the first training loader after a resume continues the pass
            loader.load_state_dict(self._train_loader_state)
            self._train_loader_state = None
        self._train_loader = loader
        return loader

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)


class FullBatchDataModule(BatchedDataModule):
    """A :class:`BatchedDataModule` whose every loader serves its whole split as one ordered batch.

    For methods that see all rows at once (an alternating solver, a BART screen and an SR search): the batch size
    comes from the data, so it is not an init argument the hub would record.
    """

    def _full(self, dataset: Dataset | None, train: bool = False) -> DataLoader:
        size = len(dataset) if dataset is not None else None  # type: ignore[arg-type]
        return self._loader(dataset, shuffle=False, train=train, batch_size=size)

    def train_dataloader(self) -> DataLoader:
        return self._full(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._full(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._full(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._full(self.test_set)
