"""Activations (tokens × channels) for sparse autoencoders: synthetic sparse concepts, or real cached activations.

Sources of :class:`ActivationsDataModule`:

* ``"synthetic"`` (default, the embedded data): the RA-SAE card's sparse-concept data, made in code.
* ``"npy"``: ``data_dir/train.npy`` and ``data_dir/test.npy``, float arrays ``(n, dim)``, memory-mapped.
* ``"cache"``: a folder written by :func:`datamodules.activation_cache.build_activation_cache` (float16 shards
  ``acts_00000.npy``... plus ``meta.json``), memory-mapped and read lazily, one batch per indexing call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from zoo.datamodules.base import BatchedDataModule
from zoo.datamodules.checks import check_finite

__all__ = ["ActivationsDataModule", "ActivationArray", "make_sparse_concepts"]


def make_sparse_concepts(
    n: int,
    dim: int = 32,
    num_atoms: int = 256,
    active: int = 3,
    noise: float = 0.05,
    signed: bool = False,
    seed: int = 0,
    return_codes: bool = False,
) -> tuple[Tensor, ...]:
    """Synthetic activations built from sparse, non-negative combinations of ground-truth concepts.

    Ground-truth atoms D* ``(num_atoms, dim)`` are ``|N(0, I)|`` rows (Gaussian rows when ``signed``),
    unit-normalised; non-negative atoms give cone-shaped data like post-GELU vision activations. Each sample is
    ``active`` distinct atoms with weights ``Exp(1) + 0.5``, plus ``N(0, noise²)`` noise (RA-SAE card, §5).

    Returns:
        ``(x, atoms)``: ``(n, dim)`` activations and the ``(num_atoms, dim)`` ground-truth dictionary; with
        ``return_codes`` also the ``(n, num_atoms)`` true codes (which concepts each sample holds, with what weight:
        the identifiability benchmark's ground truth). The draws are the same either way.

    Example:
        >>> x, atoms = make_sparse_concepts(100, dim=8, num_atoms=16, seed=0)
        >>> x.shape, atoms.shape, bool((atoms >= 0).all())
        (torch.Size([100, 8]), torch.Size([16, 8]), True)
    """
    if not 1 <= active <= num_atoms:
        raise ValueError(f"Expected 1 <= active <= num_atoms ({num_atoms}), got active={active}.")
    g = torch.Generator().manual_seed(seed)
    atoms = torch.randn(num_atoms, dim, generator=g)
    if not signed:
        atoms = atoms.abs()
    atoms = atoms / atoms.norm(dim=1, keepdim=True)
    # `active` distinct atoms per row, drawn in one batched call.
    index = torch.rand(n, num_atoms, generator=g).argsort(dim=1)[:, :active]
    weights = torch.empty(n, active).exponential_(1.0, generator=g) + 0.5
    codes = torch.zeros(n, num_atoms).scatter_(1, index, weights)
    x = codes @ atoms + noise * torch.randn(n, dim, generator=g)
    return (x, atoms, codes) if return_codes else (x, atoms)


class ActivationArray(Dataset):
    """Rows of one or more ``(n_i, dim)`` arrays (in-memory or memory-mapped), served one batch per call.

    Args:
        arrays: the arrays, concatenated along rows in order (e.g. the shards of a cache).
        rows: which global rows belong to this split (default: all).
        offset: a ``(dim,)`` vector subtracted from every row (centring).

    Example:
        >>> ds = ActivationArray([np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((2, 2), np.float32)])
        >>> len(ds), ds.__getitems__([4, 0]).tolist()
        (5, [[1.0, 1.0], [0.0, 1.0]])
    """

    def __init__(
        self, arrays: Sequence[np.ndarray | Tensor], rows: np.ndarray | None = None, offset: Tensor | None = None
    ) -> None:
        self.arrays = [a.numpy() if isinstance(a, Tensor) else a for a in arrays]
        dims = {a.shape[1] for a in self.arrays}
        if len(dims) != 1 or any(a.ndim != 2 for a in self.arrays):
            raise ValueError(f"Expected 2-D arrays of one width, got shapes {[a.shape for a in self.arrays]}.")
        self.dim = dims.pop()
        self.starts = np.cumsum([0] + [a.shape[0] for a in self.arrays])
        self.rows = np.arange(self.starts[-1]) if rows is None else np.asarray(rows)
        self.offset = offset

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: Sequence[int]) -> Tensor:
        rows = self.rows[np.asarray(indices)]
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        shard = np.searchsorted(self.starts, rows, side="right") - 1
        for s in np.unique(shard):  # one fancy-index per shard touched, not one call per row
            where = np.nonzero(shard == s)[0]
            local = rows[where] - self.starts[s]
            order = np.argsort(local)  # sorted reads are kinder to memory maps
            out[where[order]] = self.arrays[s][local[order]]
        batch = torch.from_numpy(out)
        return batch - self.offset if self.offset is not None else batch

    def __getitem__(self, index: int) -> Tensor:
        return self.__getitems__([index])[0]

    def sample(self, n: int, seed: int = 0) -> Tensor:
        """``n`` rows drawn without replacement with a seeded generator (all rows if ``n >= len``)."""
        rng = np.random.default_rng(seed)
        idx = np.arange(len(self)) if n >= len(self) else np.sort(rng.choice(len(self), n, replace=False))
        return self.__getitems__(idx)

    def mean(self, chunk: int = 65536) -> Tensor:
        """Exact column mean, read in chunks (a cache may not fit in memory)."""
        total = torch.zeros(self.dim, dtype=torch.float64)
        for start in range(0, len(self), chunk):
            total += self.__getitems__(np.arange(start, min(start + chunk, len(self)))).double().sum(0)
        return (total / max(len(self), 1)).float()


class ActivationsDataModule(BatchedDataModule):
    """Activations for SAEs: the RA-SAE card's synthetic concepts by default, or an ``.npy`` / cache folder.

    Splits are made with a seeded generator: test and validation fractions of the pool (for ``"npy"``, the test
    split is ``test.npy`` and validation comes out of ``train.npy``). ``subset`` keeps a seeded random fraction of
    the training split ("similar datasets" for stability across runs).

    Args:
        source: ``"synthetic"``, ``"npy"`` or ``"cache"`` (see the module docstring).
        data_dir: folder of ``train.npy``/``test.npy`` or of a cache; required unless synthetic.
        dim: activation width; for real data it must match the files (checked in ``setup``).
        num_true_atoms: synthetic ground-truth concepts k* (48 identifiable, 256 not).
        active: synthetic concepts per sample.
        n_samples: synthetic pool size.
        noise: synthetic noise standard deviation.
        signed_atoms: synthetic atoms Gaussian instead of non-negative.
        center: subtract the training mean (computed on the training split).
        subset: fraction of the training split kept, in (0, 1].
        subset_seed: seed of that subset (and of ``candidate_points``' k-means when not given).
        val_fraction: validation fraction.
        test_fraction: test fraction (synthetic and cache).
        batch_size: rows per batch.
        num_workers: DataLoader workers.
        seed: seed of the synthetic data and of the splits.

    Example:
        >>> dm = ActivationsDataModule(n_samples=1000, batch_size=64)
        >>> dm.setup("fit")
        >>> next(iter(dm.train_dataloader())).shape
        torch.Size([64, 32])
    """

    def __init__(
        self,
        source: Literal["synthetic", "npy", "cache"] = "synthetic",
        data_dir: str | None = None,
        dim: int = 32,
        num_true_atoms: int = 256,
        active: int = 3,
        n_samples: int = 20000,
        noise: float = 0.05,
        signed_atoms: bool = False,
        center: bool = False,
        subset: float = 1.0,
        subset_seed: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in ("synthetic", "npy", "cache"):
            raise ValueError(f"Expected source to be 'synthetic', 'npy' or 'cache', got {source!r}.")
        if source != "synthetic" and not data_dir:
            raise ValueError(f"ActivationsDataModule(source={source!r}) needs data_dir, the folder of the activations.")
        if not 0 < subset <= 1:
            raise ValueError(f"Expected 0 < subset <= 1, got {subset}.")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(f"Expected val_fraction + test_fraction < 1, got {val_fraction} + {test_fraction}.")
        self.save_hyperparameters()
        self.true_atoms: Tensor | None = None
        self.offset: Tensor | None = None
        self._files: list[Path] = []  # the user files behind the pools, in order (none for synthetic data)
        self.train_set = self.val_set = self.test_set = None

    # ----------------------------------------------------------------------------------------------- loading
    def _pools(self) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """(arrays of the main pool, arrays of a given test pool or None)."""
        hp = self.hparams
        if hp.source == "synthetic":
            x, self.true_atoms = make_sparse_concepts(
                hp.n_samples, hp.dim, hp.num_true_atoms, hp.active, hp.noise, hp.signed_atoms, hp.seed
            )
            return [x.numpy()], None
        root = Path(hp.data_dir).expanduser()
        if hp.source == "npy":
            missing = [root / f for f in ("train.npy", "test.npy") if not (root / f).is_file()]
            if missing:
                raise FileNotFoundError(
                    f'No activation cache at {missing[0]}. ActivationsDataModule(source="npy") expects data_dir to '
                    f"hold train.npy and test.npy (float32, shape (n, {hp.dim})). Save them with numpy.save, or leave "
                    "source at its default for synthetic data."
                )
            self._files = [root / "train.npy", root / "test.npy"]
            return [np.load(self._files[0], mmap_mode="r")], [np.load(self._files[1], mmap_mode="r")]
        from zoo.datamodules.activation_cache import read_cache_meta

        meta = read_cache_meta(root)
        self._files = [root / shard for shard in meta["shards"]]
        return [np.load(file, mmap_mode="r") for file in self._files], None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        pool, test_pool = self._pools()
        if hp.source != "synthetic":
            for file, array in zip(self._files, pool + (test_pool or []), strict=True):
                if array.ndim != 2 or len(array) == 0:
                    raise ValueError(
                        f"{file} holds an array of shape {tuple(array.shape)}: expected float activations of shape "
                        f"(n, {hp.dim}) with n >= 1"
                    )
        width = pool[0].shape[1]
        if width != hp.dim:
            raise ValueError(
                f"The activations in {hp.data_dir} have width {width}, but data.dim is {hp.dim}. "
                f"Set data.dim and model.dim to {width}."
            )
        # Once, before any fitting: a NaN row would otherwise surface in k-means or as a NaN loss much later.
        if hp.source != "synthetic":
            for file, array in zip(self._files, pool + (test_pool or []), strict=True):
                check_finite(array, file)
        full = ActivationArray(pool)
        rng = np.random.default_rng(hp.seed)
        perm = rng.permutation(len(full))
        n_val = int(round(hp.val_fraction * len(full)))
        n_test = 0 if test_pool is not None else int(round(hp.test_fraction * len(full)))
        test_rows, val_rows, train_rows = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
        if hp.subset < 1:
            keep = np.random.default_rng(hp.subset_seed).permutation(len(train_rows))[
                : int(hp.subset * len(train_rows))
            ]
            train_rows = train_rows[np.sort(keep)]
        self.train_set = ActivationArray(pool, np.sort(train_rows))
        if hp.center:
            self.offset = self.train_set.mean()
        self.train_set.offset = self.offset
        self.val_set = ActivationArray(pool, np.sort(val_rows), self.offset)
        self.test_set = (
            ActivationArray(test_pool, offset=self.offset)
            if test_pool is not None
            else ActivationArray(pool, np.sort(test_rows), self.offset)
        )

    # ----------------------------------------------------------------------------------------------- SAE hooks
    @property
    def dim(self) -> int:
        return self.hparams.dim

    def candidate_points(self, num_candidates: int, seed: int | None = None, max_points: int = 200_000) -> Tensor:
        """k-means centroids of the (centred, if ``center``) training split: the candidate points C of RA-SAE."""
        from zoo.nn.kmeans import kmeans_centroids

        self.setup("fit")
        seed = self.hparams.subset_seed if seed is None else seed
        return kmeans_centroids(self.train_set.sample(max_points, seed=seed), num_candidates, seed=seed)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "offset": None if self.offset is None else self.offset.tolist()}

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        if hp.source == "synthetic":
            return (
                f"synthetic sparse concepts (card §5): n={hp.n_samples}, dim={hp.dim}, k*={hp.num_true_atoms}, "
                f"{hp.active} active, noise {hp.noise}, {'centred' if hp.center else 'raw'}, seed {hp.seed}"
            )
        return f"{hp.source} activations from {hp.data_dir} ({'centred' if hp.center else 'raw'})"
