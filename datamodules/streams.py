"""Labelled anomaly-detection streams, served in order: the SEAD card's drifting stream, or ODDS/ADBench/CSV files.

Sources of :class:`StreamDataModule`:

* ``"synthetic"`` (default, the embedded data): :func:`make_drifting_stream`, the SEAD card's §6 stream.
* ``"mat"``: an ODDS ``.mat`` file with ``X`` ``(n, d)`` and ``y`` ``(n, 1)`` (1 = outlier). MATLAB v7.3 files
  (``http.mat``, ``smtp.mat``) are HDF5 and need ``h5py``.
* ``"npz"``: an ADBench-style ``.npz`` with arrays ``X`` ``(n, d)`` and ``y`` ``(n,)``.
* ``"csv"``: one row per point, the label in ``label_column`` (a USP data-stream export); header auto-detected.

Labels are for evaluation only: a streaming detector must never read ``batch["y"]``.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from zoo.datamodules.base import BatchedDataModule
from zoo.datamodules.checks import check_finite

__all__ = ["BENCHMARK_KINDS", "StreamDataModule", "StreamDataset", "make_benchmark_stream", "make_drifting_stream"]

_SOURCES = ("synthetic", "mat", "npz", "csv")
_FORMATS = {
    "mat": "an ODDS .mat file with arrays X (n, d) and y (n, 1), 1 = anomaly (scipy.io.savemat, or the ODDS site)",
    "npz": "an ADBench-style .npz file with arrays X (n, d) and y (n,) (numpy.savez(path, X=X, y=y))",
    "csv": "a .csv file, one row per point, features plus one label column (label_column=, anomaly_label=)",
}


def make_drifting_stream(
    n: int = 6000, dim: int = 4, anomaly_rate: float = 0.02, drift_at: int | None = None, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """The SEAD card's §6 drifting stream: Gaussian inliers, rare shifted anomalies, and one abrupt drift.

    ``x_t ~ N(0, I_dim)`` and ``y_t ~ Bernoulli(anomaly_rate)``.

    - Regime 1 (``t < drift_at``): an anomaly adds ``±U(4, 6)`` to dims 0 and 1 (sign and magnitude drawn
      independently per dim).
    - Regime 2 (``t >= drift_at``): dims 0 and 1 of *every* point are scaled by 3 (detectors watching those dims
      start raising false alarms), and an anomaly adds ``±U(4, 6)`` to dims 2 and 3 instead.

    Args:
        n: stream length N.
        dim: width d, at least 4 (dims past 3 are plain noise).
        anomaly_rate: probability that a point is an anomaly, in [0, 1].
        drift_at: first index of regime 2, in [0, n]; ``None`` means ``n // 2``.
        seed: seed of the torch generator.

    Returns:
        ``(x, y)``: ``(n, dim)`` float32 points and ``(n,)`` long labels (1 = anomaly), in stream order.

    Example:
        >>> x, y = make_drifting_stream(n=1000, seed=0)
        >>> x.shape, y.shape, y.dtype, int(y.sum()) > 0
        (torch.Size([1000, 4]), torch.Size([1000]), torch.int64, True)
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"Expected argument `n` to be a positive int but got {n!r}.")
    if not isinstance(dim, int) or dim < 4:
        raise ValueError(f"Expected argument `dim` to be an int >= 4 (the drift uses dims 0-3) but got {dim!r}.")
    if not 0 <= anomaly_rate <= 1:
        raise ValueError(f"Expected argument `anomaly_rate` to be in [0, 1] but got {anomaly_rate!r}.")
    drift_at = n // 2 if drift_at is None else drift_at
    if not 0 <= drift_at <= n:
        raise ValueError(f"Expected argument `drift_at` to be in [0, n={n}] but got {drift_at!r}.")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = (torch.rand(n, generator=g) < anomaly_rate).long()
    # ±U(4, 6) per point and per dim, drawn for every row at once; only anomalies' rows are used.
    sign = torch.where(torch.rand(n, 2, generator=g) < 0.5, -1.0, 1.0)
    shift = sign * (4.0 + 2.0 * torch.rand(n, 2, generator=g)) * y[:, None]
    late = torch.arange(n) >= drift_at
    x[late, :2] *= 3.0  # regime 2: the drift every point sees
    x[~late, :2] += shift[~late]
    x[late, 2:4] += shift[late]
    return x, y


