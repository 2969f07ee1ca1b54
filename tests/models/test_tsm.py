"""Tests of TSMDiffusion (TimeStep Master): the three modes and what each trains, the phases and the optimiser they
build, per-sample timesteps inside the phase's range, base weights loaded into adapted UNets, the seeded grid MSE and
its buckets, DDIM sampling, the EMA copy (also with timestep experts), and starting from the hub's source UNet."""

from __future__ import annotations

from collections.abc import Iterator

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
    """Check that an unknown mode raises a ValueError naming the three modes."""
    with pytest.raises(ValueError, match="'pretrain', 'lora' or 'tsm'"):
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


def test_reproduction_stage_two_arms_start_from_the_same_fostered_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check the reproduction's compute-matched stand-in: ``tsm_2stage`` and ``tsm_core_more`` both start from the
    seed's TSM-1stage weights; the router arm changes only the router, the core arm only the finest scale's experts
    (its router stays zero, so it is evaluated as core only), and both count the same steps."""
    from zoo.models.tsm import reproduce

    states: dict[str, dict[str, Tensor]] = {}
    current: list[str] = []

    def record(model: TSMDiffusion, dm: DomainShiftDataModule) -> dict[str, float]:
        states[current[-1]] = {k: v.detach().clone() for k, v in model.unet.state_dict().items()}
        return {"mse": 0.0}

    monkeypatch.setattr(reproduce, "_test", record)
    monkeypatch.setattr(reproduce, "_mean_gate", lambda model, dm: 0.0)
    base = {k: v.clone() for k, v in tsm("pretrain").unet.state_dict().items()}
    arms = reproduce._Arms(base, steps=4, router_steps=2)
    for arm in ("tsm_1stage", "tsm_2stage", "tsm_core_more"):
        current.append(arm)
        arms(arm, seed=0)
    fostered, routed, core = states["tsm_1stage"], states["tsm_2stage"], states["tsm_core_more"]

    def changed(state: dict[str, Tensor]) -> set[str]:
        return {k for k in fostered if not torch.equal(state[k], fostered[k])}

    assert changed(routed) and all(".router." in k or ".time_gate." in k for k in changed(routed))
    assert changed(core) and all(k.endswith(("lora_A.0", "lora_B.0")) for k in changed(core))
    assert all(not v.any() for k, v in core.items() if ".router." in k or ".time_gate." in k)
    assert arms.static["tsm_2stage/steps"] == arms.static["tsm_core_more/steps"] == 3 * 4 + 2
