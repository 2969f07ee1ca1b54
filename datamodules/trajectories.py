"""User trajectories of (hours, latitude, longitude) points: the ProDiff card's synthetic street-grid city (§5), the
official HDF5 layout and FourSquare/WuXi-style CSV files (§6), checks, sliding windows, a min-max scaler, and the
DataModule that serves windows for endpoint-conditioned imputation.

A trajectory is three equally long 1-D float arrays ``hours``, ``latitudes``, ``longitudes`` in time order; a
collection of them is a ``dict`` from user id (``str``) to ``{"hours": ..., "latitudes": ..., "longitudes": ...}``.
Windows are channel-first ``(N, 3, k)`` with channels (t, lat, lon), as the official code builds them.

Precision: a float32 at longitude 139.76° has an ulp of 1.5e-5° (≈ 1.4 m), so raw windows stay float64 and only the
scaled windows (values near [0, 1]) are cast to float32.
"""

from __future__ import annotations

import csv
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches
from zoo.datamodules.street_grid import (
    CITY_CENTER,
    KM_LAT,
    km_to_latlon,
    latlon_to_km,
    street_grid_checkins,
    street_route,
)

__all__ = [
    "CITY_CENTER",
    "KM_LAT",
    "MinMaxScaler",
    "TrajectoryDataModule",
    "km_to_latlon",
    "latlon_to_km",
    "read_csv",
    "read_h5",
    "read_trajectories",
    "sliding_windows",
    "street_grid_checkins",
    "street_route",
    "validate_trajectory",
    "write_h5",
]

FIELDS = ("hours", "latitudes", "longitudes")
Users = dict[str, dict[str, np.ndarray]]


