"""Tests of TSMDiffusion (TimeStep Master): the three modes and what each trains, the phases and the optimiser they
build, per-sample timesteps inside the phase's range, base weights loaded into adapted UNets, the seeded grid MSE and
its buckets, DDIM sampling, the EMA copy (also with timestep experts), and starting from the hub's source UNet."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from lightning import Trainer
from torch import Tensor

import zoo
from zoo.datamodules.domains import DomainShiftDataModule
from zoo.models.tsm import TSMDiffusion, eval_grid
from zoo.nn.timestep_experts import _TimestepExperts


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run this file's tiny UNets on one thread: on a busy 2-core machine OpenMP's waits cost seconds a test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tsm(mode: str = "tsm", seed: int = 0, **kwargs) -> TSMDiffusion:
    torch.manual_seed(seed)
    return TSMDiffusion(mode=mode, **kwargs)


def images(n: int = 4, seed: int = 0) -> Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)


def trainable(model: TSMDiffusion) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def optimised(model: TSMDiffusion) -> tuple[torch.optim.Optimizer, set[int]]:
    optimizer = model.configure_optimizers()
    return optimizer, {id(p) for group in optimizer.param_groups for p in group["params"]}


def randomise_adapters(model: TSMDiffusion, seed: int = 1, std: float = 0.05) -> None:
    """Give every LoRA B (peft LoRA or timestep experts) non-zero values, so that the adapters act."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.unet.named_parameters():
            if "lora_B" in name:
                p.copy_(std * torch.randn(p.shape, generator=g))


