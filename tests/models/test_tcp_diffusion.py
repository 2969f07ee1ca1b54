"""TCP-Diffusion: the adjacent residual target, the encoders, the forecaster's loss and sampler, the Lightning module's
evaluation and bad-input errors, and the real path (a netCDF file through the conf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.models.tcp_diffusion import (
    AdjacentResidualTarget,
    FieldStackEncoder,
    ScalarSequenceEncoder,
    TCPDiffusion,
    TCPForecaster,
    ensemble_mean,
    persistence,
)
from zoo.nn.residual_target import OFFICIAL

TINY = {"block_out_channels": (8, 16, 16), "norm_num_groups": 8}


def _batch(n: int = 3, size: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "past_rain": torch.rand(n, 4, size, size, generator=g) * 30,
        "future_rain": torch.rand(n, 4, size, size, generator=g) * 30,
        "env": torch.rand(n, 1, 4, size, size, generator=g),
        "nwp": torch.rand(n, 1, 4, size, size, generator=g),
        "scalars": torch.rand(n, 4, 5, generator=g),
        "valid": torch.ones(n, 4, size, size, dtype=torch.bool),
    }


# -- adjacent residual prediction -------------------------------------------------------------------------------------
def test_residual_target_round_trips_to_the_rain() -> None:
    """Check that decode(encode(R)) gives R back (card §6: to 1e-5 in log space) in both modes."""
    b = _batch()
    for mode in ("residual", "absolute"):
        arp = AdjacentResidualTarget(mode, **AdjacentResidualTarget.fit(torch.cat([b["past_rain"], b["future_rain"]], 1)))
        _, x0 = arp.encode(b["past_rain"], b["future_rain"])
        assert x0.abs().max() <= 1
        back = arp.decode(b["past_rain"], x0)
        torch.testing.assert_close(torch.log1p(back), torch.log1p(b["future_rain"]), atol=1e-5, rtol=0)


def test_residuals_are_adjacent_log_changes_from_the_last_observed_frame() -> None:
    """Check Δ_k = log(1 + R_k) − log(1 + R_{k−1}), the first past residual 0 and the first future one taken from
    the last past frame, and that "no change" is about +0.0056 in model space with the official constants."""
    arp = AdjacentResidualTarget()
    log_max, lo, hi = OFFICIAL["log_max"], OFFICIAL["diff_min"], OFFICIAL["diff_max"]
    past = torch.tensor([1.0, 3.0, 7.0, 7.0]).view(1, 4, 1, 1)
    future = torch.tensor([15.0, 3.0, 3.0, 0.0]).view(1, 4, 1, 1)
    history, x0 = arp.encode(past, future)
    delta = (x0 + 1) / 2 * (hi - lo) + lo
    expected = torch.log1p(torch.tensor([15.0, 3.0, 3.0, 0.0])) - torch.log1p(torch.tensor([7.0, 15.0, 3.0, 3.0]))
    torch.testing.assert_close(delta.flatten(), expected, rtol=0, atol=1e-6)
    past_delta = (history[0, :4, 0, 0] + 1) / 2 * (hi - lo) + lo
    assert past_delta[0] == pytest.approx(0.0, abs=1e-6) and past_delta[3] == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(history[0, 4:, 0, 0], 2 * torch.log1p(past.flatten()) / log_max - 1)
    assert float(x0[0, 2]) == pytest.approx(0.0056, abs=1e-4)  # card §9: no change is not 0 in model space


def test_residual_target_fit_covers_the_data_and_rejects_bad_input() -> None:
    rain = torch.rand(5, 8, 4, 4) * 100
    c = AdjacentResidualTarget.fit(rain)
    diff = torch.log1p(rain.double()).diff(dim=1)
    assert c["diff_min"] < float(diff.min()) and c["diff_max"] > float(diff.max())
    assert c["log_max"] > float(torch.log1p(rain.double()).max())
    with pytest.raises(ValueError, match="mode must be"):
        AdjacentResidualTarget("delta")
    with pytest.raises(ValueError, match=r"\(N, T >= 2, H, W\)"):
        AdjacentResidualTarget.fit(torch.rand(5, 1, 4, 4))


# -- encoders and the forecaster ----------------------------------------------------------------------------------------
def test_encoders_map_modalities_to_embedding_vectors() -> None:
    assert ScalarSequenceEncoder(5, 32, width=16)(torch.rand(2, 4, 5)).shape == (2, 32)
    assert FieldStackEncoder(4, 32, arch="resnet18")(torch.rand(2, 1, 4, 16, 16)).shape == (2, 32)
    with pytest.raises(ValueError, match=r"\(N, T, 5\)"):
        ScalarSequenceEncoder(5, 32)(torch.rand(2, 4, 6))
    with pytest.raises(ValueError, match="C·T = 4"):
        FieldStackEncoder(4, 32)(torch.rand(2, 2, 4, 16, 16))


def test_scalar_encoder_reads_the_last_frame_in_context() -> None:
    """Check that the output depends on earlier frames (attention over the sequence), not only on the last one."""
    torch.manual_seed(0)
    enc = ScalarSequenceEncoder(3, 8, width=16).eval()
    x = torch.rand(1, 4, 3)
    y = x.clone()
    y[0, 0] += 1.0
    assert not torch.allclose(enc(x), enc(y))


def test_forecaster_loss_averages_over_valid_pixels_only() -> None:
    """Check that the loss is the mean over valid pixels: no valid pixel gives 0, all valid equals no mask, and
    half valid is the mean over that half."""
    torch.manual_seed(0)
    f = TCPForecaster(**TINY)
    b = _batch()
    full = f.loss({k: v for k, v in b.items() if k != "valid"}, torch.Generator().manual_seed(1))
    torch.testing.assert_close(f.loss(b, torch.Generator().manual_seed(1)), full)
    assert float(f.loss(b | {"valid": torch.zeros_like(b["valid"])}, torch.Generator().manual_seed(1))) == 0.0
    top, bottom = torch.zeros_like(b["valid"]), torch.zeros_like(b["valid"])
    top[..., :8, :], bottom[..., 8:, :] = True, True
    halves = [f.loss(b | {"valid": m}, torch.Generator().manual_seed(1)) for m in (top, bottom)]
    torch.testing.assert_close((halves[0] + halves[1]) / 2, full)


def test_forecaster_samples_an_ensemble_reproducibly_and_with_spread() -> None:
    torch.manual_seed(0)
    f = TCPForecaster(env_channels=1, nwp_channels=1, num_scalars=5, **TINY).eval()
    b = _batch()
    a = f.sample(b, members=3, steps=3, generator=torch.Generator().manual_seed(0))
    again = f.sample(b, members=3, steps=3, generator=torch.Generator().manual_seed(0))
    assert a.shape == (3, 3, 4, 16, 16) and (a >= 0).all()
    torch.testing.assert_close(a, again)
    assert (a[:, 0] - a[:, 1]).abs().mean() > 0  # members differ
    ddpm = f.sample(b, members=1, sampler="ddpm", generator=torch.Generator().manual_seed(0))
    assert ddpm.shape == (3, 1, 4, 16, 16) and torch.isfinite(ddpm).all()


def test_deterministic_baseline_regresses_x0_at_t_zero() -> None:
    """Check that the U-Net baseline is one member, identical across generators (no noise anywhere)."""
    torch.manual_seed(0)
    f = TCPForecaster(target="absolute", deterministic=True, **TINY).eval()
    b = _batch()
    one = f.sample(b, members=1, generator=torch.Generator().manual_seed(0))
    two = f.sample(b, members=1, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(one, two)


def test_forecaster_names_the_missing_modality_and_the_wrong_shape() -> None:
    f = TCPForecaster(env_channels=1, nwp_channels=1, num_scalars=5, **TINY)
    b = _batch()
    with pytest.raises(KeyError, match="'nwp'"):
        f.loss({k: v for k, v in b.items() if k != "nwp"})
    with pytest.raises(ValueError, match=r"batch\['past_rain'\] of shape \(3, 4, 16, 16\), got \(3, 4, 20, 20\)"):
        f.loss(_batch(size=20))


def test_ensemble_mean_and_persistence() -> None:
    ens = torch.tensor([0.0, 3.0]).view(1, 2, 1, 1, 1)
    assert float(ensemble_mean(ens)) == 1.5 and float(ensemble_mean(ens, "log")) == pytest.approx(1.0)
    past = torch.arange(4.0).view(1, 4, 1, 1)
    assert persistence(past, 3).flatten().tolist() == [3.0, 3.0, 3.0]


# -- the Lightning module -----------------------------------------------------------------------------------------------
def test_module_fits_its_target_constants_and_logs_the_card_metrics(tmp_path: Path) -> None:
    from lightning import Trainer

    from zoo.datamodules.cyclone import CycloneDataModule

    dm = CycloneDataModule(n_train=64, n_val=8, n_test=8, batch_size=16)
    model = TCPDiffusion(block_out_channels=[8, 16, 16], members=2, sample_steps=2)
    before = model.forecaster.target.constants.clone()
    trainer = Trainer(max_steps=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, dm)
    assert not torch.equal(before, model.forecaster.target.constants)  # fitted on the training split
    metrics = trainer.test(model, dm, verbose=False)[0]
    for key in ("test/mae", "test/mae_3h", "test/mae_12h", "test/trend_mae", "test/crps", "test/ets@58.7"):
        assert key in metrics and np.isfinite(metrics[key]), key
    with pytest.raises(ValueError, match="members must be >= 1"):
        TCPDiffusion(members=0)


def test_netcdf_file_trains_through_the_conf(tmp_path: Path) -> None:
    """The real path a user takes: a cyclone-centred netCDF file in the documented layout (ERA5-like environment
    fields, an NWP precipitation field, a scalar, storm ids; 24 x 24 patches resized to 16) through
    ``conf/tcp-diffusion.yaml`` with the official ResNet-18 NWP encoder, a few steps, then ``test``."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    from zoo.hub import conf_path
    from zoo.lightning_cli import ZooCLI

    rng = np.random.default_rng(0)
    dims, shape = ("sample", "time", "y", "x"), (16, 8, 24, 24)
    xr.Dataset({
        "precipitation": (dims, rng.gamma(0.5, 4.0, shape).astype(np.float32)),
        "t850": (dims, (280 + 10 * rng.random(shape)).astype(np.float32)),
        "q850": (dims, (0.02 * rng.random(shape)).astype(np.float32)),
        "tp": (dims, rng.gamma(0.5, 3.0, shape).astype(np.float32)),
        "wind": (("sample", "time"), (20 + 30 * rng.random(shape[:2])).astype(np.float32)),
        "storm": (("sample",), np.array([f"TC{i // 4}" for i in range(16)])),
    }).to_netcdf(tmp_path / "tc.nc", engine="h5netcdf")  # fmt: skip
    cli = ZooCLI(
        args=["-c", str(conf_path("tcp-diffusion")), "--data.init_args.source", "netcdf",
              "--data.init_args.path", str(tmp_path / "tc.nc"), "--data.init_args.resize", "true",
              "--data.init_args.env_vars", "[t850, q850]", "--data.init_args.nwp_vars", "[tp]",
              "--data.init_args.scalar_vars", "[wind]", "--data.init_args.val_fraction", "0.25",
              "--data.init_args.test_fraction", "0.25", "--data.init_args.batch_size", "4",
              "--model.init_args.env_channels", "2", "--model.init_args.num_scalars", "1",
              "--model.init_args.nwp_arch", "resnet18", "--model.init_args.thresholds", "[6, 24, 60]",
              "--model.init_args.members", "2", "--model.init_args.sample_steps", "2",
              "--trainer.max_steps", "2", "--trainer.val_check_interval", "1", "--trainer.limit_val_batches", "1",
              "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "[]",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0]
    assert {"test/mae_12h", "test/ets@60", "test/crps"} <= set(metrics)
    assert all(np.isfinite(v) for v in metrics.values())


def test_reproduction_claims_reject_their_stand_ins() -> None:
    """Check on made-up results shaped like seed 0 of the calibration that each claim fails for every stand-in in its
    place, that a forecast no better than the NWP channel fails the asserted ones, and which claims are reported."""
    from zoo.claims import evaluate
    from zoo.models.tcp_diffusion.reproduce import ARMS, CLAIMS, QUICK_ARMS, _needs

    values = {  # mae_3h, mae_12h, mae, trend_mae, ets_p99
        "arp_mm": (1.4, 3.3, 2.5, 1.5, 0.49), "arp": (1.5, 3.4, 2.6, 1.4, 0.41), "abs": (1.4, 3.9, 2.1, 1.6, 0.55),
        "unet": (1.2, 1.8, 1.4, 1.2, 0.40), "persistence": (1.8, 6.1, 4.0, 1.9, 0.35), "nwp": (4.3, 4.5, 4.4, 2.2, 0.21),
    }  # fmt: skip
    r = {f"{arm}/{k}": v for arm, row in values.items() for k, v in zip(("mae_3h", "mae_12h", "mae", "trend_mae",
                                                                             "ets_p99"), row)}  # fmt: skip
    out = evaluate(r, CLAIMS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0, claim.name
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins), claim.name
        assert _needs(claim) <= set(ARMS)
    asserted = [c for c in CLAIMS if c.asserted]
    assert all(_needs(c) <= set(QUICK_ARMS) for c in asserted)  # the quick run asserts every asserted claim
    for key in ("mae_12h", "mae", "ets_p99"):  # a forecast no better than the NWP channel
        r[f"arp_mm/{key}"] = r[f"nwp/{key}"]
    out = evaluate(r, asserted)
    assert all(out[f"claims/{c.name}"] == 0.0 for c in asserted)
