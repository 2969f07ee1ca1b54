"""Tropical-cyclone-centred rain nowcasting data (TCP-Diffusion): synthetic spiral cyclones, netCDF and zarr files.

A sample is 8 frames at Δt = 3 h of a storm-centred box: 4 observed, then the 4 to forecast (the next 12 h), with
environment fields of the past frames, NWP forecast fields of the future frames and per-frame storm scalars (card
§2.1). The embedded default is the card's §6 toy, :func:`spiral_cyclones`: an eyewall ring and two rotating spiral
bands whose intensity trend is set by an environmental moisture offset and the wind, with a blurred, rotated,
amplitude-biased copy of the true future as the "NWP" forecast.

File layout (``source="netcdf"``: ``xarray.open_dataset(path)``; ``"zarr"``: ``xarray.open_zarr(path)``):

- dims ``sample``, ``time`` (8 frames, 3-hourly: 4 past, then 4 future; further steps are ignored), ``y``, ``x``;
- the rain variable (``rain_var``) ``(sample, time, y, x)``, e.g. MSWEP in mm per 3 h, read at all 8 times;
- environment variables (``env_vars``) ``(sample, time, y, x)``, e.g. ERA5 t/q/u/v/z, read at the 4 past times;
- NWP variables (``nwp_vars``) ``(sample, time, y, x)``, read at the 4 future times: the file holds the forecast
  valid at those times (lead-time aligned with the forecast window);
- scalar variables (``scalar_vars``) ``(sample, time)``, e.g. wind, translation speed, read at the 4 past times
  only (the official code also feeds the future frames' track and intensity, which is leakage; card §9);
- optionally ``storm`` ``(sample,)``: storm ids. When present the splits are drawn by storm (seeded), so no storm lies
  in two splits; otherwise by sample.

Write such a file with ``xarray.Dataset({...}).to_netcdf(path, engine="h5netcdf")`` or ``.to_zarr(path)``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, DictBatches
from zoo.datamodules.cyclone_files import FRAMES, PAST, read_cyclone_file

__all__ = ["CycloneDataModule", "spiral_cyclones"]

SYNTHETIC_SCALARS = ["wind", "intensity_class_0", "intensity_class_1", "intensity_class_2", "intensity_class_3"]
RAIN_LIKE = ["precipitation", "tp", "total_precipitation", "nwp_rain"]


def _u(g: torch.Generator, lo: float, hi: float, *shape: int) -> Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=g)


def _clean_rain(p: dict[str, Tensor], r: Tensor, phi: Tensor, k: Tensor) -> Tensor:
    """Card §6 rain ``(n, K, S, S)`` of frames ``k`` ``(K,)`` at pixel radii ``r`` and angles ``phi``, before noise.

    The band distance wraps the angle into (−π, π]; that moves the jump of the raw angle (at φ = ±π) to the angle
    opposite each band's root, where the band would still jump radially by 2πβ. *Departs from the card's formula*:
    each band fades out (×sin²θ over |θ| in (π/2, π]) before that point, a finite arc, so no frame has a seam.
    Written with in-place operations on the (n, K, S, S) tensors: allocation dominates at this size.
    """
    k = k.view(1, -1, 1, 1)
    col = {name: v.view(-1, 1, 1, 1) for name, v in p.items() if v.ndim == 1}
    field = torch.exp(-((r - col["r_e"]) ** 2) / (2 * col["w"] ** 2)).expand(-1, k.shape[1], -1, -1).clone()  # eyewall
    for b in range(p["r_b"].shape[1]):
        r_b, w_b, phi_b, beta = (p[name][:, b].view(-1, 1, 1, 1) for name in ("r_b", "w_b", "phi_b", "beta"))
        # θ = wrap(φ − ωk − φ_b) = π − ((π − (φ − ωk − φ_b)) mod 2π), in (−π, π]
        theta = (col["omega"] * k + phi_b - phi).add_(math.pi).remainder_(2 * math.pi).neg_().add_(math.pi)
        fade = torch.cos(theta).clamp_max_(0).square_().neg_().add_(1)  # 1 for |θ| ≤ π/2, else 1 − cos²θ = sin²θ
        band = theta.mul_(-beta).add_(r - r_b).square_().mul_(-1 / (2 * w_b**2)).exp_()  # exp(−d²/2w_b²)
        field.add_(band.mul_(fade))
    asymmetry = 1 + col["a"] * torch.cos(phi - col["phi_shear"])
    return field.mul_(asymmetry).mul_(col["A"] * torch.exp(col["kappa"] * k))


def _blur(x: Tensor, sigma: float) -> Tensor:
    """Gaussian blur of ``(..., S, S)`` with standard deviation ``sigma`` pixels, edges replicated.

    Separable, as two matrix products with an (S, S) blur matrix (the edge replication folded into it): at 16×16
    this is several times faster than ``conv2d`` with a 1-channel kernel on a large batch.
    """
    size = x.shape[-1]
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1)
    g = torch.exp(-(t.float() ** 2) / (2 * sigma**2))
    rows = torch.arange(size).view(-1, 1).expand(-1, len(t))
    B = torch.zeros(size, size).index_put_((rows, (rows + t).clamp(0, size - 1)), g.expand(size, -1), accumulate=True)
    B = B / B.sum(1, keepdim=True)
    return B @ x @ B.T


def spiral_cyclones(n: int, size: int = 16, seed: int = 0) -> dict[str, Tensor]:
    """Synthetic TC-centred rain with an environment-driven intensity trend and an imperfect NWP forecast (card §6).

    Frames k = 0..7 (Δt = 3 h; 0–3 past, 4–7 future) on a ``size``×``size`` grid centred on the storm, with pixel
    polar coordinates (r, φ), r in box half-widths. Rain in mm per 3 h:
    ``R_k = A·e^{κk}·[exp(−(r − r_e)²/2w²) + Σ_b exp(−d_b²/2w_b²)·fade_b]·(1 + a·cos(φ − φ_shear))``, with the
    spiral distance ``d_b = r − r_b − β_b·wrap(φ − ωk − φ_b)`` (see ``_clean_rain`` for the fade), then
    ×(1 + 0.05ε) noise, 3 clutter blobs per frame (peak U[0, 2] mm, σ U[0.05, 0.15] half-widths, anywhere), ≥ 0.
    Per sample: A ~ U[5, 60], ω ~ U[0.1, 0.4] rad per frame, φ_shear ~ U[0, 2π), a ~ U[0, 0.5], r_e ~ U[0.2, 0.35],
    w ~ U[0.06, 0.1]; per band b = 1, 2: r_b ~ U[0.3, 0.6], w_b ~ U[0.06, 0.12], φ_b ~ U[0, 2π), β_b ~ U[0.05, 0.12].
    Intensity trend ``κ = 0.15(m̄ − 0.5) + 0.05(wind − 0.5)`` with the moisture offset m̄ ~ U(0, 1) and
    ``wind = clip((A − 5)/55 + N(0, 0.1²), 0, 1)``.

    Environment: moisture ``m̄ + Σ_{j=1..3} 0.04·sin(2πf_j·(x cos θ_j + y sin θ_j)/2 + ψ_j + ν_j k)`` (f_j ~ U[0.5, 1.5]
    cycles per box, random direction and phase, drift ν_j ~ U[−0.3, 0.3] rad per frame) at the 4 past frames,
    clipped to [0, 1]: its box mean is about m̄. Scalars per past frame: ``wind_k = clip(wind·e^{κ(k−3)}, 0, 1)``
    and the one-hot of its class among 4 equal bins of [0, 1]. NWP: the noiseless future rain (frames 4–7) at
    angles φ + δ, δ ~ U(−20°, 20°), Gaussian-blurred (σ = size/16 px) and ×U(0.7, 1.3).

    Args:
        n: number of samples.
        size: grid side S in pixels.
        seed: seed of the ``torch.Generator`` that draws everything.

    Returns:
        ``rain`` (n, 8, S, S) mm per 3 h; ``moisture`` (n, 4, S, S) in [0, 1]; ``scalars`` (n, 4, 5) (wind, one-hot
        class); ``nwp_rain`` (n, 4, S, S) mm per 3 h; and the per-sample ``(n,)`` parameters ``kappa``, ``m_bar``,
        ``wind``, ``A``, ``omega``, ``nwp_delta`` (rad) and ``nwp_bias``. All float32.

    Example:
        >>> data = spiral_cyclones(4, size=16, seed=0)
        >>> data["rain"].shape, data["scalars"].shape, bool((data["rain"] >= 0).all())
        (torch.Size([4, 8, 16, 16]), torch.Size([4, 4, 5]), True)
    """
    if n < 1 or size < 4:
        raise ValueError(f"spiral_cyclones needs n ≥ 1 and size ≥ 4 pixels, got n={n}, size={size}")
    g = torch.Generator().manual_seed(seed)
    two_pi = 2 * math.pi
    p = {"A": _u(g, 5, 60, n), "omega": _u(g, 0.1, 0.4, n), "phi_shear": _u(g, 0, two_pi, n), "a": _u(g, 0, 0.5, n),
         "r_e": _u(g, 0.2, 0.35, n), "w": _u(g, 0.06, 0.1, n), "r_b": _u(g, 0.3, 0.6, n, 2),
         "w_b": _u(g, 0.06, 0.12, n, 2), "phi_b": _u(g, 0, two_pi, n, 2), "beta": _u(g, 0.05, 0.12, n, 2)}  # fmt: skip
    m_bar = torch.rand(n, generator=g)
    wind = ((p["A"] - 5) / 55 + 0.1 * torch.randn(n, generator=g)).clamp(0, 1)
    p["kappa"] = 0.15 * (m_bar - 0.5) + 0.05 * (wind - 0.5)

    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1  # pixel centres in box half-widths
    y, x = torch.meshgrid(c, c, indexing="ij")
    r, phi = torch.hypot(x, y), torch.atan2(y, x)
    k = torch.arange(FRAMES, dtype=torch.float32)
    clean = _clean_rain(p, r, phi, k)
    noise = torch.randn(n, FRAMES, size, size, generator=g).mul_(0.05).add_(1)
    blobs = (n, FRAMES, 3)  # separable blobs: (n, 8, 3, S) profiles along y and x, multiplied by one einsum
    cy, cx, s, peak = _u(g, -1, 1, *blobs), _u(g, -1, 1, *blobs), _u(g, 0.05, 0.15, *blobs), _u(g, 0, 2, *blobs)
    gy = peak[..., None] * torch.exp(-((c - cy[..., None]) ** 2) / (2 * s[..., None] ** 2))
    gx = torch.exp(-((c - cx[..., None]) ** 2) / (2 * s[..., None] ** 2))
    rain = clean.mul_(noise).add_(torch.einsum("nkbi,nkbj->nkij", gy, gx)).clamp_min_(0)

    waves = (n, 3, 1, 1)  # (sample, wave, y, x)
    f, direction = _u(g, 0.5, 1.5, *waves), _u(g, 0, two_pi, *waves)
    psi, drift = _u(g, 0, two_pi, *waves), _u(g, -0.3, 0.3, *waves)
    t = torch.arange(PAST, dtype=torch.float32)
    # sin(a + b) = sin a cos b + cos a sin b, a spatial and b temporal: two small products, no (n, 3, 4, S, S) tensor
    a = (math.pi * f * (x * torch.cos(direction) + y * torch.sin(direction)) + psi).flatten(2)  # (n, 3, S²)
    b = (drift * t).flatten(2)  # (n, 3, 4)
    wave = torch.einsum("njs,njt->nts", a.sin(), b.cos()) + torch.einsum("njs,njt->nts", a.cos(), b.sin())
    moisture = (m_bar.view(-1, 1, 1) + 0.04 * wave).clamp(0, 1).view(n, PAST, size, size)

    wind_k = (wind[:, None] * torch.exp(p["kappa"][:, None] * (t - (PAST - 1)))).clamp(0, 1)
    category = F.one_hot((wind_k * 4).long().clamp_max(3), 4).float()
    scalars = torch.cat([wind_k[..., None], category], -1)

    delta = _u(g, -math.radians(20), math.radians(20), n).view(-1, 1, 1, 1)
    bias = _u(g, 0.7, 1.3, n)
    future = _clean_rain(p, r, phi + delta, k[PAST:])
    nwp_rain = _blur(future, size / 16).mul_(bias.view(-1, 1, 1, 1))
    return {"rain": rain, "moisture": moisture, "scalars": scalars, "nwp_rain": nwp_rain, "kappa": p["kappa"],
            "m_bar": m_bar, "wind": wind, "A": p["A"], "omega": p["omega"], "nwp_delta": delta.view(-1),
            "nwp_bias": bias}  # fmt: skip


def _split_groups(groups: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Sample indices of a seeded train/val/test split of the distinct ``groups`` (storm ids or sample numbers)."""
    ids, inverse = np.unique(groups, return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(ids))
    n_test, n_val = (max(1, round(f * len(ids))) for f in (test_fraction, val_fraction))
    if len(ids) - n_test - n_val < 1:
        raise ValueError(f"{len(ids)} storms or samples cannot give a train, a val and a test split ({n_val} val and "
                         f"{n_test} test). Add samples or lower val_fraction/test_fraction.")  # fmt: skip
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {name: np.flatnonzero(np.isin(inverse, part)) for name, part in parts.items()}


