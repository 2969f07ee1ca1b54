"""``MultiViewDataModule``: V views of the same n samples, served as one full batch (a list of ``[n, d_v]`` tensors
and the labels), for anchor-based multi-view clustering (RCSC / SMVSC).

Sources: ``"synthetic"`` (the embedded default, the RCSC card's views: two Gaussian-cluster views, 10 % gross
corruption in view 1 and a pure-noise view), ``"unequal"`` (views of unequal quality, a good, a weak, a redundant one
and a 1,000-d pure-noise view: the task of ``zoo reproduce rcsc``), ``"digits"`` (sklearn's digits with three views: raw pixels, pooled image plus
row/column profiles, random Fourier features) and ``"mat"``: ``<data_dir>/<name>.mat`` in the common layout of
multi-view benchmarks, a cell array ``X`` of views (each ``n x d_v`` or ``d_v x n``, oriented by the label count) and
labels ``Y`` (or ``gt`` / ``truth``), read with ``scipy.io.loadmat`` (v5/v7) or ``h5py`` (v7.3). Features are
standardised per feature by the solver (SMVSC's ``mapstd``), not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.io
import scipy.sparse
import torch
from torch import Tensor
from torch.utils.data import Dataset

from zoo.arguments import check_choice, check_probability, check_range
from zoo.datamodules.base import FullBatchDataModule
from zoo.datamodules.checks import check_finite

__all__ = ["MultiViewDataModule", "MultiViews", "digits_views", "load_mat_views", "synthetic_views", "unequal_views"]


def synthetic_views(n_per: int = 300, n_clusters: int = 5, dims: tuple[int, ...] = (10, 15), noise_dim: int = 200,
                    corrupt: float = 0.1, seed: int = 0) -> tuple[list[Tensor], Tensor]:
    """The card's views ``[n, d_v]`` and labels ``[n]``: means N(0, 1.2^2 I), unit noise, a ``corrupt`` fraction of
    view 1 gets +4 N(0, I), and a ``noise_dim``-d pure-noise view (omitted when 0).

    Example:
        >>> views, y = synthetic_views(n_per=10, seed=0)
        >>> [v.shape[1] for v in views], y.shape
        ([10, 15, 200], torch.Size([50]))
    """
    g = torch.Generator().manual_seed(seed)
    n = n_per * n_clusters
    y = torch.arange(n_clusters).repeat_interleave(n_per)
    views = []
    for d in dims:
        mu = 1.2 * torch.randn(n_clusters, d, generator=g)
        views.append(mu[y] + torch.randn(n, d, generator=g))
    bad = torch.randperm(n, generator=g)[: int(corrupt * n)]
    views[0][bad] += 4 * torch.randn(len(bad), dims[0], generator=g)
    if noise_dim:
        views.append(torch.randn(n, noise_dim, generator=g))
    return views, y


def unequal_views(n_per: int = 300, n_clusters: int = 5, good: float = 0.8, weak: float = 0.5, dim: int = 10,
                  redundant_noise: float = 1.0, noise_dim: int = 1000, corrupt: float = 0.1,
                  seed: int = 0) -> tuple[list[Tensor], Tensor]:  # fmt: skip
    """Views of unequal quality (the embedded default of ``zoo reproduce rcsc``): ``[n, d_v]`` views and labels.

    1. a good view: cluster means N(0, good² I) in ``dim`` dimensions, unit noise, a ``corrupt`` fraction of the
       samples grossly corrupted (+4 N(0, I));
    2. a weak view: means N(0, weak² I), unit noise;
    3. a redundant view: the good view's cluster means rotated, with fresh noise of scale ``redundant_noise``;
    4. a ``noise_dim``-d pure-noise view (omitted when 0), the shape of a large, uninformative feature group (a
       bag of words, a sensor that failed).

    No single view separates the clusters well (k-means on the good one: ACC about 0.8), together they do, and the
    noise view outweighs them in a per-feature concatenation.

    Example:
        >>> views, y = unequal_views(n_per=10, noise_dim=50, seed=0)
        >>> [v.shape[1] for v in views], y.shape
        ([10, 10, 10, 50], torch.Size([50]))
    """
    g = torch.Generator().manual_seed(seed)
    n = n_per * n_clusters
    y = torch.arange(n_clusters).repeat_interleave(n_per)
    mu_good = good * torch.randn(n_clusters, dim, generator=g)
    good_view = mu_good[y] + torch.randn(n, dim, generator=g)
    weak_view = (weak * torch.randn(n_clusters, dim, generator=g))[y] + torch.randn(n, dim, generator=g)
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0]
    redundant_view = mu_good[y] @ rotation + redundant_noise * torch.randn(n, dim, generator=g)
    bad = torch.randperm(n, generator=g)[: int(corrupt * n)]
    good_view[bad] += 4 * torch.randn(len(bad), dim, generator=g)
    views = [good_view, weak_view, redundant_view]
    if noise_dim:
        views.append(torch.randn(n, noise_dim, generator=g))
    return views, y


def digits_views(seed: int = 0, n_fourier: int = 200) -> tuple[list[Tensor], Tensor]:
    """sklearn's digits (1,797 x 8x8, bundled with sklearn) as three views: 64 pixels; 2x2-pooled image (16) plus
    row and column sums (16); ``n_fourier`` random Fourier features of the pixels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    img = x.reshape(-1, 8, 8)
    pooled = img.reshape(-1, 4, 2, 4, 2).mean((2, 4)).reshape(-1, 16)
    prof = np.concatenate([img.sum(1), img.sum(2)], 1)
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1 / (8 * x.std()), (64, n_fourier))
    rff = np.cos(x @ w + rng.uniform(0, 2 * np.pi, n_fourier))
    views = [x, np.concatenate([pooled, prof], 1), rff]
    return [torch.as_tensor(v, dtype=torch.float32) for v in views], torch.as_tensor(y, dtype=torch.long)