def no_log(model: TSMDiffusion, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a Trainer ``self.log`` has nowhere to go: make it a no-op."""
    monkeypatch.setattr(model, "log", lambda *args, **kwargs: None)


def train_steps(model: TSMDiffusion, steps: int, batch: Tensor) -> list[dict[str, Tensor]]:
    """Run ``steps`` optimiser steps by hand (with the EMA update); returns the live UNet's weights after each."""
    optimizer = model.configure_optimizers()
    model.train()
    states = []
    for step in range(steps):
        loss = model.training_step((batch, torch.zeros(len(batch))), step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.on_train_batch_end(loss, batch, step)
        states.append({k: v.detach().clone() for k, v in model.unet.named_parameters()})
    return states


def quiet_trainer(**kwargs) -> Trainer:
    return Trainer(
        **{
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            **kwargs,
        }
    )


# ------------------------------------------------------------------------------------------------ construction
def test_bad_mode_is_refused() -> None:
    """Check that an unknown mode raises a ValueError naming the modes."""
    with pytest.raises(ValueError, match=r"mode must be 'pretrain', 'lora', .*'tsm', got 'tsm_foster'"):
        TSMDiffusion(mode="tsm_foster")


def test_forward_checks_the_image_shape_and_the_timesteps() -> None:
    """Check that forward refuses images of the wrong shape and timesteps outside [0, T), and accepts the rest."""
    model = tsm("pretrain").eval()
    x = images(2)
    with torch.no_grad():
        assert model(x).shape == (2, 1, 8, 8)  # default t = T/2
        assert model((x, torch.zeros(2)), torch.tensor([0, 999])).shape == (2, 1, 8, 8)  # a batch tuple, t at the ends
        assert torch.equal(model(x, 500), model(x, torch.tensor([500, 500])))  # a scalar t is broadcast
        for bad in (torch.randn(2, 1, 8, 7), torch.randn(2, 3, 8, 8), torch.randn(1, 8, 8)):
            with pytest.raises(ValueError, match=r"expected images \(B, 1, 8, 8\)"):
                model(bad)
        for t in (torch.tensor([-1, 5]), torch.tensor([5, 1000]), 1000):
            with pytest.raises(ValueError, match=r"timesteps must lie in \[0, 1000\)"):
                model(x, t)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_images_are_refused_with_one_line(bad: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that NaN / inf in the noisy images (forward), the clean images (loss, training_step, validation and test
    steps) or the noise (loss) raise a one-line ValueError naming what holds them."""
    model = tsm("pretrain").eval()
    no_log(model, monkeypatch)
    x = images(2)
    x[1, 0, 3, 4] = bad
    t, clean = torch.tensor([10, 900]), images(2)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^images x contain NaN or inf$"):
            model(x, t)
        for call in (
            lambda: model.loss(x, t, torch.randn_like(x)),
            lambda: model.training_step((x, torch.zeros(2)), 0),
            lambda: model.validation_step((x, torch.zeros(2)), 0),
            lambda: model.test_step((x, torch.zeros(2)), 0),
        ):
            with pytest.raises(ValueError, match=r"^clean images x0 contain NaN or inf$"):
                call()
        with pytest.raises(ValueError, match=r"^noise contains NaN or inf$"):
            model.loss(clean, t, x)


def test_a_timestep_count_other_than_one_or_the_batch_is_refused() -> None:
    """Check that 3 timesteps for 2 images raise a ValueError naming both counts (not torch's expand / broadcast
    error), in forward and in loss."""
    model = tsm("pretrain").eval()
    x, t = images(2), torch.tensor([10, 500, 900])
    with torch.no_grad():
        with pytest.raises(ValueError, match="got 3 timesteps for a batch of 2 images"):
            model(x, t)
        with pytest.raises(ValueError, match="got 3 timesteps for a batch of 2 images"):
            model.loss(x, t, torch.randn_like(x))
        assert model.loss(x, torch.tensor([500]), torch.randn_like(x)).shape == (2,)  # one t: broadcast


def test_clean_images_outside_minus_one_one_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that 0..255 pixels (float or uint8) are refused where x0 are clean images (loss, training_step,
    validation / test steps) with how to rescale, that a rounding overshoot of 1e-4 passes, and that forward (whose
    input is a noisy image) accepts values beyond [-1, 1]."""
    model = tsm("pretrain").eval()
    no_log(model, monkeypatch)
    pixels = (images(2) + 1) * 127.5
    t = torch.tensor([10, 900])
    with torch.no_grad():
        for call in (
            lambda: model.loss(pixels, t, torch.randn_like(pixels)),
            lambda: model.training_step((pixels, torch.zeros(2)), 0),
            lambda: model.validation_step((pixels, torch.zeros(2)), 0),
            lambda: model.test_step((pixels, torch.zeros(2)), 0),
        ):
            with pytest.raises(ValueError, match=r"must lie in \[-1, 1\], got 0…255: rescale .* x0 / 127\.5 - 1"):
                call()
        with pytest.raises(ValueError, match=r"must be floating point in \[-1, 1\], got torch\.uint8"):
            model.training_step((pixels.round().to(torch.uint8), torch.zeros(2)), 0)
        assert model.loss(images(2).clamp(-1, 1) * 1.0001, t, torch.randn(2, 1, 8, 8)).shape == (2,)
        assert model(3 * images(2), t).shape == (2, 1, 8, 8)


def test_pretrain_trains_every_unet_weight() -> None:
    """Check that mode "pretrain" trains (and optimises, at lr) every UNet weight and nothing is adapted."""
    model = tsm("pretrain", lr=2e-3)
    names = {name for name, _ in model.unet.named_parameters()}
    assert set(trainable(model)) == {f"unet.{name}" for name in names}
    assert not any("lora" in name for name in names) and model.experts == {}
    optimizer, ids = optimised(model)
    assert ids == {id(p) for p in model.unet.parameters()}
    assert [group["lr"] for group in optimizer.param_groups] == [2e-3]


def test_lora_trains_only_peft_lora_weights_and_starts_at_the_base() -> None:
    """Check that mode "lora" trains only peft's lora_A / lora_B (the optimiser too) and, with B = 0, gives exactly
    the output of the plain UNet with the same base weights."""
    model, plain = tsm("lora"), tsm("pretrain")  # same seed: the same UNet before peft is injected
    names = set(trainable(model))
    assert names and all("lora_" in name for name in names)
    assert any("lora_A" in name for name in names) and any("lora_B" in name for name in names)
    assert any("conv1" in name for name in names) and any("to_q" in name for name in names)
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not any("lora_" in name for name in frozen)
    _, ids = optimised(model)
    assert ids == {id(p) for p in trainable(model).values()}
    x, t = images(3), torch.tensor([0, 500, 999])
    with torch.no_grad():
        assert torch.equal(model.eval()(x, t), plain.eval()(x, t))
        randomise_adapters(model)
        assert not torch.allclose(model(x, t), plain(x, t))  # the LoRA does act once B is non-zero


@pytest.mark.parametrize("scale", [0, 1, 2])
def test_foster_phase_trains_exactly_one_scale(scale: int) -> None:
    """Check that set_phase("foster", scale=j, t_range) makes exactly scale j's expert tensors trainable (no router, no
    base weight), sets the timestep range, and that the optimiser holds exactly those tensors at lr."""
    model = tsm(lr=5e-4, router_lr=3e-3)
    model.set_phase("foster", scale=scale, t_range=(250, 500))
    assert model.phase == "foster" and model.t_range == (250, 500)
    expected = {id(p) for layer in model.experts.values() for p in (layer.lora_A[scale], layer.lora_B[scale])}
    assert {id(p) for p in trainable(model).values()} == expected
    assert all(name.endswith((f"lora_A.{scale}", f"lora_B.{scale}")) for name in trainable(model))
    assert all(layer.stage == "foster" and layer.active_scale == scale for layer in model.experts.values())
    optimizer, ids = optimised(model)
    assert ids == expected
    assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["lr"] == 5e-4


def test_assemble_phase_trains_only_the_router() -> None:
    """Check that set_phase("assemble") makes only router.* and time_gate.* trainable over [0, T), and that the
    optimiser holds only them, at router_lr with router_weight_decay, and no expert tensor."""
    model = tsm(lr=5e-4, router_lr=3e-3, router_weight_decay=0.05)
    model.set_phase("foster", scale=0, t_range=(0, 250))
    model.set_phase("assemble")
    assert model.phase == "assemble" and model.t_range == (0, 1000)
    names = set(trainable(model))
    assert names and all(".router." in name or ".time_gate." in name for name in names)
    routers = {id(p) for layer in model.experts.values() for p in layer.router_parameters()}
    assert {id(p) for p in trainable(model).values()} == routers
    optimizer, ids = optimised(model)
    assert ids == routers
    experts = {id(p) for layer in model.experts.values() for p in layer.expert_parameters()}
    assert not ids & experts
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(3e-3, 0.05)]


@pytest.mark.parametrize("mode", ["pretrain", "lora"])
def test_set_phase_is_for_tsm_only(mode: str) -> None:
    """Check that set_phase on a pretrain or LoRA model raises instead of silently doing nothing."""
    with pytest.raises(RuntimeError, match="mode='tsm'"):
        tsm(mode).set_phase("foster", scale=0)


@pytest.mark.parametrize("t_range", [(0, 0), (500, 400), (-1, 10), (0, 1001)])
def test_bad_t_range_is_refused(t_range: tuple[int, int]) -> None:
    """Check that an empty, reversed or out-of-range t_range raises a ValueError."""
    with pytest.raises(ValueError, match="t_range must satisfy"):
        tsm().set_phase("foster", scale=0, t_range=t_range)


# ------------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize(("mode", "t_range"), [("tsm", (250, 500)), ("tsm", (0, 1000)), ("lora", None)])
def test_training_step_draws_one_t_per_sample_inside_the_range(
    mode: str, t_range: tuple[int, int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check that training_step draws a timestep per sample (not one for the batch), all inside the phase's range."""
    model = tsm(mode)
    if t_range is not None:
        model.set_phase("foster", scale=0, t_range=t_range)
    lo, hi = t_range or (0, 1000)
    no_log(model, monkeypatch)
    seen: list[Tensor] = []
    add_noise = model.scheduler.add_noise

    def spy(x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        seen.append(t.clone())
        return add_noise(x0, noise, t)

    monkeypatch.setattr(model.scheduler, "add_noise", spy)
    torch.manual_seed(0)
    loss = model.training_step((images(64), torch.zeros(64)), 0)
    assert loss.dim() == 0 and torch.isfinite(loss)
    (t,) = seen
    assert t.shape == (64,)
    assert int(t.min()) >= lo and int(t.max()) < hi
    assert len(t.unique()) > 10  # per sample, not one t for the whole batch


# ------------------------------------------------------------------------------------------------ base weights
@pytest.mark.parametrize("mode", ["pretrain", "lora", "tsm"])
def test_load_base_weights_puts_every_base_weight_in_place(mode: str) -> None:
    """Check that a plain UNet2DModel state dict lands in the (adapted) UNet: every base tensor is copied and, with the
    adapters at their zero init, the output equals the plain UNet's."""
    source = tsm("pretrain", seed=1).eval()
    model = tsm(mode, seed=2).eval()
    x, t = images(3), torch.tensor([10, 400, 990])
    with torch.no_grad():
        assert not torch.allclose(model(x, t), source(x, t))  # different seeds: different base weights before
        state = source.unet.state_dict()
        model.load_base_weights(state)
        own = model.unet.state_dict()
        for key, value in state.items():
            prefix, _, leaf = key.rpartition(".")
            place = [k for k in (key, f"{prefix}.base_layer.{leaf}", f"{prefix}.base.{leaf}") if k in own]
            assert len(place) == 1 and torch.equal(own[place[0]], value), key
        assert torch.equal(model(x, t), source(x, t))
        if mode == "tsm":
            model.set_phase("assemble")  # zero router: still the base model
            assert torch.equal(model(x, t), source(x, t))


def test_load_base_weights_refuses_an_unknown_key() -> None:
    """Check that a key with no place in the UNet raises a KeyError naming it."""
    model = tsm("tsm")
    state = dict(tsm("pretrain").unet.state_dict())
    state["mid_block.nonexistent.weight"] = torch.zeros(3)
    with pytest.raises(KeyError, match="mid_block.nonexistent.weight"):
        model.load_base_weights(state)


# ------------------------------------------------------------------------------------------------ evaluation
def test_eval_grid_is_the_centres_of_twenty_intervals() -> None:
    """Check that the evaluation grid is t = 25, 75, …, 975 and puts 5 points in each quarter of [0, T)."""
    grid = eval_grid()
    assert grid.tolist() == list(range(25, 1000, 50))
    assert (grid // 250).bincount().tolist() == [5, 5, 5, 5]


def test_grid_mse_is_seeded_and_per_timestep() -> None:
    """Check that grid_mse gives (20, B) finite values, the same for the same generator seed, others for another."""
    model = tsm("pretrain").eval()
    x0 = images(5)
    with torch.no_grad():
        first = model.grid_mse(x0, torch.Generator().manual_seed(3))
        again = model.grid_mse(x0, torch.Generator().manual_seed(3))
        other = model.grid_mse(x0, torch.Generator().manual_seed(4))
    assert first.shape == (20, 5) and bool(torch.isfinite(first).all()) and bool((first > 0).all())
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_test_mse_is_deterministic_and_the_mean_of_its_buckets() -> None:
    """Check that test/mse is identical across two runs (seeded noise), equals the mean of test/mse_bucket0..3, and
    that each bucket is the mean of its 5 grid timesteps of grid_mse with the evaluation seed."""
    model = tsm("pretrain")
    dm = DomainShiftDataModule("target", batch_size=16)
    first = quiet_trainer(limit_test_batches=1).test(model, dm, verbose=False)[0]
    second = quiet_trainer(limit_test_batches=1).test(model, dm, verbose=False)[0]
    assert first == second
    assert set(first) == {"test/mse", *(f"test/mse_bucket{k}" for k in range(4))}
    buckets = [first[f"test/mse_bucket{k}"] for k in range(4)]
    assert first["test/mse"] == pytest.approx(sum(buckets) / 4, rel=1e-5)
    with torch.no_grad():
        mse = model.eval().grid_mse(dm.test_set.tensors[0][:16], torch.Generator().manual_seed(0))  # seed·100003 + 0
    assert buckets == pytest.approx(mse.mean(1).view(4, 5).mean(1).tolist(), rel=1e-5)


# The denoising MSE from the formulas, independent of diffusers' scheduler and of the module's loss.
def alphas_cumprod_by_hand(T: int = 1000) -> np.ndarray:  # noqa: N803
    """ᾱ_t of the cosine schedule (diffusers' ``squaredcos_cap_v2``) in float64: ᾱ(s) = cos²((s + 0.008) / 1.008 · π/2),
    β_t = min(1 − ᾱ((t + 1) / T) / ᾱ(t / T), 0.999), ᾱ_t = Π_{i ≤ t} (1 − β_i)."""

    def alpha_bar(s: np.ndarray) -> np.ndarray:
        return np.cos((s + 0.008) / 1.008 * np.pi / 2) ** 2

    t = np.arange(T, dtype=np.float64)
    beta = np.minimum(1 - alpha_bar((t + 1) / T) / alpha_bar(t / T), 0.999)
    return np.cumprod(1 - beta)


def mse_by_hand(model: TSMDiffusion, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """Per-sample ‖ε − ε_θ(x_t, t)‖² / D with x_t = √ᾱ_t x0 + √(1 − ᾱ_t) ε built here and the UNet called directly."""
    a = torch.from_numpy(alphas_cumprod_by_hand()[t.numpy()]).view(-1, 1, 1, 1)
    x_t = (a.sqrt() * x0.double() + (1 - a).sqrt() * noise.double()).float()
    with torch.no_grad():
        eps = model.unet(x_t, t).sample
    return ((eps - noise) ** 2).flatten(1).mean(1)


def test_the_cosine_schedule_is_the_formula_with_its_closed_form_ends() -> None:
    """Check ᾱ by the formula against the model's scheduler, and the formula at both ends against closed forms:
    (t + 0.008) / 1.008 · π/2 is π/252 at t = 0 and the product telescopes, so ᾱ_0 = cos²(π/224) / cos²(π/252); only
    β_999 is clipped (ᾱ(1) = 0), so ᾱ_999 = 0.001 · ᾱ(0.999) / ᾱ(0) = 0.001 · sin²(π/2016) / cos²(π/252) ≈ 2.43e-9."""
    by_hand = alphas_cumprod_by_hand()
    assert by_hand[0] == pytest.approx(math.cos(math.pi / 224) ** 2 / math.cos(math.pi / 252) ** 2, rel=1e-12)
    assert by_hand[999] == pytest.approx(0.001 * math.sin(math.pi / 2016) ** 2 / math.cos(math.pi / 252) ** 2, rel=1e-9)
    assert by_hand[0] == pytest.approx(0.99995872, rel=1e-8) and by_hand[999] == pytest.approx(2.42877e-9, rel=1e-5)
    scheduler = tsm("pretrain").scheduler.alphas_cumprod.double().numpy()  # float32 products: ~1e-5 relative
    np.testing.assert_allclose(scheduler, by_hand, rtol=3e-5, atol=0)


@pytest.mark.parametrize("mode", ["pretrain", "tsm"])
def test_loss_is_the_denoising_mse_built_by_hand(mode: str) -> None:
    """Check model.loss against x_t = √ᾱ_t x0 + √(1 − ᾱ_t) ε with ᾱ from the formula, one t per sample (both ends
    and two inside), the UNet called directly; a scalar t is the same as that t for every sample."""
    model = tsm(mode).eval()
    if mode == "tsm":
        randomise_adapters(model)
        model.set_phase("foster", scale=0)  # per-sample experts: each sample's own interval
    x0, t = images(4), torch.tensor([0, 250, 640, 999])
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = model.loss(x0, t, noise)
        torch.testing.assert_close(got, mse_by_hand(model, x0, t, noise), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(model.loss(x0, torch.tensor(640), noise), model.loss(x0, t.fill_(640), noise))
    assert got.shape == (4,)


def test_grid_mse_and_the_logged_buckets_are_the_denoising_mse_by_hand() -> None:
    """Check grid_mse and test_step's test/mse and test/mse_bucket{k} against the MSE by hand on t = 25, 75, …, 975
    with the same seeded draw of noise, bucket k the mean over the grid points with t in [250 k, 250 (k + 1))."""
    model = tsm("pretrain")
    dm = DomainShiftDataModule("target", batch_size=16)
    logged = quiet_trainer(limit_test_batches=1).test(model, dm, verbose=False)[0]
    x0 = dm.test_set.tensors[0][:16]
    grid = list(range(25, 1000, 50))
    noise = torch.randn((len(grid), *x0.shape), generator=torch.Generator().manual_seed(0))  # seed 0, batch 0
    by_hand = torch.stack([mse_by_hand(model.eval(), x0, torch.full((16,), t), n) for t, n in zip(grid, noise)])
    with torch.no_grad():
        got = model.grid_mse(x0, torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-7)
    for k in range(4):
        rows = [i for i, t in enumerate(grid) if 250 * k <= t < 250 * (k + 1)]
        assert len(rows) == 5
        assert logged[f"test/mse_bucket{k}"] == pytest.approx(float(by_hand[rows].mean()), rel=1e-5), k
    assert logged["test/mse"] == pytest.approx(float(by_hand.mean()), rel=1e-5)


def test_sample_shape_range_and_seed() -> None:
    """Check that sample(n, steps) returns (n, 1, 8, 8) in [-1, 1], the same images for the same generator seed."""
    model = tsm("pretrain").eval()
    first = model.sample(3, steps=4, generator=torch.Generator().manual_seed(5))
    again = model.sample(3, steps=4, generator=torch.Generator().manual_seed(5))
    other = model.sample(3, steps=4, generator=torch.Generator().manual_seed(6))
    assert first.shape == (3, 1, 8, 8)
    assert float(first.min()) >= -1 and float(first.max()) <= 1
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(model.sample(2, steps=2), model.sample(2, steps=2))  # default generator: seeded by hp.seed


# ------------------------------------------------------------------------------------------------ EMA
def test_ema_averages_the_trained_weights_and_serves_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that with ema_decay=0.9 the EMA copy is 0.9·(weights after step 1) + 0.1·(after step 2), differs from
    the live weights, and is what forward uses in eval mode (the live UNet in training mode)."""
    model = tsm("pretrain", ema_decay=0.9)
    no_log(model, monkeypatch)
    torch.manual_seed(0)
    after_1, after_2 = train_steps(model, 2, images(16))
    ema = dict(model.ema.module.named_parameters())
    for name, value in after_2.items():
        torch.testing.assert_close(ema[name], 0.9 * after_1[name] + 0.1 * value, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(ema[name], value) for name, value in after_2.items())
    x, t = images(3), torch.tensor([100, 500, 900])
    with torch.no_grad():
        model.eval()
        assert model.denoiser is model.ema.module
        assert torch.equal(model(x, t), model.ema.module(x, t).sample)
        assert not torch.allclose(model(x, t), model.unet(x, t).sample)
        model.train()
        assert model.denoiser is model.unet
        assert torch.equal(model(x, t), model.unet(x, t).sample)


def test_ema_copy_of_timestep_experts_routes_its_own_timesteps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that in mode "tsm" the EMA copy's expert layers get the timesteps of its own calls: an eval forward works
    and, once B is non-zero and the live weights moved on, differs from the live UNet's output and from the base."""
    model = tsm("tsm", ema_decay=0.9)
    model.set_phase("foster", scale=0, t_range=(250, 500))
    randomise_adapters(model)
    model.ema.update_parameters(model.unet)  # the first update copies: the EMA now holds the non-zero B too
    no_log(model, monkeypatch)
    torch.manual_seed(0)
    train_steps(model, 1, images(16))
    x, t = images(3), torch.tensor([260, 300, 499])
    copies = [m for m in model.ema.module.modules() if isinstance(m, _TimestepExperts)]
    assert len(copies) == len(model.experts) and not {id(m) for m in copies} & {id(m) for m in model.experts.values()}
    with torch.no_grad():
        out = model.eval()(x, t)
        assert all(torch.equal(m.timesteps, t) for m in copies)
        assert not torch.allclose(out, model.unet(x, t).sample)
        for m in copies:
            m.set_stage("base")
        assert not torch.allclose(out, model.ema.module(x, t).sample)  # the EMA's experts do act


@pytest.mark.parametrize(("phase", "scale"), [("foster", 0), ("foster", 2), ("assemble", 0)])
def test_ema_copy_follows_the_phase(phase: str, scale: int) -> None:
    """Check that set_phase reaches the EMA copy's expert layers: with the EMA equal to the live weights, the eval
    forward (EMA) equals the live UNet's output in every phase."""
    model = tsm("tsm", ema_decay=0.9)
    randomise_adapters(model)
    with torch.no_grad():
        for layer in model.experts.values():
            layer.router.weight.normal_(std=0.1)
            layer.time_gate.weight.normal_(std=0.1)
    model.ema.update_parameters(model.unet)  # the first update copies the live weights
    model.set_phase(phase, scale=scale)
    assert all(
        (m.stage, m.active_scale) == (phase, scale)
        for m in model.ema.module.modules()
        if isinstance(m, _TimestepExperts)
    )
    x, t = images(3), torch.tensor([10, 480, 990])
    with torch.no_grad():
        assert torch.equal(model.eval()(x, t), model.unet(x, t).sample)


def test_load_base_weights_reaches_the_ema_copy() -> None:
    """Check that base weights loaded before training are also in the EMA copy that evaluation uses."""
    source = tsm("pretrain", seed=1).eval()
    model = tsm("lora", seed=2, ema_decay=0.9)
    model.load_base_weights(source.unet.state_dict())
    x, t = images(3), torch.tensor([10, 400, 990])
    with torch.no_grad():
        assert torch.equal(model.eval()(x, t), source(x, t))


# ------------------------------------------------------------------------------------------------ hub base
def test_base_starts_from_the_hub_source_unet() -> None:
    """Check that base="tsm-source" puts the hub's source UNet weights under the timestep experts (same output with
    the zero-initialised adapters)."""
    source = zoo.load("tsm-source")
    model = TSMDiffusion(mode="tsm", base="tsm-source").eval()
    own = model.unet.state_dict()
    for key, value in source.unet.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        place = key if key in own else f"{prefix}.base.{leaf}"
        assert torch.equal(own[place], value), key
    x, t = images(3), torch.tensor([10, 400, 990])
    with torch.no_grad():
        assert torch.equal(model(x, t), source(x, t))


def test_base_must_be_a_pretrain_entry() -> None:
    """Check that base pointing at an entry that is not mode "pretrain" (the tsm entry itself) raises a ValueError."""
    with pytest.raises(ValueError, match="not a pretrained TSMDiffusion"):
        TSMDiffusion(mode="tsm", base="tsm")


def test_a_tsm_model_starts_assembled_and_refuses_to_fit_without_a_phase() -> None:
    """Check the default phase (assembled, as loaded entries are used) and the error when fitting without a schedule."""
    model = TSMDiffusion(mode="tsm", block_out_channels=[16, 32], scales=[4, 2, 1])
    assert model.phase == "assemble"
    assert all(layer.stage == "assemble" for layer in model.experts.values())
    trainer = Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="TimestepExpertsSchedule"):
        trainer.fit(model, DomainShiftDataModule("target", batch_size=16))
