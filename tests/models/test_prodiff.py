"""ProDiff: endpoint clamping, the guided ε̂, the prototype losses, K-means, scaling and bad input."""

from __future__ import annotations

import pytest
import torch

from zoo.models.prodiff import (
    EndpointDiffusion,
    GuidedUNet1D,
    IterativeKMeans,
    ProDiff,
    cluster_consistency_loss,
    linear_interpolation,
    match_prototypes,
    prototype_triplet_loss,
)

SMALL = dict(ch=16, groups=4, d_model=16, pce_layers=1, pce_heads=2, pce_ff=32, n_prototypes=4)


def _windows(b: int = 8, k: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([0.0, 35.68, 139.76], dtype=torch.float64).view(1, 3, 1)
    steps = (
        torch.rand(b, 3, k, generator=g, dtype=torch.float64) * torch.tensor([0.2, 0.01, 0.01]).view(1, 3, 1).double()
    )
    return base + steps.cumsum(-1)


@pytest.mark.parametrize("k", [3, 5, 6, 7, 10])
def test_unet_keeps_the_length_of_odd_and_even_windows(k):
    unet = GuidedUNet1D(ch=16, ch_mult=(1, 2, 2), groups=4)
    assert unet(torch.randn(2, 3, k), torch.tensor([1, 2]), torch.randn(2, 64)).shape == (2, 3, k)


def test_unet_rejects_groups_that_do_not_divide_the_widths():
    with pytest.raises(ValueError, match="groups"):
        GuidedUNet1D(ch=12, groups=8)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_endpoints_are_exact_in_scaled_space_and_within_1e4_degrees_raw(sampler):
    diffusion = EndpointDiffusion(20, beta_end=0.5)
    x0 = torch.rand(4, 3, 6)
    out = diffusion.sample(lambda x, t: torch.randn_like(x), x0, sampler=sampler, steps=5, eta=0.2)
    assert torch.equal(out[..., [0, -1]], x0[..., [0, -1]])
    model = ProDiff(**SMALL)
    raw = _windows()
    model.data_min.copy_(raw.amin((0, 2)) - 0.01)
    model.data_max.copy_(raw.amax((0, 2)) + 0.01)
    scaled, bounds = model.scale(raw)
    back = model.unscale(scaled, bounds)
    assert (back - raw)[:, 1:].abs().max() < 1e-4  # the float32 round trip the card's review measured
    pred = model.impute(raw, sampler=sampler, steps=3)
    assert torch.equal(pred[..., [0, -1]], raw[..., [0, -1]])  # copied in after the inverse transform


def test_q_sample_keeps_clean_endpoints_and_noises_the_interior():
    diffusion = EndpointDiffusion(100)
    x0 = torch.rand(3, 3, 6)
    xt = diffusion.q_sample(x0, torch.tensor([99, 99, 99]), torch.randn(3, 3, 6))
    assert torch.equal(xt[..., [0, -1]], x0[..., [0, -1]])
    assert diffusion.alphas_cumprod[-1] < 1e-4  # T·mean(β) ≈ 12.5: pure noise at T
    assert (xt[..., 1:-1] - x0[..., 1:-1]).abs().mean() > 0.3


def test_guided_eps_is_the_official_linear_combination():
    model = ProDiff(**SMALL, guidance=2.0).eval()
    x, t, ends = torch.randn(2, 3, 6), torch.tensor([3, 7]), torch.rand(2, 3, 6)
    matched = torch.randn(2, 16)
    e_c = model.unet(x, t, model.joint(ends[..., 0], ends[..., -1], matched))
    zero = torch.zeros(2, 3)
    e_u = model.unet(x, t, model.place(zero, zero, torch.zeros_like(matched)))
    torch.testing.assert_close(model.eps(x, t, ends, matched), 3 * e_c - 2 * e_u, atol=1e-5, rtol=1e-5)


def test_diff_mask_ablation_has_no_prototype_path():
    model = ProDiff(**SMALL, prototypes=False)
    assert model.pce is None and model.joint.prototype is None
    assert set(model.losses(_windows())) == {"diffusion", "loss"}
    assert set(ProDiff(**SMALL).losses(_windows())) == {"diffusion", "cluster_ce", "triplet", "loss"}


def test_matching_softmax_is_near_uniform_at_the_official_temperature():
    P = torch.randn(8, 64)
    q = P[:1] * 5
    w_default = match_prototypes(q, P)
    sharp = match_prototypes(q, P, temperature=0.01)
    assert (w_default - P.mean(0)).norm() < (sharp - P.mean(0)).norm()
    torch.testing.assert_close(sharp, P[:1], atol=1e-3, rtol=1e-3)


def test_kmeans_warm_starts_from_memory_and_resets():
    km = IterativeKMeans(2, memory=1)
    g = torch.Generator().manual_seed(0)
    a = torch.cat([torch.randn(20, 2, generator=g) * 0.1, torch.randn(20, 2, generator=g) * 0.1 + 5])
    labels = km.update(a, generator=g)
    assert len(set(labels[:20].tolist())) == 1 and labels[0] != labels[-1]
    centers = km.centers.clone()
    km.update(a + 0.01)
    assert (km.centers - centers).abs().max() < 0.05 and len(km._bank) == 1
    km.reset()
    assert km.centers is None
    with pytest.raises(ValueError, match="at least 2"):
        km.update(a[:1])


def test_matched_labels_relabel_clusters_to_their_nearest_prototypes():
    P = torch.eye(2) * 3
    f = torch.tensor([[3.0, 0.0], [0.0, 3.0]])
    swapped = torch.tensor([1, 0])  # K-means ids opposite to the prototypes' order
    centers = torch.tensor([[0.0, 3.0], [3.0, 0.0]])
    assert cluster_consistency_loss(f, P, swapped, centers) < cluster_consistency_loss(f, P, swapped)


def test_triplet_loss_pulls_features_to_their_nearest_prototype():
    P = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    assert float(prototype_triplet_loss(torch.tensor([[0.4, 0.0]]), P)) == pytest.approx(0.8)


def test_training_lowers_the_loss_by_30_percent():
    torch.manual_seed(0)
    model = ProDiff(**SMALL)
    raw = _windows(64)
    model.data_min.copy_(raw.amin((0, 2)))
    model.data_max.copy_(raw.amax((0, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = model.losses(raw)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-6:]) / 6 < 0.7 * sum(losses[:6]) / 6


def test_per_batch_scaler_fits_on_the_batch_and_global_ignores_the_interior():
    raw = _windows()
    per_batch = ProDiff(**SMALL, scaler="per_batch")
    scaled, _ = per_batch.scale(raw)
    assert scaled.min() == -1 and scaled.max() == 1  # centred (the default); [0, 1] with centered=False
    model = ProDiff(**SMALL).eval()
    model.data_min.copy_(raw.amin((0, 2)))
    model.data_max.copy_(raw.amax((0, 2)))
    moved = raw.clone()
    moved[..., 1:-1] += 0.5  # the hidden interior must not change a global-scaler imputation
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(model.impute(raw, steps=2, generator=g1), model.impute(moved, steps=2, generator=g2))


def test_bad_input_gives_clear_errors():
    model = ProDiff(**SMALL)
    with pytest.raises(ValueError, match=r"\[B, 3, 6\]"):
        model.impute(torch.zeros(2, 2, 6))
    bad = _windows()
    bad[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model.impute(bad)
    bad = _windows()
    bad[0, 1, -1] = 95.0
    with pytest.raises(ValueError, match="latitudes"):
        model.impute(bad)
    with pytest.raises(ValueError, match="k >= 3"):
        ProDiff(k=2)
    with pytest.raises(ValueError, match="scaler"):
        ProDiff(scaler="batch")
    with pytest.raises(ValueError, match="sampler"):
        EndpointDiffusion(10).sample(lambda x, t: x, torch.zeros(1, 3, 4), sampler="euler")


def test_linear_interpolation_is_exact_on_straight_paths():
    raw = _windows(2)
    line = linear_interpolation(raw)
    torch.testing.assert_close(linear_interpolation(line), line)


def test_save_and_load_keep_the_scaler(tmp_path):
    model = ProDiff(**SMALL)
    model.data_min.copy_(torch.tensor([0.0, 35.0, 139.0]))
    model.data_max.copy_(torch.tensor([5.0, 36.0, 140.0]))
    from zoo.hub import write_entry

    write_entry(model, tmp_path / "entry", zoo_meta={}, card_text="test")
    loaded = ProDiff.from_pretrained(tmp_path / "entry")
    assert torch.equal(loaded.data_min, model.data_min) and torch.equal(loaded.data_max, model.data_max)


@pytest.mark.parametrize("centered", [False, True])
def test_scale_and_unscale_round_trip_in_either_range(centered):
    model = ProDiff(**SMALL, centered=centered)
    raw = _windows()
    model.data_min.copy_(raw.amin((0, 2)))
    model.data_max.copy_(raw.amax((0, 2)))
    scaled, bounds = model.scale(raw)
    assert float(scaled.min()) == pytest.approx(-1.0 if centered else 0.0, abs=1e-6)
    assert float(scaled.max()) == pytest.approx(1.0, abs=1e-6)
    assert (model.unscale(scaled, bounds) - raw)[:, 1:].abs().max() < 1e-4
    outside = model.unscale(scaled + 5, bounds)  # clamped to the scaler's range, as the official code
    assert torch.allclose(outside, bounds[1].expand_as(outside))


def test_prototype_lookup_adds_its_prototypes_mean_training_offset():
    from zoo.models.prodiff.baselines import PrototypeLookup

    model = ProDiff(**SMALL).eval()
    train = _windows(64, seed=1)
    model.data_min.copy_(train.amin((0, 2)))
    model.data_max.copy_(train.amax((0, 2)))
    lookup = PrototypeLookup(model, train)
    assert int(lookup.counts.sum()) == 64
    test = _windows(5, seed=2)
    labels, _ = lookup._match(test)
    out = lookup(test)
    assert torch.equal(out[..., [0, -1]], test[..., [0, -1]])
    scaled, bounds = model.scale(test)
    expected = model.unscale(linear_interpolation(scaled) + lookup.offsets[labels].float(), bounds)
    assert torch.allclose(out[..., 1:-1], expected[..., 1:-1])
    with pytest.raises(ValueError, match="prototype path"):
        PrototypeLookup(ProDiff(**SMALL, prototypes=False), train)


def test_reproduction_scores_and_on_street_rate():
    from zoo.datamodules.street_grid import km_to_latlon
    from zoo.models.prodiff.reproduce import on_street_rate, scores

    # Points on the x = 3 km street, and the same points moved 0.5 km off every street.
    y = torch.linspace(2.2, 2.8, 6).double()
    lat, lon = km_to_latlon(torch.full((6,), 3.0).numpy(), y.numpy())
    on = torch.stack([torch.arange(6.0).double(), torch.as_tensor(lat), torch.as_tensor(lon)])[None]
    lat, lon = km_to_latlon(torch.full((6,), 3.5).numpy(), y.numpy())
    off = torch.stack([torch.arange(6.0).double(), torch.as_tensor(lat), torch.as_tensor(lon)])[None]
    assert on_street_rate(on) == 1.0 and on_street_rate(off) == 0.0
    s = scores(on, on)
    assert s["tc@500m"] == 1.0 and s["mae_m"] == 0.0 and s["endpoint_error_deg"] == 0.0


def test_reproduction_claims_reject_their_stand_ins():
    """Check on made-up results that each claim fails for every stand-in in its place, and that a method no better
    than linear interpolation fails the asserted ones."""
    from zoo.claims import evaluate
    from zoo.models.prodiff.reproduce import CLAIMS

    r = {f"{arm}/tc@500m": v for arm, v in
         {"prodiff": 0.66, "diff_mask": 0.63, "linear": 0.56, "prototype_lookup": 0.56, "untrained": 0.0}.items()}  # fmt: skip
    out = evaluate(r, CLAIMS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins)
    r["prodiff/tc@500m"] = r["diff_mask/tc@500m"] = 0.58
    out = evaluate(r, CLAIMS)
    assert all(out[f"{c.prefix}/{c.name}"] == 0.0 for c in CLAIMS)
    assert [c.name for c in CLAIMS if not c.asserted] == ["prodiff_prototypes_help_tc500_by_0.01"]


def test_foursquare_style_csv_trains_through_the_conf_and_imputes(tmp_path):
    """The real path on a tiny file: a FourSquare-style CSV (its column names, its timestamp format) through
    ``conf/prodiff.yaml`` with k = 8, a few training steps, then imputation with exact endpoints."""
    from datetime import datetime, timedelta, timezone

    from zoo.datamodules.street_grid import street_grid_checkins
    from zoo.lightning_cli import ZooCLI
    from zoo.registry import conf_path

    start = datetime(2012, 4, 3, tzinfo=timezone.utc)
    lines = ["userId,venueId,utcTimestamp,latitude,longitude"] + [
        f"{u},v,{(start + timedelta(hours=float(h))).strftime('%a %b %d %H:%M:%S +0000 %Y')},{la:.6f},{lo:.6f}"
        for u, t in street_grid_checkins(20, seed=3).items()
        for h, la, lo in zip(t["hours"], t["latitudes"], t["longitudes"])
    ]
    (tmp_path / "tky.csv").write_text("\n".join(lines) + "\n")
    small = [f"--model.init_args.{k}={v}" for k, v in SMALL.items()]
    cli = ZooCLI(
        args=["-c", str(conf_path("prodiff")), "--data.init_args.path", str(tmp_path / "tky.csv"),
              "--data.init_args.csv_columns", "[userId, utcTimestamp, latitude, longitude]",
              "--data.init_args.k", "8", "--model.init_args.k", "8", *small, "--trainer.max_steps", "3",
              "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "[]",
              "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
              "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 3
    assert torch.allclose(cli.model.data_min, torch.as_tensor(cli.datamodule.scaler.min).flatten().double())
    raw = cli.datamodule.test_set.tensors[-1][:4]
    out = cli.model.eval().impute(raw, steps=2)
    assert out.shape == (4, 3, 8) and torch.equal(out[..., [0, -1]], raw[..., [0, -1]])