# ------------------------------------------------------------------------------------------------ checks and files
def validate_trajectory(
    hours: np.ndarray, latitudes: np.ndarray, longitudes: np.ndarray, user: str = "?", source: str | Path = "data"
) -> None:
    """Raise ``ValueError`` naming ``source``, the user and the first bad index if a trajectory is malformed.

    Checks: three 1-D arrays of one length, no NaN or inf, latitudes in [−90, 90], longitudes in [−180, 180], and
    hours non-decreasing (equal times are allowed).

    Example:
        >>> validate_trajectory(np.array([0.0, 1.0]), np.array([35.6, 35.7]), np.array([139.7, 139.8]), user="a")
        >>> validate_trajectory(np.array([0.0, 1.0]), np.array([35.6, 95.0]), np.array([139.7, 139.8]), user="a")
        Traceback (most recent call last):
            ...
        ValueError: data: user 'a': latitudes[1] = 95.0 is outside [-90, 90] ...
    """
    where = f"{source}: user {user!r}"
    arrays = {"hours": hours, "latitudes": latitudes, "longitudes": longitudes}
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    if any(len(s) != 1 for s in shapes.values()) or len({s[0] for s in shapes.values()}) != 1:
        raise ValueError(
            f"{where}: hours, latitudes and longitudes must be 1-D arrays of one length, got shapes "
            f"{shapes}. Every point needs a time and both coordinates."
        )
    for name, a in arrays.items():
        bad = np.flatnonzero(~np.isfinite(a))
        if len(bad):
            raise ValueError(
                f"{where}: {name}[{bad[0]}] = {a[bad[0]]} ({len(bad)} of {len(a)} points are NaN or inf). "
                "Drop or impute those points before windowing."
            )
    for name, bound in (("latitudes", 90.0), ("longitudes", 180.0)):
        bad = np.flatnonzero(np.abs(arrays[name]) > bound)
        if len(bad):
            raise ValueError(
                f"{where}: {name}[{bad[0]}] = {arrays[name][bad[0]]} is outside [{-bound:g}, {bound:g}] "
                "(degrees). Check that latitude and longitude are not swapped or projected."
            )
    back = np.flatnonzero(np.diff(hours) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise ValueError(
            f"{where}: hours[{i}] = {hours[i]} comes before hours[{i - 1}] = {hours[i - 1]}; points must "
            "be in time order (sort each user's points by time)."
        )


def write_h5(path: str | Path, users: Mapping[str, Mapping[str, np.ndarray]]) -> Path:
    """Write users in the official layout: one group per user id holding float64 ``hours``, ``latitudes``,
    ``longitudes`` (other keys, e.g. ``with_routes`` extras, are not written). Returns the path.

    Example:
        >>> import tempfile, os
        >>> f = write_h5(os.path.join(tempfile.mkdtemp(), "train.h5"), street_grid_checkins(2))
        >>> sorted(read_h5(f))
        ['u00000', 'u00001']
    """
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for uid, traj in users.items():
            group = f.create_group(str(uid))
            for name in FIELDS:
                group.create_dataset(name, data=np.asarray(traj[name], dtype=np.float64))
    return path


def read_h5(path: str | Path) -> Users:
    """Read the official layout ``/<user_id>/{hours, latitudes, longitudes}`` (float64) and check every user.

    Example: see :func:`write_h5`.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No trajectory file at {path}. Expected an HDF5 file with one group per user id, each "
            "holding 1-D float arrays hours, latitudes and longitudes (see write_h5)."
        )
    users: Users = {}
    with h5py.File(path, "r") as f:
        for uid, group in f.items():
            if not isinstance(group, h5py.Group) or any(name not in group for name in FIELDS):
                have = sorted(group) if isinstance(group, h5py.Group) else type(group).__name__
                raise ValueError(f"{path}: user {uid!r} must be a group with datasets {list(FIELDS)}, got {have}")
            users[uid] = {name: np.asarray(group[name][()], dtype=np.float64).reshape(-1) for name in FIELDS}
            validate_trajectory(**users[uid], user=uid, source=path)
    return users


def _timestamp(value: str) -> datetime:
    """One timestamp: ISO 8601 (with or without an offset) or FourSquare's ``Tue Apr 03 18:00:09 +0000 2012``."""
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        t = datetime.strptime(value, "%a %b %d %H:%M:%S %z %Y")
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t  # naive times are taken as UTC


def _hours(values: list[str], path: Path, column: str, lines: list[int]) -> np.ndarray:
    """A time column as hours: numbers are hours already; timestamps become hours since the file's first record."""
    try:
        return np.asarray(values, dtype=np.float64)
    except ValueError:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy only warns (deprecated) on offsets: parse those in Python
            stamps = np.asarray(values, dtype="datetime64[us]")
    except (ValueError, DeprecationWarning, UserWarning):
        parsed = []
        for row, v in enumerate(values):
            try:
                parsed.append(_timestamp(v.strip()))
            except ValueError:
                raise ValueError(
                    f"{path}: line {lines[row]}: {column} {v!r} is neither a number of hours nor a timestamp (ISO 8601 "
                    "such as 2012-04-03 18:00:09, or FourSquare's 'Tue Apr 03 18:00:09 +0000 2012')"
                ) from None
        stamps = np.asarray(parsed, dtype="datetime64[us]")
    return (stamps - stamps.min()).astype(np.float64) / 3.6e9


def read_csv(path: str | Path, user: str = "user", time: str = "time", lat: str = "lat", lon: str = "lon") -> Users:
    """Read check-ins from a CSV (or ``.tsv``) file with a header naming the user, time, latitude, longitude columns.

    Rows may come in any order: they are grouped by user and sorted by time (stably). A numeric time column is taken
    as hours as it is. Timestamp strings (ISO 8601, or FourSquare's ``Tue Apr 03 18:00:09 +0000 2012``; offsets are
    converted to UTC, naive times taken as UTC) become **hours since the first record of the whole file**, so users
    keep their relative timing. Other columns are ignored.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "tky.csv")
        >>> rows = "user,time,lat,lon\\n7,2012-04-03 20:00,35.7,139.7\\n7,2012-04-03 18:30,35.6,139.8\\n"
        >>> _ = open(f, "w").write(rows)
        >>> read_csv(f)["7"]["hours"].tolist()
        [0.0, 1.5]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No check-in file at {path}. Expected a CSV with a header and columns {user!r}, "
            f"{time!r}, {lat!r}, {lon!r} (one row per check-in)."
        )
    with path.open(newline="") as f:
        rows = list(csv.reader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    if not rows:
        raise ValueError(f"{path} is empty; expected a header with columns {user!r}, {time!r}, {lat!r}, {lon!r}")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in (user, time, lat, lon) if c not in header]
    if missing:
        raise ValueError(
            f"{path}: no column {missing} (columns: {header}). Name them with read_csv(user=..., "
            "time=..., lat=..., lon=...)."
        )
    lines = [i + 2 for i, r in enumerate(rows[1:]) if any(v.strip() for v in r)]  # file line of each row; no blanks
    body = [rows[i - 1] for i in lines]
    if not body:
        raise ValueError(f"{path} has a header but no check-ins")
    short = next((i for i, r in zip(lines, body) if len(r) < len(header)), None)
    if short is not None:
        raise ValueError(f"{path}: line {short} has {len(rows[short - 1])} fields, the header {len(header)}")
    cols = {c: [r[header.index(c)] for r in body] for c in (user, time, lat, lon)}
    coords = {}
    for c in (lat, lon):
        try:
            coords[c] = np.asarray(cols[c], dtype=np.float64)
        except ValueError:
            row = next(i for i, v in enumerate(cols[c]) if not _is_float(v))
            raise ValueError(f"{path}: line {lines[row]}: {c} {cols[c][row]!r} is not a number") from None
    hours = _hours(cols[time], path, time, lines)
    ids, code = np.unique(np.asarray([u.strip() for u in cols[user]]), return_inverse=True)
    order = np.lexsort((np.arange(len(code)), hours, code))  # by user, then time, then file order
    starts = np.searchsorted(code[order], np.arange(len(ids) + 1))
    users: Users = {}
    for j, uid in enumerate(ids.tolist()):
        idx = order[starts[j] : starts[j + 1]]
        users[uid] = {"hours": hours[idx], "latitudes": coords[lat][idx], "longitudes": coords[lon][idx]}
        validate_trajectory(**users[uid], user=uid, source=path)
    return users


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def read_trajectories(path: str | Path, **csv_columns: str) -> Users:
    """Read ``.h5``/``.hdf5`` (:func:`read_h5`) or ``.csv``/``.tsv`` (:func:`read_csv`, with its column names)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".h5", ".hdf5"):
        return read_h5(path)
    if suffix in (".csv", ".tsv"):
        return read_csv(path, **csv_columns)
    raise ValueError(f"{path}: unknown format {suffix!r}; give an .h5/.hdf5 file (official layout) or a .csv/.tsv")