class CycloneDataModule(BatchedDataModule):
    """TC-centred rain nowcasting batches (TCP-Diffusion, card §2.1 and §6): 4 past frames and their environment and
    scalars, the NWP forecast of the 4 future frames, and the 4 future rain frames to predict.

    Batches are dicts: ``past_rain`` and ``future_rain`` (N, 4, S, S) in the rain's unit (mm per 3 h), *not*
    normalised (the model applies its own log transform); ``env`` (N, C_env, 4, S, S) of the past frames and ``nwp``
    (N, C_nwp, 4, S, S) of the future frames, each variable min-max scaled by its range, after ``log1p`` for the
    ``log_vars`` (their ranges are in log1p space); ``scalars`` (N, 4, D) of the past frames only (card §9:
    future-frame track and intensity would be leakage), scaled likewise; ``valid`` (N, 4, S, S) bool, where the future
    rain is a real value (all True for synthetic data). A variable's range is ``ranges[name]`` when given (the official
    code's fixed normalisation table), else the training split's min and max, so validation and test values outside
    it fall outside [0, 1] (nothing is clamped). Synthetic moisture and scalars have the fixed range [0, 1].

    ``source="synthetic"`` (default) generates :func:`spiral_cyclones` with seeds ``seed``, ``seed + 1`` and
    ``seed + 2`` for train, val and test; the variables are env ``["moisture"]``, nwp ``["nwp_rain"]`` and 5 scalars
    (wind, one-hot intensity class). ``"netcdf"`` and ``"zarr"`` read ``path`` in the layout of the module docstring,
    split by storm when the file has ``storm``, else by sample (``val_fraction``/``test_fraction`` of the storms or
    samples, at least one each, seeded).

    Args:
        source: ``"synthetic"``, ``"netcdf"`` (``xarray.open_dataset``) or ``"zarr"`` (``xarray.open_zarr``).
        path: the file or zarr store (file sources only).
        size: patch side S in pixels (the synthetic grid; for files, the patch size expected or resized to).
        n_train: synthetic training samples.
        n_val: synthetic validation samples.
        n_test: synthetic test samples.
        rain_var: the file's rain variable ``(sample, time, y, x)``.
        env_vars: the file's environment variables, read at the past times (None: none).
        nwp_vars: the file's NWP forecast variables, read at the future times (None: none).
        scalar_vars: the file's per-frame scalar variables ``(sample, time)``, read at the past times (None: none).
        log_vars: variables that get ``log1p`` before scaling; default the rain-like names ``"precipitation"``,
            ``"tp"``, ``"total_precipitation"`` and ``"nwp_rain"``. Use a unit where log1p makes sense (mm, not m).
        ranges: fixed ``[min, max]`` per variable name (log1p space for ``log_vars``); names not used are ignored.
        resize: resize file patches of another size to ``size`` × ``size`` (bilinear; rain as log1p, then expm1).
        nan: ``"raise"`` on NaNs in the frames read, or ``"zero"`` to set them to 0 and mark them in ``valid``.
        val_fraction: fraction of the file's storms (or samples) for validation, > 0.
        test_fraction: fraction of the file's storms (or samples) for testing, > 0.
        batch_size: samples per batch.
        seed: seed of the synthetic data and of the file split.
        num_workers: DataLoader workers.

    Attributes:
        env_vars: names of the ``env`` channels.
        nwp_vars: names of the ``nwp`` channels.
        scalar_vars: names of the ``scalars`` columns.
        num_scalars: D, the number of scalars per frame.
        ranges_: the ``[min, max]`` used for each env, NWP and scalar variable (after ``setup``).
        counts: samples per split (after ``setup``).
        indices_: the file's sample indices in each split (after ``setup``; empty for synthetic data).
        storms_: the storm ids in each split (after ``setup``; empty without a ``storm`` variable).

    Raises:
        ValueError: an argument out of its range, a missing or superfluous ``path``, file variables named for
            synthetic data, or an NWP variable that is also the rain or an env variable (its future frames would be
            fed to the model). ``setup`` raises the file errors of :func:`datamodules.cyclone_files.read_cyclone_file`.

    Example:
        >>> dm = CycloneDataModule(n_train=64, n_val=16, n_test=16, batch_size=8)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> list(batch)
        ['past_rain', 'future_rain', 'env', 'nwp', 'scalars', 'valid']
        >>> batch["future_rain"].shape, batch["env"].shape, batch["scalars"].shape
        (torch.Size([8, 4, 16, 16]), torch.Size([8, 1, 4, 16, 16]), torch.Size([8, 4, 5]))
    """

    def __init__(
        self,
        source: Literal["synthetic", "netcdf", "zarr"] = "synthetic",
        path: str | None = None,
        size: int = 16,
        n_train: int = 6000,
        n_val: int = 500,
        n_test: int = 500,
        rain_var: str = "precipitation",
        env_vars: list[str] | None = None,
        nwp_vars: list[str] | None = None,
        scalar_vars: list[str] | None = None,
        log_vars: list[str] | None = None,
        ranges: dict[str, list[float]] | None = None,
        resize: bool = False,
        nan: Literal["raise", "zero"] = "raise",
        val_fraction: float = 0.05,
        test_fraction: float = 0.1,
        batch_size: int = 32,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if source not in ("synthetic", "netcdf", "zarr"):
            raise ValueError(f"source must be 'synthetic', 'netcdf' or 'zarr', got {source!r}")
        if nan not in ("raise", "zero"):
            raise ValueError(f"nan must be 'raise' (stop at a NaN) or 'zero' (set NaNs to 0, mark them), got {nan!r}")
        if source == "synthetic" and path is not None:
            raise ValueError(f"path={path!r} is read only by source='netcdf' or 'zarr'; pass one, or drop path.")
        if source != "synthetic" and not path:
            raise ValueError(f"source={source!r} needs path, the file in the layout of datamodules.cyclone's docstring")
        given = {"env_vars": env_vars, "nwp_vars": nwp_vars, "scalar_vars": scalar_vars}
        if source == "synthetic" and any(v is not None for v in given.values()):
            raise ValueError(f"{[k for k, v in given.items() if v is not None]} name file variables; the synthetic "
                             "source has env ['moisture'], nwp ['nwp_rain'] and 5 scalars. Drop them, or pass "
                             "source='netcdf' or 'zarr' with path.")  # fmt: skip
        if size < 4 or min(n_train, n_val, n_test, batch_size) < 1 or num_workers < 0:
            raise ValueError(f"need size ≥ 4, n_train, n_val, n_test and batch_size ≥ 1 and num_workers ≥ 0, got "
                             f"size={size}, n_train={n_train}, n_val={n_val}, n_test={n_test}, "
                             f"batch_size={batch_size}, num_workers={num_workers}")  # fmt: skip
        if not (val_fraction > 0 and test_fraction > 0 and val_fraction + test_fraction < 1):
            raise ValueError(f"need val_fraction > 0, test_fraction > 0 and their sum < 1, got {val_fraction} and "
                             f"{test_fraction}")  # fmt: skip
        for name, r in (ranges or {}).items():
            if len(r) != 2 or not all(math.isfinite(v) for v in r) or not r[0] < r[1]:
                raise ValueError(f"ranges[{name!r}] must be [min, max] with finite min < max, got {r}")
        names = {k: list(v or []) for k, v in given.items()}
        for k, v in names.items():
            if len(set(v)) != len(v):
                raise ValueError(f"{k} names a variable twice: {v}")
        leak = sorted(set(names["nwp_vars"]) & {rain_var, *names["env_vars"]})
        if leak:
            raise ValueError(
                f"nwp_vars {leak} are also the rain or env variables: NWP fields are read at the future times, so "
                "the model would see the observed future. Name the NWP forecast variables."
            )
        self.save_hyperparameters()
        synthetic = source == "synthetic"
        self.env_vars = ["moisture"] if synthetic else names["env_vars"]
        self.nwp_vars = ["nwp_rain"] if synthetic else names["nwp_vars"]
        self.scalar_vars = list(SYNTHETIC_SCALARS) if synthetic else names["scalar_vars"]
        self.num_scalars = len(self.scalar_vars)
        self.log_vars = list(RAIN_LIKE if log_vars is None else log_vars)
        self.ranges_: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}
        self.indices_: dict[str, list[int]] = {}
        self.storms_: dict[str, list[Any]] = {}

    def _synthetic(self) -> dict[str, dict[str, Tensor]]:
        hp = self.hparams
        splits = {}
        for i, (name, n) in enumerate((("train", hp.n_train), ("val", hp.n_val), ("test", hp.n_test))):
            d = spiral_cyclones(n, hp.size, seed=hp.seed + i)
            nwp = torch.log1p(d["nwp_rain"]) if "nwp_rain" in self.log_vars else d["nwp_rain"]
            splits[name] = {"rain": d["rain"], "valid": torch.ones(n, PAST, hp.size, hp.size, dtype=torch.bool),
                            "env": d["moisture"][:, None], "nwp": nwp[:, None], "scalars": d["scalars"]}  # fmt: skip
        return splits

    def _files(self) -> dict[str, dict[str, Tensor]]:
        hp = self.hparams
        data = read_cyclone_file(hp.path, source=hp.source, rain_var=hp.rain_var, env_vars=self.env_vars,
                                 nwp_vars=self.nwp_vars, scalar_vars=self.scalar_vars, log_vars=self.log_vars,
                                 size=hp.size, resize=hp.resize, nan=hp.nan)  # fmt: skip
        storm = data.pop("storm")
        groups = storm if storm is not None else np.arange(len(data["rain"]))
        index = _split_groups(groups, hp.val_fraction, hp.test_fraction, hp.seed)
        self.indices_ = {name: idx.tolist() for name, idx in index.items()}
        if storm is not None:
            self.storms_ = {name: sorted(np.unique(storm[idx]).tolist()) for name, idx in index.items()}
        return {name: {k: v[torch.from_numpy(idx)] for k, v in data.items()} for name, idx in index.items()}

    def _fit_ranges(self, train: dict[str, Tensor]) -> dict[str, list[float]]:
        """The range of every variable: given, fixed (synthetic moisture and scalars), else the training min/max."""
        fixed = {name: [0.0, 1.0] for name in ["moisture", *SYNTHETIC_SCALARS]}
        ranges = dict(fixed) if self.hparams.source == "synthetic" else {}
        ranges.update(self.hparams.ranges or {})
        out = {}
        groups = (("env", self.env_vars, 1), ("nwp", self.nwp_vars, 1), ("scalars", self.scalar_vars, -1))
        for key, names, channels in groups:
            for name, v in zip(names, train[key].movedim(channels, 0), strict=True):
                out[name] = [float(r) for r in ranges[name]] if name in ranges else [float(v.min()), float(v.max())]
        return out

    def _scale(self, x: Tensor, names: list[str], channels: int) -> Tensor:
        shape = [1] * x.ndim
        shape[channels] = len(names)
        lo = torch.tensor([self.ranges_[n][0] for n in names], dtype=x.dtype).view(shape)
        hi = torch.tensor([self.ranges_[n][1] for n in names], dtype=x.dtype).view(shape)
        return (x - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi))  # a constant variable maps to 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = self._synthetic() if self.hparams.source == "synthetic" else self._files()
        self.ranges_ = self._fit_ranges(splits["train"])
        sets = {}
        for name, d in splits.items():
            served = {
                "past_rain": d["rain"][:, :PAST].contiguous(),
                "future_rain": d["rain"][:, PAST:].contiguous(),
                "env": self._scale(d["env"], self.env_vars, 1),
                "nwp": self._scale(d["nwp"], self.nwp_vars, 1),
                "scalars": self._scale(d["scalars"], self.scalar_vars, -1),
                "valid": d["valid"],
            }
            sets[name] = DictBatches(served)
            self.counts[name] = len(d["rain"])
        self.train_set, self.val_set, self.test_set = sets["train"], sets["val"], sets["test"]

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        frames = f"{hp.size}×{hp.size} px, 4 past + 4 future 3-hourly frames, rain in mm per 3 h"
        logged = [v for v in self.env_vars + self.nwp_vars if v in self.log_vars]
        variables = (f"env {self.env_vars}, nwp {self.nwp_vars} (log1p: {logged}), {self.num_scalars} scalars per past "
                     "frame, min-max scaled")  # fmt: skip
        if hp.source == "synthetic":
            return (f"synthetic spiral cyclones (card §6; seeds {hp.seed}/{hp.seed + 1}/{hp.seed + 2}), "
                    f"{hp.n_train}/{hp.n_val}/{hp.n_test} train/val/test samples, {frames}; {variables}")  # fmt: skip
        by = "storm" if self.storms_ else "sample" if self.counts else "storm if the file has 'storm', else sample"
        c = self.counts
        sizes = f" ({c['train']}/{c['val']}/{c['test']} train/val/test samples)" if c else ""
        return (f"{hp.path} ({hp.source}, rain {hp.rain_var!r}{', resized' if hp.resize else ''}, NaN: {hp.nan}), "
                f"split by {by}{sizes}, {hp.val_fraction:.0%} val, {hp.test_fraction:.0%} test (seed {hp.seed}), "
                f"{frames}; {variables}")  # fmt: skip