BENCHMARK_KINDS = ("drift", "clusters", "marginal", "subspace", "gradual", "wide")


def make_benchmark_stream(kind: str, n: int = 4000, seed: int = 0) -> tuple[Tensor, Tensor]:
    """One stream of the benchmark where no single detector wins (``zoo reproduce sead``), 2 % anomalies.

    - ``"drift"``: :func:`make_drifting_stream` (dims 4, an abrupt drift half way).
    - ``"clusters"``: inliers from 4 well-separated Gaussian clusters in 6 dims; an anomaly sits between two
      clusters, inside every feature's range (a per-feature rule cannot see it, a distance can).
    - ``"marginal"``: standard normal inliers in 10 dims; an anomaly has one feature at ±(4.5 to 5.5).
    - ``"subspace"``: 12 dims in 6 strongly correlated pairs; an anomaly breaks one pair (its second feature
      3 away from the first), within both marginals.
    - ``"gradual"``: 4 dims whose mean drifts steadily (12 units over the stream); an anomaly is ±4.5 in one feature.
    - ``"wide"``: ``"marginal"`` in 40 dims (one extreme feature among many: distances dilute it).

    Example:
        >>> x, y = make_benchmark_stream("clusters", n=500, seed=0)
        >>> x.shape, y.dtype
        (torch.Size([500, 6]), torch.int64)
    """
    if kind not in BENCHMARK_KINDS:
        raise ValueError(f"Expected argument `kind` to be one of {', '.join(map(repr, BENCHMARK_KINDS))}, but got {kind!r}.")
    if kind == "drift":
        return make_drifting_stream(n=n, seed=seed)
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.02).long()
    rows = torch.nonzero(y).flatten()
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    if kind == "clusters":
        centres = 6.0 * torch.randn(4, 6, generator=g)
        x = centres[torch.randint(4, (n,), generator=g)] + torch.randn(n, 6, generator=g)
        a = torch.randint(4, (n,), generator=g)
        b = (a + torch.randint(1, 4, (n,), generator=g)) % 4
        between = 0.5 * (centres[a] + centres[b]) + 0.5 * torch.randn(n, 6, generator=g)
        x[rows] = between[rows]
        return x, y
    if kind in ("marginal", "wide"):
        dim = 10 if kind == "marginal" else 40
        x = torch.randn(n, dim, generator=g)
        j = torch.randint(dim, (n,), generator=g)
        x[rows, j[rows]] = (sign * (4.5 + torch.rand(n, generator=g)))[rows]
        return x, y
    if kind == "subspace":
        z = torch.randn(n, 6, generator=g)
        x = torch.cat([z, z + 0.3 * torch.randn(n, 6, generator=g)], 1)
        j = torch.randint(6, (n,), generator=g)
        x[rows, j[rows] + 6] = x[rows, j[rows]] + 3.0 * sign[rows]
        return x, y
    trend = torch.linspace(0.0, 12.0, n)[:, None] * torch.tensor([1.0, -0.5, 0.0, 0.5])  # "gradual"
    x = torch.randn(n, 4, generator=g) + trend
    j = torch.randint(4, (n,), generator=g)
    x[rows, j[rows]] += 4.5 * sign[rows]
    return x, y


class StreamDataset(Dataset):
    """An ordered stream of labelled points, served one batch (a dict) per ``__getitems__`` call.

    Args:
        x: ``(n, dim)`` points, in stream order.
        y: ``(n,)`` labels, 1 = anomaly.
        warmup: the first ``warmup`` positions are flagged ``evaluate=False`` (fed to detectors, not scored).

    Example:
        >>> ds = StreamDataset(torch.zeros(5, 2), torch.tensor([0, 0, 1, 0, 0]), warmup=2)
        >>> b = ds.__getitems__([1, 2, 3])
        >>> b["t"].tolist(), b["y"].tolist(), b["evaluate"].tolist(), tuple(b["x"].shape)
        ([1, 2, 3], [0, 1, 0], [False, True, True], (3, 2))
    """

    def __init__(self, x: Tensor, y: Tensor, warmup: int = 0) -> None:
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(
                f"Expected x of shape (n, dim) and y of shape (n,), got {tuple(x.shape)} and {tuple(y.shape)}."
            )
        self.x, self.y, self.warmup = x, y, warmup

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Tensor]:
        t = torch.as_tensor(indices, dtype=torch.long)
        return {"x": self.x[t], "y": self.y[t], "t": t, "evaluate": t >= self.warmup}

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