# ------------------------------------------------------------------------------------------------ windows and scaling
def sliding_windows(
    users: Mapping[str, Mapping[str, np.ndarray]], k: int, relative_time: bool = True, skip_short: bool = False
) -> Tensor:
    """All stride-1 windows of ``k`` points of every user (users in the mapping's order): float64 ``(N, 3, k)``.

    A user with n ≥ k points gives n − k + 1 windows; channels are (t, lat, lon). With ``relative_time`` (default)
    the time channel is hours since the window's first point. *Departs from the official code*, which scales the raw
    ``hours``: cumulative hours have an arbitrary offset per user (and per file), which would dominate the time
    channel's min-max range. ``relative_time=False`` keeps the raw hours.

    Raises:
        ValueError: a user has fewer than ``k`` points (unless ``skip_short``), or no window at all results.

    Example:
        >>> user = {"hours": np.arange(5.0) + 8, "latitudes": np.full(5, 35.68), "longitudes": np.full(5, 139.76)}
        >>> w = sliding_windows({"a": user}, k=3)
        >>> w.shape, w.dtype, w[1, 0].tolist()
        (torch.Size([3, 3, 3]), torch.float64, [0.0, 1.0, 2.0])
    """
    if k < 2:
        raise ValueError(f"k must be ≥ 2 (a window has two endpoints), got {k}")
    parts = []
    for uid, traj in users.items():
        x = np.stack([np.asarray(traj[name], dtype=np.float64) for name in FIELDS])  # (3, n)
        if x.shape[1] < k:
            if skip_short:
                continue
            raise ValueError(
                f"user {uid!r} has {x.shape[1]} points, fewer than k={k}: no window of {k} points fits. "
                "Drop the user or lower k (TrajectoryDataModule skips such users)."
            )
        w = np.lib.stride_tricks.sliding_window_view(x, k, axis=1).transpose(1, 0, 2)  # (n - k + 1, 3, k)
        if relative_time:
            w = w.copy()
            w[:, 0] -= w[:, 0, :1]
        parts.append(w)
    if not parts:
        raise ValueError(f"no user has at least k={k} points ({len(users)} users); lower k or add longer trajectories")
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts)))


