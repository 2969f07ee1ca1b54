"""Cyclone rain data: the synthetic spiral cyclones, the DataModule's batches, and netCDF/zarr files."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zoo.datamodules.cyclone import CycloneDataModule, spiral_cyclones
from zoo.datamodules.cyclone_files import FIELD_DIMS


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (no ties in continuous data)."""
    ra, rb = (x.argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


# ------------------------------------------------------------------------------------------------ the generator
def test_spiral_cyclones_shapes_dtype_and_ranges() -> None:
    """Check that every field has its documented shape, is float32, rain is ≥ 0 and moisture lies in [0, 1]."""
    d = spiral_cyclones(20, size=16, seed=0)
    shapes = {"rain": (20, 8, 16, 16), "moisture": (20, 4, 16, 16), "scalars": (20, 4, 5), "nwp_rain": (20, 4, 16, 16),
              "kappa": (20,), "m_bar": (20,)}  # fmt: skip
    for key, shape in shapes.items():
        assert d[key].shape == shape and d[key].dtype == torch.float32, key
    assert (d["rain"] >= 0).all() and (d["nwp_rain"] >= 0).all() and d["rain"].max() > 5
    assert d["moisture"].min() >= 0 and d["moisture"].max() <= 1
    wind, onehot = d["scalars"][..., 0], d["scalars"][..., 1:]
    assert (wind >= 0).all() and (wind <= 1).all() and (onehot.sum(-1) == 1).all()
    assert torch.equal(onehot.argmax(-1), (wind * 4).long().clamp_max(3))  # the class of each frame's own wind
    assert torch.allclose(wind[:, -1], d["wind"])  # the last past frame carries the current wind


def test_spiral_cyclones_are_deterministic_per_seed() -> None:
    """Check that one seed gives the same samples twice and another seed gives other samples."""
    a, b, c = spiral_cyclones(8, seed=3), spiral_cyclones(8, seed=3), spiral_cyclones(8, seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["rain"], c["rain"])


def test_spiral_cyclones_trend_follows_moisture_offset() -> None:
    """Check that the growth of box-mean rain from frame 3 to 7 rises with the past moisture's box mean."""
    d = spiral_cyclones(500, seed=1)
    growth = d["rain"][:, 7].mean((1, 2)) / d["rain"][:, 3].mean((1, 2))
    moisture = d["moisture"].mean((1, 2, 3))
    assert moisture.std() > 0.2  # the per-sample offset m̄ varies (review note), not only the smooth perturbation
    assert _spearman(moisture, growth) > 0.5  # measured 0.93


def test_spiral_cyclones_nwp_is_informative_but_imperfect() -> None:
    """Check that the NWP rain correlates with the true future rain but differs from it."""
    d = spiral_cyclones(300, seed=2)
    future, nwp = d["rain"][:, 4:], d["nwp_rain"]
    r = float(torch.corrcoef(torch.stack([future.flatten(), nwp.flatten()]))[0, 1])
    assert 0.6 < r < 0.99  # measured 0.92
    assert (nwp - future).abs().mean() > 0.1 * future.mean()


def test_spiral_cyclones_have_no_seam_at_pi() -> None:
    """Check that rain jumps across the φ = ±π half-line no more than across φ = 0 (the wrapped band angle)."""
    size = 16
    rain = spiral_cyclones(500, size=size, seed=5)["rain"]
    jump = (rain[:, :, size // 2] - rain[:, :, size // 2 - 1]).abs()  # neighbours across the horizontal axis
    at_pi, at_zero = jump[..., : size // 2].mean(), jump[..., size // 2 :].mean()  # x < 0 is φ = ±π, x > 0 is φ = 0
    assert at_pi < 1.15 * at_zero  # measured 1.00–1.05 over 6 seeds; the unwrapped angle gives 3.6


def test_spiral_cyclones_generate_6500_samples_quickly() -> None:
    """Check that 6,500 samples at 16×16 take less than 3 s (vectorised, no loop over samples)."""
    spiral_cyclones(10)
    start = time.perf_counter()
    spiral_cyclones(6500, size=16)
    assert time.perf_counter() - start < 3.0  # measured 0.7–2 s on 2 busy cores


# ------------------------------------------------------------------------------------------------ the DataModule
def _synthetic(**kwargs: Any) -> CycloneDataModule:
    dm = CycloneDataModule(**{"n_train": 64, "n_val": 16, "n_test": 16, "batch_size": 8, **kwargs})
    dm.setup("fit")
    return dm


def test_cyclone_datamodule_batch_keys_shapes_and_units() -> None:
    """Check the batch keys and shapes, rain in mm (not normalised), env and NWP in [0, 1] and valid all True."""
    dm = _synthetic()
    batch = next(iter(dm.train_dataloader()))
    shapes = {"past_rain": (8, 4, 16, 16), "future_rain": (8, 4, 16, 16), "env": (8, 1, 4, 16, 16),
              "nwp": (8, 1, 4, 16, 16), "scalars": (8, 4, 5), "valid": (8, 4, 16, 16)}  # fmt: skip
    assert {k: tuple(v.shape) for k, v in batch.items()} == shapes
    assert batch["valid"].dtype == torch.bool and batch["valid"].all()
    data = dm.train_set.data
    assert data["future_rain"].min() >= 0 and data["future_rain"].max() > 5  # mm per 3 h
    for key in ("env", "nwp"):
        assert data[key].min() >= 0 and data[key].max() <= 1, key
    assert dm.env_vars == ["moisture"] and dm.nwp_vars == ["nwp_rain"] and dm.num_scalars == 5
    assert dm.ranges_["moisture"] == [0.0, 1.0] and dm.ranges_["nwp_rain"][1] > 1  # log1p space, train max
    assert "64/16/16 train/val/test" in dm.describe()


def test_cyclone_datamodule_serves_past_frames_and_scalars_only() -> None:
    """Check that past and future rain are frames 0–3 and 4–7, and that the scalars are the 4 past frames' only."""
    dm = _synthetic()
    d = spiral_cyclones(64, seed=0)
    data = dm.train_set.data
    assert torch.equal(data["past_rain"], d["rain"][:, :4]) and torch.equal(data["future_rain"], d["rain"][:, 4:])
    assert data["scalars"].shape == (64, 4, 5) and torch.equal(data["scalars"], d["scalars"])  # range [0, 1]
    expected_nwp = torch.log1p(d["nwp_rain"])
    lo, hi = dm.ranges_["nwp_rain"]
    assert torch.allclose(data["nwp"][:, 0], (expected_nwp - lo) / (hi - lo))


def test_cyclone_datamodule_is_deterministic() -> None:
    """Check that one seed gives the same batches and that train, val and test use different seeds."""
    a, b = _synthetic(seed=7), _synthetic(seed=7)
    for split in ("train_set", "val_set", "test_set"):
        da, db = getattr(a, split).data, getattr(b, split).data
        assert all(torch.equal(da[k], db[k]) for k in da), split
    assert torch.equal(next(iter(a.val_dataloader()))["future_rain"], next(iter(b.val_dataloader()))["future_rain"])
    assert not torch.equal(a.val_set.data["past_rain"], a.test_set.data["past_rain"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"source": "grib"}, ValueError, "source must be 'synthetic', 'netcdf' or 'zarr'"),
        ({"source": "netcdf"}, ValueError, "needs path"),
        ({"path": "tc.nc"}, ValueError, "read only by source='netcdf' or 'zarr'"),
        ({"env_vars": ["q850"]}, ValueError, "the synthetic source has env"),
        ({"nan": "drop"}, ValueError, "nan must be 'raise'"),
        ({"ranges": {"sst": [310.0, 270.0]}}, ValueError, r"ranges\['sst'\] must be \[min, max\]"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, ValueError, "their sum < 1"),
        ({"source": "netcdf", "path": "x.nc", "env_vars": ["tp"], "nwp_vars": ["tp"]}, ValueError, "observed future"),
    ],
)
def test_cyclone_datamodule_rejects_bad_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    """Check that bad arguments fail in __init__ with a message that names the problem."""
    with pytest.raises(error, match=match):
        CycloneDataModule(**kwargs)


# ------------------------------------------------------------------------------------------------ files
def _dataset(n: int = 12, times: int = 8, hw: int = 20) -> Any:
    """A tiny file in the documented layout: values of q850, tp and wind encode their time index."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(0)
    shape = (n, times, hw, hw)
    t = np.arange(times, dtype=np.float32)[None, :, None, None]
    return xr.Dataset({
        "precipitation": (FIELD_DIMS, rng.gamma(0.5, 4.0, shape).astype(np.float32)),
        "q850": (FIELD_DIMS, (0.01 * rng.random(shape) + t).astype(np.float32)),
        "sst": (FIELD_DIMS, (290 + 5 * rng.random(shape)).astype(np.float32)),
        "tp": (FIELD_DIMS, (10 * rng.random(shape) + 100 * t).astype(np.float32)),
        "wind": (("sample", "time"), (np.arange(n)[:, None] + 100.0 * np.arange(times)).astype(np.float32)),
        "storm": (("sample",), np.array([f"TC{i // 3:02d}" for i in range(n)])),  # 4 storms of 3 samples
    })  # fmt: skip


def _write(ds: Any, path: Path) -> str:
    pytest.importorskip("h5netcdf")
    ds.to_netcdf(path, engine="h5netcdf")
    return str(path)


def _files(path: str, **kwargs: Any) -> CycloneDataModule:
    args = {"source": "netcdf", "path": path, "size": 20, "env_vars": ["q850", "sst"], "nwp_vars": ["tp"],
            "scalar_vars": ["wind"], "val_fraction": 0.25, "test_fraction": 0.25, "batch_size": 4}  # fmt: skip
    args.update(kwargs)
    dm = CycloneDataModule(**args)
    dm.setup()
    return dm


def _gather(dm: CycloneDataModule, key: str) -> torch.Tensor:
    """``key`` of every split, back in the file's sample order."""
    parts = {s: getattr(dm, f"{s}_set").data[key] for s in ("train", "val", "test")}
    out = torch.empty(sum(len(v) for v in parts.values()), *parts["train"].shape[1:], dtype=parts["train"].dtype)
    for split, values in parts.items():
        out[dm.indices_[split]] = values
    return out


def test_cyclone_datamodule_reads_netcdf_at_the_right_times(tmp_path: Path) -> None:
    """Check shapes, rain values, and that env and scalars come from the past times and NWP from the future ones."""
    ds = _dataset()
    dm = _files(_write(ds, tmp_path / "tc.nc"), ranges={"wind": [0.0, 1.0]})
    assert sum(dm.counts.values()) == 12 and dm.num_scalars == 1
    batch = next(iter(dm.train_dataloader()))
    assert batch["env"].shape == (4, 2, 4, 20, 20) and batch["nwp"].shape == (4, 1, 4, 20, 20)
    assert batch["scalars"].shape == (4, 4, 1) and batch["valid"].all()
    rain = torch.from_numpy(ds["precipitation"].values)
    assert torch.equal(_gather(dm, "future_rain"), rain[:, 4:]) and torch.equal(_gather(dm, "past_rain"), rain[:, :4])
    assert dm.ranges_["q850"][1] < 3.1  # env read at times 0–3 only
    assert dm.ranges_["tp"][0] > math.log1p(399)  # NWP read at times 4–7, log1p applied ("tp" is rain-like)
    expected_wind = torch.arange(12.0)[:, None] + 100.0 * torch.arange(4.0)
    assert torch.equal(_gather(dm, "scalars")[..., 0], expected_wind)  # the given range [0, 1] leaves it as is
    train = dm.train_set.data
    assert train["env"].min() == 0 and train["env"].max() == 1 and train["nwp"].max() == 1


def test_cyclone_datamodule_keeps_each_storm_in_one_split(tmp_path: Path) -> None:
    """Check that the split is by storm: no storm in two splits, every sample in exactly one split."""
    ds = _dataset()
    dm = _files(_write(ds, tmp_path / "tc.nc"))
    storms = ds["storm"].values
    seen = [set(dm.storms_[s]) for s in ("train", "val", "test")]
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    for split in ("train", "val", "test"):
        assert set(storms[dm.indices_[split]]) == set(dm.storms_[split])
    assert sorted(i for idx in dm.indices_.values() for i in idx) == list(range(12))
    assert "split by storm" in dm.describe()


def test_cyclone_datamodule_splits_by_sample_without_storm(tmp_path: Path) -> None:
    """Check that a file without 'storm' is split by sample, seeded."""
    path = _write(_dataset().drop_vars("storm"), tmp_path / "tc.nc")
    a, b = _files(path), _files(path)
    assert a.storms_ == {} and a.indices_ == b.indices_
    assert sorted(i for idx in a.indices_.values() for i in idx) == list(range(12))


def test_cyclone_datamodule_raises_on_patch_size_mismatch(tmp_path: Path) -> None:
    """Check that 20×20 patches with size=16 fail with both sizes named and the two remedies."""
    path = _write(_dataset(), tmp_path / "tc.nc")
    with pytest.raises(ValueError, match=r"20×20 patches, but size=16\. Pass size=20.*or resize=True"):
        _files(path, size=16)


def test_cyclone_datamodule_resizes_rain_in_log_space(tmp_path: Path) -> None:
    """Check that resize=True gives 16×16 patches and resizes rain as log1p, bilinear, then expm1."""
    ds = _dataset()
    dm = _files(_write(ds, tmp_path / "tc.nc"), size=16, resize=True)
    batch = next(iter(dm.val_dataloader()))
    assert all(batch[k].shape[-2:] == (16, 16) for k in ("past_rain", "future_rain", "env", "nwp", "valid"))
    rain = torch.from_numpy(ds["precipitation"].values)
    expected = torch.expm1(F.interpolate(torch.log1p(rain), size=(16, 16), mode="bilinear", align_corners=False))
    assert torch.allclose(_gather(dm, "future_rain"), expected[:, 4:], rtol=1e-4, atol=1e-5)


def test_cyclone_datamodule_raises_on_nan_naming_the_variable(tmp_path: Path) -> None:
    """Check that a NaN in an env field read fails with its name, count and first index; one at an unread time not."""
    ds = _dataset()
    ds["q850"][5, 2, 0, 0] = np.nan
    ds["sst"][0, 6, 1, 1] = np.nan  # a future time of an env variable: never read
    with pytest.raises(ValueError, match=r"'q850'.* 1 NaN value\(s\).*sample 5, time 2\). Pass nan='zero'"):
        _files(_write(ds, tmp_path / "tc.nc"))
    ds["q850"][5, 2, 0, 0] = 1.0
    _files(_write(ds, tmp_path / "ok.nc"))


def test_cyclone_datamodule_zeroes_nan_and_marks_invalid_future_rain(tmp_path: Path) -> None:
    """Check that nan='zero' sets NaNs to 0 and 'valid' is False exactly at the NaN future rain pixels."""
    ds = _dataset()
    for s, t, y, x in ((1, 5, 3, 4), (7, 7, 0, 0), (7, 7, 0, 1), (2, 1, 2, 2)):  # the last one is a past frame
        ds["precipitation"][s, t, y, x] = np.nan
    ds["tp"][3, 4, 5, 5] = np.nan
    path = _write(ds, tmp_path / "tc.nc")
    with pytest.raises(ValueError, match="'precipitation'.* 4 NaN"):
        _files(path)
    dm = _files(path, nan="zero")
    nan_future = torch.from_numpy(np.isnan(ds["precipitation"].values[:, 4:]))
    assert torch.equal(_gather(dm, "valid"), ~nan_future)
    assert (_gather(dm, "future_rain")[nan_future] == 0).all() and _gather(dm, "past_rain")[2, 1, 2, 2] == 0
    assert torch.isfinite(_gather(dm, "nwp")).all()


def test_cyclone_datamodule_missing_variables_raise_key_error(tmp_path: Path) -> None:
    """Check that variables absent from the file fail with every missing name and the file's variables."""
    path = _write(_dataset(), tmp_path / "tc.nc")
    with pytest.raises(KeyError, match=r"lacks the variable\(s\) \['z500', 'msl'\]; it has \['precipitation'"):
        _files(path, env_vars=["q850", "z500"], nwp_vars=["msl"])


def test_cyclone_datamodule_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    """Check that a missing file fails with what to put where."""
    with pytest.raises(FileNotFoundError, match=r"No cyclone patch file at .*absent\.nc.*'storm' \(sample,\)"):
        _files(str(tmp_path / "absent.nc"))


def test_cyclone_datamodule_raises_on_too_few_time_steps(tmp_path: Path) -> None:
    """Check that a file with 6 time steps fails, saying 8 are expected."""
    path = _write(_dataset(times=6), tmp_path / "tc.nc")
    with pytest.raises(ValueError, match="has 6 time steps, expected 8"):
        _files(path)


def test_cyclone_datamodule_reads_zarr_like_netcdf(tmp_path: Path) -> None:
    """Check that the same data as a zarr store gives the same batches as the netCDF file."""
    pytest.importorskip("zarr")
    ds = _dataset()
    ds.to_zarr(tmp_path / "tc.zarr", zarr_format=2)  # format 2: string storm ids and consolidated metadata are spec
    z = _files(str(tmp_path / "tc.zarr"), source="zarr")
    nc = _files(_write(ds, tmp_path / "tc.nc"))
    assert z.indices_ == nc.indices_ and z.ranges_ == nc.ranges_
    assert all(torch.equal(z.test_set.data[k], nc.test_set.data[k]) for k in z.test_set.data)