def _read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    try:
        data = loadmat(str(path))
    except NotImplementedError as err:  # MATLAB v7.3 files are HDF5, which scipy does not read
        try:
            import h5py
        except ImportError:
            raise ImportError(
                f"{path} is a MATLAB v7.3 (HDF5) file, which scipy cannot read. Install h5py (pip install h5py) "
                "to read it, or convert it to .npz with arrays X and y and use source='npz'."
            ) from err
        with h5py.File(path, "r") as f:
            _require_keys(path, list(f.keys()), ("X", "y"))
            # HDF5 stores MATLAB arrays column-major: transpose back to (n, d).
            return np.asarray(f["X"][()]).T, np.asarray(f["y"][()]).T
    _require_keys(path, [k for k in data if not k.startswith("__")], ("X", "y"))
    return np.asarray(data["X"]), np.asarray(data["y"])


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:  # never unpickle a user file
        _require_keys(path, list(data.keys()), ("X", "y"))
        return data["X"], data["y"]


def _read_csv(path: Path, label_column: str | int) -> tuple[np.ndarray, np.ndarray]:
    with open(path, newline="") as f:
        sample = f.read(64 * 1024)
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t ")
        delimiter, has_header = dialect.delimiter, csv.Sniffer().has_header(sample)
    except csv.Error:  # one column, or too regular to sniff: plain commas, header if the first cell is no number
        delimiter = ","
        first = sample.split("\n", 1)[0].split(",")[0].strip()
        try:
            float(first)
            has_header = False
        except ValueError:
            has_header = True
    header = [h.strip() for h in next(csv.reader([sample.split("\n", 1)[0]], delimiter=delimiter))]
    table = np.genfromtxt(path, delimiter=delimiter, skip_header=int(has_header), dtype=np.float64, ndmin=2)
    # Empty or non-numeric cells read as NaN too; name the file's line (1-based, header counted) and column.
    check_finite(table, path, first_row=1 + int(has_header), unit="line")
    if isinstance(label_column, str):
        if not has_header or label_column not in header:
            found = f"its header is {header}" if has_header else "it has no header row"
            raise ValueError(
                f"StreamDataModule(label_column={label_column!r}): no such column in {path} ({found}). "
                "Pass the column's name or its integer index (-1 = last)."
            )
        col = header.index(label_column)
    else:
        col = label_column % table.shape[1] if -table.shape[1] <= label_column < table.shape[1] else None
        if col is None:
            raise ValueError(f"label_column={label_column} is out of range: {path} has {table.shape[1]} columns.")
    return np.delete(table, col, axis=1), table[:, col]


def _require_keys(path: Path, keys: list[str], needed: tuple[str, ...]) -> None:
    missing = [k for k in needed if k not in keys]
    if missing:
        raise ValueError(
            f"{path} has no array {missing[0]!r} (it holds {sorted(keys)}). Save the points as X "
            "(n, d) and the labels as y (n,)."
        )