class MinMaxScaler:
    """Per-channel min-max scaling to [0, 1] over every axis but the channel axis (−2) of ``(..., C, L)`` windows.

    Statistics are float64 tensors ``min``, ``max`` of shape ``(C,)``; ``transform`` and ``inverse_transform``
    compute in float64 and return the input's dtype (pass float64 to ``inverse_transform`` to keep sub-metre
    precision in degrees). A channel with ``max == min`` is given range 1. Values outside the fitted range (a test
    user beyond the training bounds) map outside [0, 1]; nothing is clamped.

    Example:
        >>> x = torch.tensor([[[0.0, 2.0], [35.6, 35.7], [139.7, 139.9]]], dtype=torch.float64)
        >>> scaler = MinMaxScaler().fit(x)
        >>> scaler.transform(x)[0].tolist()
        [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]
        >>> bool(torch.allclose(scaler.inverse_transform(scaler.transform(x)), x))
        True
        >>> MinMaxScaler().load_state_dict(scaler.state_dict()).max.tolist()
        [2.0, 35.7, 139.9]
    """

    def __init__(self) -> None:
        self.min: Tensor | None = None
        self.max: Tensor | None = None

    @property
    def fitted(self) -> bool:
        return self.min is not None

    def fit(self, x: Tensor) -> MinMaxScaler:
        """Fit ``min`` and ``max`` per channel on ``x`` ``(..., C, L)``; returns the scaler."""
        if x.dim() < 2 or x.numel() == 0:
            raise ValueError(f"MinMaxScaler.fit expects non-empty windows (..., C, L), got shape {tuple(x.shape)}")
        flat = x.detach().double().transpose(-2, -1).reshape(-1, x.shape[-2])
        self.min, self.max = flat.amin(0).cpu(), flat.amax(0).cpu()
        return self

    def _stats(self, x: Tensor, what: str) -> tuple[Tensor, Tensor]:
        if self.min is None or self.max is None:
            raise RuntimeError(f"MinMaxScaler.{what} before fit: call fit(train_windows) or load_state_dict first")
        if x.dim() < 2 or x.shape[-2] != len(self.min):
            raise ValueError(f"MinMaxScaler.{what} expects (..., {len(self.min)}, L), got shape {tuple(x.shape)}")
        lo = self.min.to(x.device).view(-1, 1)
        span = self.max.to(x.device).view(-1, 1) - lo
        return lo, torch.where(span > 0, span, torch.ones_like(span))

    def transform(self, x: Tensor) -> Tensor:
        """``(x − min) / (max − min)`` per channel, in ``x``'s dtype."""
        lo, span = self._stats(x, "transform")
        return ((x.double() - lo) / span).to(x.dtype)

    def inverse_transform(self, y: Tensor) -> Tensor:
        """``y · (max − min) + min`` per channel, in ``y``'s dtype."""
        lo, span = self._stats(y, "inverse_transform")
        return (y.double() * span + lo).to(y.dtype)

    def state_dict(self) -> dict[str, list[float]]:
        """Plain lists (JSON- and checkpoint-friendly)."""
        if self.min is None or self.max is None:
            return {}
        return {"min": self.min.tolist(), "max": self.max.tolist()}

    def load_state_dict(self, state: Mapping[str, list[float]]) -> MinMaxScaler:
        """Restore from :meth:`state_dict`; returns the scaler."""
        if state:
            self.min = torch.tensor(state["min"], dtype=torch.float64)
            self.max = torch.tensor(state["max"], dtype=torch.float64)
        return self

    def __repr__(self) -> str:
        return f"MinMaxScaler(min={self.state_dict().get('min')}, max={self.state_dict().get('max')})"