def load_mat_views(path: str | Path) -> tuple[list[Tensor], Tensor]:
    """Read a ``.mat`` multi-view file: cell array ``X`` (1 x V or V x 1) and labels ``Y``/``gt``/``truth``.

    Each view is oriented to ``n x d_v`` by matching the label count; sparse views are densified (float32);
    labels are remapped to 0..K-1. Non-finite entries raise (``check_finite``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: expected a .mat file with a cell array X and labels Y")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes): expected a .mat file with a cell array X and labels Y")
    mat = _read_mat(path)
    key = next((k for k in ("Y", "gt", "truth", "y") if k in mat), None)
    if "X" not in mat or key is None:
        raise ValueError(f"{path}: expected variables X (cell array of views) and Y/gt/truth, found "
                         f"{sorted(k for k in mat if not k.startswith('__'))}")
    y = np.asarray(mat[key]).ravel()
    n = len(y)
    if n == 0:
        raise ValueError(f"{path}: the labels {key} are empty")
    cells = np.asarray(mat["X"], dtype=object).ravel()
    views = []
    for i, v in enumerate(cells):
        v = v.toarray() if scipy.sparse.issparse(v) else np.asarray(v, dtype=np.float64)
        if v.shape[0] != n and v.shape[1] == n:
            v = v.T
        if v.shape[0] != n:
            raise ValueError(f"{path}: view {i} has shape {v.shape}, neither side matches the {n} labels")
        check_finite(v, f"{path}:X{{{i}}}")
        views.append(torch.as_tensor(v, dtype=torch.float32))
    _, y = np.unique(y, return_inverse=True)
    return views, torch.as_tensor(y, dtype=torch.long)


def _read_mat(path: Path) -> dict:
    """A ``.mat`` file's variables: v5/v7 through ``scipy.io.loadmat``, v7.3 (HDF5) through ``h5py`` (a cell array is
    a dataset of object references; MATLAB stores every matrix transposed, which the orientation check undoes)."""
    import h5py

    if not h5py.is_hdf5(path):
        try:
            return scipy.io.loadmat(path)
        except Exception as err:  # scipy's MatReadError and friends: a file that is not a MATLAB file at all
            raise ValueError(f"{path} is not a readable .mat file ({type(err).__name__}: {err})") from None

    out: dict = {}
    with h5py.File(path, "r") as f:
        for key, item in f.items():
            if key.startswith("#"):
                continue
            data = item[()]
            if data.dtype == object:  # a cell array: references to the cells' datasets
                cells = np.empty(data.size, dtype=object)  # filled one by one: the views differ in shape
                for i, ref in enumerate(data.ravel()):
                    cells[i] = np.asarray(f[ref][()], dtype=np.float64)
                out[key] = cells
            else:
                out[key] = np.asarray(data)
    return out


class MultiViews(Dataset):
    """V views of n samples; ``__getitems__`` returns ``(list of [b, d_v] tensors, labels [b])``."""

    def __init__(self, views: Sequence[Tensor], labels: Tensor) -> None:
        ns = [len(v) for v in views] + [len(labels)]
        if len(set(ns)) != 1:
            raise ValueError(f"views have different numbers of samples: {ns[:-1]} (labels: {ns[-1]})")
        self.views, self.labels = list(views), labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices: Sequence[int]) -> tuple[list[Tensor], Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [v[idx] for v in self.views], self.labels[idx]


class MultiViewDataModule(FullBatchDataModule):
    """Multi-view clustering data as one full, ordered batch per epoch (the anchor graph has one column per sample,
    so every step must see all samples in the same order). Train, val and test are the same samples (clustering).

    Args:
        source: ``"synthetic"`` (the embedded default: the RCSC card's views, :func:`synthetic_views`),
            ``"unequal"`` (views of unequal quality, :func:`unequal_views`: the task of ``zoo reproduce rcsc``),
            ``"digits"`` (:func:`digits_views`) or ``"mat"``
            (``<data_dir>/<name>.mat``, :func:`load_mat_views`, v5/v7 or v7.3).
        n_clusters: clusters of the generated views (default 5); for ``"digits"`` and ``"mat"`` the labels decide,
            and a value given here must agree with them.
        noise_dim: the pure-noise view's dimension (default 1,000 for ``"unequal"``, 200 for ``"synthetic"``).

    Attributes:
        view_dims: each view's width, and ``n_clusters``: the number of label values, once set up (``RCSCModule``
            takes both from here under ``zoo fit``).

    Example:
        >>> dm = MultiViewDataModule(source="synthetic", n_per=20, noise_dim=30)
        >>> dm.setup()
        >>> views, y = next(iter(dm.train_dataloader()))
        >>> [tuple(v.shape) for v in views], y.shape, dm.view_dims, dm.n_clusters
        ([(100, 10), (100, 15), (100, 30)], torch.Size([100]), [10, 15, 30], 5)
    """

    def __init__(self, source: Literal["synthetic", "unequal", "digits", "mat"] = "synthetic", data_dir: str = "data",
                 name: str = "", n_per: int = 300, n_clusters: int | None = None, noise_dim: int | None = None,
                 corrupt: float = 0.1, seed: int = 0, num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        check_choice("source", source, ("unequal", "synthetic", "digits", "mat"))
        check_range("n_per", n_per, low=1, integer=True)
        check_range("n_clusters", n_clusters, low=2, integer=True, optional=True)
        check_range("noise_dim", noise_dim, low=0, integer=True, optional=True)
        check_probability("corrupt", corrupt)
        if source == "mat" and not name:
            raise ValueError("source='mat' needs name: the file <data_dir>/<name>.mat")
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        h = self.hparams
        k = h.n_clusters or 5
        if h.source == "unequal":
            views, y = unequal_views(h.n_per, k, noise_dim=1000 if h.noise_dim is None else h.noise_dim,
                                     corrupt=h.corrupt, seed=h.seed)  # fmt: skip
        elif h.source == "synthetic":
            views, y = synthetic_views(h.n_per, k, noise_dim=200 if h.noise_dim is None else h.noise_dim,
                                       corrupt=h.corrupt, seed=h.seed)  # fmt: skip
        elif h.source == "digits":
            views, y = digits_views(h.seed)
        else:
            views, y = load_mat_views(Path(h.data_dir) / f"{h.name}.mat")
        found = int(y.max()) + 1
        if h.n_clusters is not None and h.source in ("digits", "mat") and h.n_clusters != found:
            where = f"{h.data_dir}/{h.name}.mat" if h.source == "mat" else "digits"
            raise ValueError(f"n_clusters={h.n_clusters}, but the labels of {where} have {found} values: leave "
                             "data.n_clusters unset (the labels decide)")  # fmt: skip
        self.train_set = self.val_set = self.test_set = MultiViews(views, y)
        self.n_clusters = found
        self.view_dims = [int(v.shape[1]) for v in views]