class StreamDataModule(BatchedDataModule):
    """A labelled stream for streaming anomaly detection, served in order in chunks (SEAD card §4, §6, §7).

    The stream is **never shuffled**: every loader (train, val, test and predict) serves the whole stream in
    order, ``chunk_size`` contiguous points per batch, as a dict::

        {"x": (B, dim) float32, "y": (B,) long 0/1, "t": (B,) long positions, "evaluate": (B,) bool}

    ``evaluate`` is ``t >= warmup``: the first ``warmup`` points warm the detectors up and are left out of the
    APS. ``order="permute"`` streams the file's rows in one seeded permutation instead of file order; most ODDS
    sets have no true time order, so record which order was used (``describe()`` says it). ``rows`` maps each
    position back to its row in the file.

    Args:
        source: ``"synthetic"``, ``"mat"``, ``"npz"`` or ``"csv"`` (see the module docstring).
        path: the file, required unless synthetic.
        label_column: csv only: the label column's name (needs a header) or index (-1 = last).
        anomaly_label: the label value that marks an anomaly (every other value is normal); ``None``: labels are
            already 0/1. Applies to every real source.
        order: ``"file"`` (as stored) or ``"permute"`` (one permutation seeded by ``seed``).
        n: synthetic stream length.
        dim: synthetic width (>= 4); for real data the width comes from the file (see the ``dim`` property).
        anomaly_rate: synthetic anomaly probability.
        drift_at: synthetic drift position; ``None`` means ``n // 2``.
        warmup: points at the start not evaluated (the paper uses 100).
        chunk_size: points per batch (the paper's "chunks of 50 contiguous points").
        fit_on: ``"stream"``: every loader serves the whole stream; ``"warmup"``: ``fit`` serves the first
            ``warmup`` points and validation/test/predict continue from there (a hub entry holding the warm-up state
            then continues the stream, positions and ``evaluate`` flags unchanged).
        num_workers: DataLoader workers.
        seed: seed of the synthetic stream and of the permutation.

    Attributes:
        rows: ``(num_points,)`` file row of each stream position (``arange`` in file order), after ``setup``.

    Raises:
        ValueError: an argument is out of range (in ``__init__``); the file holds NaN/inf features, labels that are
            not 0/1 without ``anomaly_label``, or misses ``X``/``y`` (in ``setup``).
        FileNotFoundError: ``path`` does not exist (in ``setup``).
        ImportError: a MATLAB v7.3 file without h5py installed.

    Example:
        >>> dm = StreamDataModule(n=200, warmup=100, chunk_size=50)
        >>> dm.setup("test")
        >>> batches = list(dm.test_dataloader())
        >>> len(batches), batches[2]["t"][:3].tolist(), bool(batches[1]["evaluate"].any()), dm.dim
        (4, [100, 101, 102], False, 4)
    """

    def __init__(
        self,
        source: Literal["synthetic", "mat", "npz", "csv"] = "synthetic",
        path: str | None = None,
        label_column: str | int = -1,
        anomaly_label: float | None = None,
        order: Literal["file", "permute"] = "file",
        n: int = 6000,
        dim: int = 4,
        anomaly_rate: float = 0.02,
        drift_at: int | None = None,
        warmup: int = 100,
        chunk_size: int = 50,
        fit_on: Literal["stream", "warmup"] = "stream",
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if fit_on not in ("stream", "warmup"):
            raise ValueError(f"Expected argument `fit_on` to be 'stream' or 'warmup' but got {fit_on!r}.")
        if source not in _SOURCES:
            raise ValueError(f"Expected argument `source` to be one of {_SOURCES} but got {source!r}.")
        if source != "synthetic" and not path:
            raise ValueError(f"StreamDataModule(source={source!r}) needs path: {_FORMATS[source]}.")
        if order not in ("file", "permute"):
            raise ValueError(f"Expected argument `order` to be 'file' or 'permute' but got {order!r}.")
        if source == "synthetic":
            make_drifting_stream(n=1, dim=dim, anomaly_rate=anomaly_rate, drift_at=0)  # checks dim and anomaly_rate
            if drift_at is not None and not 0 <= drift_at <= n:
                raise ValueError(f"Expected argument `drift_at` to be in [0, n={n}] but got {drift_at!r}.")
        for name, value, low in (
            ("n", n, 1),
            ("warmup", warmup, 0),
            ("chunk_size", chunk_size, 1),
            ("num_workers", num_workers, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"Expected argument `{name}` to be an int >= {low} but got {value!r}.")
        self.save_hyperparameters()
        self.rows: np.ndarray | None = None
        self._stream: StreamDataset | None = None
        self.train_set = self.val_set = self.test_set = None

    # ----------------------------------------------------------------------------------------------- loading
    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        """(X, y) of the real source, checked: finite features, 0/1 labels."""
        hp = self.hparams
        path = Path(hp.path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"No stream file at {path}. StreamDataModule(source={hp.source!r}) expects path to be "
                f"{_FORMATS[hp.source]}. Put the file there, or leave source at its default for the synthetic "
                "drifting stream."
            )
        if hp.source == "mat":
            X, y = _read_mat(path)
        elif hp.source == "npz":
            X, y = _read_npz(path)
        else:
            X, y = _read_csv(path, hp.label_column)
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y).reshape(-1)
        if X.ndim != 2 or X.shape[0] != y.shape[0]:
            raise ValueError(f"Expected X of shape (n, d) and y of n labels in {path}, got {X.shape} and {y.shape}.")
        if hp.source != "csv":  # a csv was checked as a whole table while read (its lines and file columns)
            check_finite(X, f"{path} (array X)")  # rows in file order, 0-based, before any permutation
            check_finite(y, f"{path} (array y)")
        if hp.anomaly_label is not None:
            return X, (y.astype(np.float64) == float(hp.anomaly_label)).astype(np.int64)
        values = np.unique(y)
        if not np.isin(values, (0, 1)).all():
            raise ValueError(
                f"The labels in {path} take values {values[:10].tolist()}, not 0/1. Pass anomaly_label= with the "
                "value that marks an anomaly."
            )
        return X, y.astype(np.int64)

    def _load(self) -> StreamDataset:
        if self._stream is None:
            hp = self.hparams
            if hp.source == "synthetic":
                x, y = make_drifting_stream(hp.n, hp.dim, hp.anomaly_rate, hp.drift_at, hp.seed)
            else:
                X, Y = self._read()
                x, y = torch.from_numpy(X).float(), torch.from_numpy(Y).long()
            rows = np.arange(x.shape[0])
            if hp.order == "permute":
                rows = np.random.default_rng(hp.seed).permutation(x.shape[0])
                x, y = x[torch.from_numpy(rows)], y[torch.from_numpy(rows)]
            self.rows = rows
            self._stream = StreamDataset(x, y, warmup=hp.warmup)
        return self._stream

    def setup(self, stage: str | None = None) -> None:
        # One stream for every stage: "fit" is one ordered pass too (or only its warm-up, see `fit_on`).
        stream = self._load()
        self.train_set = self.val_set = self.test_set = stream
        if self.hparams.fit_on == "warmup":
            warm = min(self.hparams.warmup, len(stream))
            self.train_set = Subset(stream, range(warm))  # Subset forwards __getitems__: still one call per batch
            self.val_set = self.test_set = Subset(stream, range(warm, len(stream)))

    def _loader(self, dataset: Dataset | None, shuffle: bool, **kwargs: Any) -> DataLoader:
        # A stream is never shuffled, not even for "fit"; batches are chunks of `chunk_size` contiguous points.
        return super()._loader(dataset, shuffle=False, **{**kwargs, "batch_size": self.hparams.chunk_size})

    # ----------------------------------------------------------------------------------------------- hooks
    @property
    def num_points(self) -> int:
        """Stream length (reads the file on first use)."""
        return len(self._load())

    @property
    def dim(self) -> int:
        """Point width: ``dim`` for the synthetic stream, the file's width otherwise (reads it on first use)."""
        return self.hparams.dim if self.hparams.source == "synthetic" else self._load().x.shape[1]

    def describe(self) -> str:
        """One line for model cards.

        Example:
            >>> StreamDataModule(n=600).describe().split(";")[0]
            'synthetic drifting stream (SEAD card §6): n=600, dim=4, anomaly rate 0.02, drift at t=300, seed 0'
        """
        hp = self.hparams
        order = "file order" if hp.order == "file" else f"seeded permutation (seed {hp.seed})"
        tail = f"{order}; warm-up {hp.warmup} (not evaluated), chunks of {hp.chunk_size}"
        if hp.source == "synthetic":
            drift = hp.n // 2 if hp.drift_at is None else hp.drift_at
            return (
                f"synthetic drifting stream (SEAD card §6): n={hp.n}, dim={hp.dim}, anomaly rate "
                f"{hp.anomaly_rate}, drift at t={drift}, seed {hp.seed}; {tail}"
            )
        stream = self._load()
        rate = float(stream.y.float().mean())
        return f"{hp.source} stream {hp.path}: n={len(stream)}, dim={stream.x.shape[1]}, {rate:.2%} anomalies; {tail}"
