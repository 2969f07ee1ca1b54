"""Reading TC-centred patches from a netCDF or zarr file for :class:`datamodules.cyclone.CycloneDataModule`.

The layout (dims ``sample``, ``time``, ``y``, ``x``; 4 past then 4 future 3-hourly frames) is documented in
:mod:`datamodules.cyclone`. xarray is imported only when a file is read, so importing this module needs no xarray.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["FIELD_DIMS", "FRAMES", "PAST", "SCALAR_DIMS", "read_cyclone_file", "resize_fields"]

FRAMES, PAST = 8, 4  # 8 frames at Δt = 3 h: 4 observed, then the 4 to forecast (card §2.1)
FIELD_DIMS = ("sample", "time", "y", "x")
SCALAR_DIMS = ("sample", "time")


def resize_fields(x: Tensor, size: int) -> Tensor:
    """Bilinear resize of the last two axes of ``x`` ``(..., H, W)`` to ``(size, size)`` (half-pixel centres, as
    ``cv2.resize`` with ``INTER_LINEAR``, the official loader's call).

    Example:
        >>> resize_fields(torch.ones(2, 3, 4, 20, 20), 16).shape
        torch.Size([2, 3, 4, 16, 16])
    """
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, 1, h, w).float()
    return F.interpolate(flat, size=(size, size), mode="bilinear", align_corners=False).reshape(*lead, size, size)


def _open(path: str, source: str) -> Any:
    try:
        import xarray
    except ImportError as err:  # pragma: no cover - xarray is a dependency of the zoo
        raise ImportError(f"CycloneDataModule(source={source!r}) reads files with xarray: pip install xarray h5netcdf"
                          " (and zarr for source='zarr').") from err  # fmt: skip
    return xarray.open_zarr(path) if source == "zarr" else xarray.open_dataset(path)


def _check_nan(x: np.ndarray, name: str, t0: int, nan: str, path: str) -> np.ndarray:
    """``x`` ``(sample, time, ...)`` with NaNs raised about (``nan="raise"``) or set to 0; returns the NaN mask."""
    bad = np.isnan(x)
    count = int(bad.sum())
    if count and nan == "raise":
        s, t = (int(i) for i in np.argwhere(bad)[0][:2])
        raise ValueError(
            f"variable {name!r} of {path} has {count} NaN value(s) in the frames read (first at sample {s}, time "
            f"{t0 + t}). Pass nan='zero' to set them to 0 (the official nan_to_num; 'valid' then marks the future "
            "rain pixels that were real values), or fill them in the file."
        )
    if count:
        x[bad] = 0.0
    return bad


def read_cyclone_file(
    path: str,
    *,
    source: Literal["netcdf", "zarr"] = "netcdf",
    rain_var: str = "precipitation",
    env_vars: Sequence[str] = (),
    nwp_vars: Sequence[str] = (),
    scalar_vars: Sequence[str] = (),
    log_vars: Sequence[str] = (),
    size: int = 16,
    resize: bool = False,
    nan: Literal["raise", "zero"] = "raise",
) -> dict[str, Any]:
    """Read every sample of a TC patch file into tensors, before any range normalisation.

    Fields are read at the frames they describe: rain at all 8, environment variables at the 4 past times, NWP
    variables at the 4 future times, scalars at the 4 past times (time steps past the 8th are ignored). Rain and
    the ``log_vars`` get ``log1p`` (after negatives, packing noise in ERA5 precipitation, are set to 0) *before* the
    bilinear resize, the official loader's order; rain then gets ``expm1`` back to its unit.

    Args:
        path: the ``.nc`` file (read by ``xarray.open_dataset``) or zarr store (``xarray.open_zarr``).
        source: ``"netcdf"`` or ``"zarr"``.
        rain_var: the rain variable ``(sample, time, y, x)``, e.g. MSWEP mm per 3 h.
        env_vars: environment variables ``(sample, time, y, x)``.
        nwp_vars: NWP forecast variables ``(sample, time, y, x)``, valid at the future times.
        scalar_vars: per-frame scalars ``(sample, time)``.
        log_vars: names among ``env_vars`` and ``nwp_vars`` that get ``log1p``.
        size: the patch side the caller expects.
        resize: resize patches of another size to ``size`` (else a patch size mismatch is an error).
        nan: ``"raise"`` on a NaN in the frames read, or ``"zero"`` to set NaNs to 0.

    Returns:
        ``rain`` (N, 8, S, S) in the file's unit; ``valid`` (N, 4, S, S) bool, the future rain pixels that were not
        NaN (after a resize, pixels all of whose source pixels were real); ``env`` (N, C_env, 4, S, S) and ``nwp``
        (N, C_nwp, 4, S, S) float32, log1p-transformed where named in ``log_vars``; ``scalars`` (N, 4, D); ``storm``
        the ``storm`` variable as a numpy array ``(N,)``, or None when the file has none.

    Raises:
        FileNotFoundError: nothing at ``path``.
        KeyError: variables missing from the file (all of them named, with the file's variables).
        ValueError: wrong dims, fewer than 8 time steps, a patch size other than ``size`` without ``resize``,
            negative rain or a NaN with ``nan="raise"``.

    Example:
        >>> import tempfile, xarray
        >>> ds = xarray.Dataset({"precipitation": (FIELD_DIMS, np.ones((3, 8, 20, 20), "float32")),
        ...                      "q850": (FIELD_DIMS, np.zeros((3, 8, 20, 20), "float32"))})
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ds.to_netcdf(f"{tmp}/tc.nc", engine="h5netcdf")
        ...     data = read_cyclone_file(f"{tmp}/tc.nc", env_vars=["q850"], size=16, resize=True)
        >>> data["rain"].shape, data["env"].shape, data["scalars"].shape, data["storm"]
        (torch.Size([3, 8, 16, 16]), torch.Size([3, 1, 4, 16, 16]), torch.Size([3, 4, 0]), None)
    """
    if not Path(path).exists():
        kind = "a zarr store (a folder)" if source == "zarr" else "a netCDF file"
        raise FileNotFoundError(
            f"No cyclone patch file at {path}. CycloneDataModule(source={source!r}, path=...) expects {kind} with dims "
            f"{FIELD_DIMS}: {rain_var!r} and the env/NWP variables as (sample, time, y, x) with 8 3-hourly frames "
            "(4 past, then 4 future), scalars as (sample, time), optionally 'storm' (sample,). Write one with "
            "xarray's Dataset.to_netcdf or to_zarr, or leave source at 'synthetic' for generated data."
        )
    with _open(path, source) as ds:
        wanted = {rain_var: FIELD_DIMS, **dict.fromkeys(env_vars, FIELD_DIMS), **dict.fromkeys(nwp_vars, FIELD_DIMS),
                  **dict.fromkeys(scalar_vars, SCALAR_DIMS)}  # fmt: skip
        missing = [v for v in wanted if v not in ds.variables]
        if missing:
            raise KeyError(f"{path} lacks the variable(s) {missing}; it has {sorted(map(str, ds.data_vars))}. Name "
                           "them with rain_var, env_vars, nwp_vars and scalar_vars.")  # fmt: skip
        for name, dims in wanted.items():
            if set(ds[name].dims) != set(dims):
                raise ValueError(f"variable {name!r} of {path} has dims {ds[name].dims}, expected {dims}. Rename "
                                 "them with Dataset.rename or transpose the data to this layout.")  # fmt: skip
        if ds.sizes["time"] < FRAMES:
            raise ValueError(f"{path} has {ds.sizes['time']} time steps, expected {FRAMES} (4 past, then 4 future, "
                             "3-hourly). Write each sample's full 8-frame window.")  # fmt: skip
        h, w = ds.sizes["y"], ds.sizes["x"]
        if (h, w) != (size, size) and not resize:
            keep = f"Pass size={h} to use them as they are, or" if h == w else "They are not square: pass"
            raise ValueError(f"{path} holds {h}×{w} patches, but size={size}. {keep} resize=True to resize them "
                             f"bilinearly to {size}×{size}.")  # fmt: skip

        def read(name: str, t0: int, frames: int, dims: tuple[str, ...]) -> np.ndarray:
            da = ds[name].isel(time=slice(t0, t0 + frames)).transpose(*dims)
            return np.array(da.values, dtype=np.float32)  # a writable copy, also of a zarr array

        rain = read(rain_var, 0, FRAMES, FIELD_DIMS)
        rain_nan = _check_nan(rain, rain_var, 0, nan, path)
        if (rain < -1e-3).any():  # tiny negatives are packing noise (set to 0 below); larger ones are wrong data
            raise ValueError(f"variable {rain_var!r} of {path} has {int((rain < -1e-3).sum())} negative value(s) "
                             f"(down to {rain.min():g}); rain must be ≥ 0. Check rain_var and the file.")  # fmt: skip
        fields = {}
        for group, names, t0 in (("env", env_vars, 0), ("nwp", nwp_vars, PAST)):
            arrays = []
            for name in names:
                x = read(name, t0, PAST, FIELD_DIMS)
                _check_nan(x, name, t0, nan, path)
                arrays.append(np.log1p(np.clip(x, 0, None)) if name in log_vars else x)
            fields[group] = torch.from_numpy(np.stack(arrays, 1)) if arrays else torch.zeros(len(rain), 0, PAST, h, w)
        scalars = []
        for name in scalar_vars:
            x = read(name, 0, PAST, SCALAR_DIMS)
            _check_nan(x, name, 0, nan, path)
            scalars.append(x)
        storm = None
        if "storm" in ds.variables:
            if ds["storm"].dims != ("sample",):
                raise ValueError(f"'storm' of {path} has dims {ds['storm'].dims}, expected ('sample',): one storm id "
                                 "per sample. Rename the variable if it is something else.")  # fmt: skip
            storm = np.asarray(ds["storm"].values)
    rain_t = torch.from_numpy(np.clip(rain, 0, None))
    valid = torch.from_numpy(~rain_nan[:, PAST:])
    if (h, w) != (size, size):
        rain_t = torch.expm1(resize_fields(torch.log1p(rain_t), size)).clamp_min(0)  # the official order (review)
        fields = {k: resize_fields(v, size) for k, v in fields.items()}
        valid = resize_fields(valid.float(), size) > 1 - 1e-4  # valid only where every source pixel was
    return {
        "rain": rain_t,
        "valid": valid,
        "env": fields["env"],
        "nwp": fields["nwp"],
        "scalars": torch.from_numpy(np.stack(scalars, -1)) if scalars else torch.zeros(len(rain), PAST, 0),
        "storm": storm,
    }