# ------------------------------------------------------------------------------------------------ the DataModule
def _split_users(ids: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A seeded split of user ids: ``round(fraction · n)`` (at least 1, at most n − 1) first, the rest second."""
    order = np.random.default_rng(seed).permutation(len(ids))
    n = min(max(1, round(fraction * len(ids))), len(ids) - 1)
    return [ids[i] for i in np.sort(order[:n])], [ids[i] for i in np.sort(order[n:])]


class TrajectoryDataModule(BatchedDataModule):
    """Sliding windows ``(3, k)`` of user trajectories as ``(scaled, raw)`` batches for endpoint-conditioned imputation.

    Data, by argument: ``data_dir`` holding ``train.h5`` and ``test.h5`` (the official layout, see :func:`write_h5`);
    or ``path``, one ``.h5`` or ``.csv`` file split by user (``split`` of the users train, the rest test); or neither,
    for the card's synthetic city (:func:`street_grid_checkins` with ``n_users`` and ``seed``). Users with fewer than
    ``k`` points are skipped (card §6). Validation holds out ``val_split`` of the *training users* (default 5 %,
    seeded); ``val_split=0`` validates on the test windows, as the official code does.

    Batches are ``(scaled, raw)``: ``raw`` the float64 windows ``(B, 3, k)`` (t, lat, lon; t relative to the window's
    first point unless ``relative_time=False``, see :func:`sliding_windows`), ``scaled`` float32. With
    ``scaler="global"`` (default) ``scaled`` is ``raw`` min-max scaled with the training windows' statistics;
    with ``scaler="per_batch"`` it is ``raw`` **unscaled** (float32): the model fits min-max on each batch, the official
    behaviour, which at test time sees the hidden interior points (a leak). Either way ``scaler`` holds the training
    split's fitted :class:`MinMaxScaler` after ``setup``.

    Args:
        k: points per window (the model sees the two endpoints and imputes k − 2), ≥ 3.
        n_users: users of the synthetic city.
        seed: seed of the synthetic city and of the user splits.
        split: fraction of users for training when splitting one source (synthetic or ``path``).
        val_split: fraction of the training users held out for validation (0: validate on the test windows).
        batch_size: windows per batch.
        num_workers: DataLoader workers.
        data_dir: a folder with ``train.h5`` and ``test.h5``.
        path: a single ``.h5``/``.hdf5`` or ``.csv``/``.tsv`` file, split by user.
        csv_columns: the CSV's (user, time, lat, lon) column names.
        scaler: ``"global"`` (training statistics) or ``"per_batch"`` (serve unscaled; the model scales per batch).
        relative_time: time channel as hours since the window's first point (else raw ``hours``: the time of day,
            which settles most of the synthetic city's route choices).
        routes: the synthetic city's route model, ``"habits"`` or the card's ``"rules"`` (see
            :func:`street_grid_checkins`).

    Attributes:
        scaler: the :class:`MinMaxScaler` fitted on the training windows (after ``setup``).
        counts: users and windows per split and users skipped as shorter than ``k`` (after ``setup``).
        user_ids: the user ids of each split, ``{"train": [...], "val": [...], "test": [...]}`` (after ``setup``;
            ``val`` is empty when validation reuses the test windows).

    Example:
        >>> dm = TrajectoryDataModule(n_users=40, batch_size=16)
        >>> dm.setup("fit")
        >>> scaled, raw = next(iter(dm.train_dataloader()))
        >>> scaled.shape, scaled.dtype, raw.dtype, dm.counts["train_users"] + dm.counts["val_users"]
        (torch.Size([16, 3, 6]), torch.float32, torch.float64, 34)
    """

    def __init__(
        self,
        k: int = 6,
        n_users: int = 1500,
        seed: int = 0,
        split: float = 0.85,
        val_split: float = 0.05,
        batch_size: int = 128,
        num_workers: int = 0,
        data_dir: str | None = None,
        path: str | None = None,
        csv_columns: tuple[str, str, str, str] = ("user", "time", "lat", "lon"),
        scaler: Literal["global", "per_batch"] = "global",
        relative_time: bool = True,
        routes: Literal["habits", "rules"] = "habits",
    ) -> None:
        super().__init__()
        if scaler not in ("global", "per_batch"):
            raise ValueError(
                f"scaler must be 'global' (training-set min-max) or 'per_batch' (official), got {scaler!r}"
            )
        if k < 3:
            raise ValueError(f"k must be ≥ 3 (two endpoints and at least one point to impute), got {k}")
        if routes not in ("habits", "rules"):
            raise ValueError(f"routes must be 'habits' or 'rules', got {routes!r}")
        if not 0 < split < 1 or not 0 <= val_split < 1:
            raise ValueError(f"need 0 < split < 1 and 0 ≤ val_split < 1, got split={split}, val_split={val_split}")
        if data_dir is not None and path is not None:
            raise ValueError("give data_dir (train.h5 and test.h5) or path (one file split by user), not both")
        self.save_hyperparameters()
        self.scaler = MinMaxScaler()
        self.counts: dict[str, int] = {}
        self.user_ids: dict[str, list[str]] = {}

    @property
    def sample_shape(self) -> tuple[int, int]:
        return (3, self.hparams.k)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        if hp.data_dir:
            source = f"train.h5 and test.h5 in {hp.data_dir}"
        elif hp.path:
            source = f"{hp.path}, users split {hp.split:.0%}/{1 - hp.split:.0%} (seed {hp.seed})"
        else:
            source = (
                f"synthetic street-grid city ({hp.routes}), {hp.n_users} users (seed {hp.seed}), split "
                f"{hp.split:.0%}/{1 - hp.split:.0%} by user"
            )
        c = self.counts
        val = f"{c['val']} validation ({c['val_users']} users)" if c.get("val_users") else "validating on test windows"
        sizes = (
            (
                f": {c['train']} training windows ({c['train_users']} users), {val}, {c['test']} test "
                f"({c['test_users']} users); {c['skipped_users']} users shorter than k skipped"
            )
            if c
            else ""
        )
        return f"{source}, windows of k={hp.k} (t, lat, lon), {hp.scaler} min-max scaling{sizes}"

    def _read(self, file: Path) -> Users:
        columns = dict(zip(("user", "time", "lat", "lon"), self.hparams.csv_columns))
        if not file.is_file() and self.hparams.data_dir:
            raise FileNotFoundError(
                f"No trajectory file at {file}. TrajectoryDataModule(data_dir=...) expects data_dir to hold train.h5 "
                "and test.h5, one group per user id with 1-D float arrays hours, latitudes, longitudes (write them "
                "with datamodules.trajectories.write_h5); or give path= one .h5/.csv file, or neither for the "
                "synthetic city."
            )
        if not file.is_file():
            raise FileNotFoundError(
                f"No trajectory file at {file}. TrajectoryDataModule(path=...) expects one .h5 file in the official "
                f"layout (see write_h5) or a .csv with columns {list(columns.values())} (set csv_columns); or give "
                "data_dir= a folder with train.h5 and test.h5, or neither for the synthetic city."
            )
        return read_trajectories(file, **columns)

    def _keep(self, users: Users, source: str) -> Users:
        k = self.hparams.k
        kept = {u: t for u, t in users.items() if len(t["hours"]) >= k}
        self.counts["skipped_users"] = self.counts.get("skipped_users", 0) + len(users) - len(kept)
        if not kept:
            longest = max((len(t["hours"]) for t in users.values()), default=0)
            raise ValueError(
                f"{source}: no user has at least k={k} points ({len(users)} users, the longest has "
                f"{longest}). Lower k or give longer trajectories."
            )
        return kept

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        self.counts = {}
        if hp.data_dir:
            root = Path(hp.data_dir)
            train = self._keep(self._read(root / "train.h5"), str(root / "train.h5"))
            test = self._keep(self._read(root / "test.h5"), str(root / "test.h5"))
        else:
            if hp.path:
                source, users = str(hp.path), self._read(Path(hp.path))
            else:
                source, users = "synthetic city", street_grid_checkins(hp.n_users, seed=hp.seed, routes=hp.routes)
                for uid, t in users.items():
                    validate_trajectory(**t, user=uid, source=source)
            users = self._keep(users, source)
            if len(users) < 2:
                raise ValueError(f"{source}: {len(users)} user with ≥ k={hp.k} points; a split by user needs 2 or more")
            train_ids, test_ids = _split_users(sorted(users), hp.split, hp.seed)
            train, test = {u: users[u] for u in train_ids}, {u: users[u] for u in test_ids}
        val = None
        if hp.val_split > 0 and len(train) > 1:
            val_ids, train_ids = _split_users(sorted(train), hp.val_split, hp.seed + 1)
            train, val = {u: train[u] for u in train_ids}, {u: train[u] for u in val_ids}
        raw = {name: sliding_windows(s, hp.k, hp.relative_time) for name, s in (("train", train), ("test", test))}
        raw["val"] = sliding_windows(val, hp.k, hp.relative_time) if val else raw["test"]
        self.scaler = MinMaxScaler().fit(raw["train"])
        served = {n: (self.scaler.transform(w) if hp.scaler == "global" else w).float() for n, w in raw.items()}
        splits = ("train", "val", "test")
        self.train_set, self.val_set, self.test_set = (TensorBatches(served[n], raw[n]) for n in splits)
        self.counts.update({n: len(w) for n, w in raw.items()})
        self.counts.update(train_users=len(train), val_users=len(val) if val else 0, test_users=len(test))
        self.user_ids = {"train": list(train), "val": list(val or {}), "test": list(test)}
