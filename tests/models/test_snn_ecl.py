"""Tests of ECL (ANN→SNN conversion with error compensation learning): the dual-threshold neuron's closed form, the
clip-floor activation and its STE gradients, exact conversion at T = L, the converter's checks, state handling and
the backbones (the reproduction runs in the contract tests)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning import Trainer
from torch import Tensor, nn

from zoo.datamodules.images import ImageDataModule
from zoo.models.snn_ecl import (
    ClipQuantActivation,
    DualThresholdIFNeuron,
    ECLClassifier,
    SpikingNetwork,
    activation_percentiles,
    build_backbone,
    convert,
    naive_convert,
)
from zoo.models.snn_ecl.backbones import BasicBlock

THETAS = (0.5, 1.0, 2.0, 4.0)  # exactly representable: the neuron keeps θ in a float32 buffer


def _round_half_up(x: Tensor) -> Tensor:
    return torch.floor(x + 0.5)


def _run(neuron: DualThresholdIFNeuron, x: Tensor) -> Tensor:
    """Cumulative output after every step, ``(steps, B)``."""
    return neuron.multi_step(x).cumsum(0)


# ------------------------------------------------------------------------------------------------ neuron
@pytest.mark.parametrize("theta", THETAS)
def test_dual_neuron_cumulative_output_is_round_half_up(theta: float) -> None:
    """Check that with θ⁻ = 0 and v(0) = θ/2 the cumulative output is θ·max(0, ⌊S_t/θ + ½⌋) after every step."""
    g = torch.Generator().manual_seed(int(theta * 8))
    x = (torch.rand(64, 512, generator=g, dtype=torch.float64) * 2 - 1) * theta  # per-step input in [−θ, θ]
    cumulative = _run(DualThresholdIFNeuron(theta, v0_ratio=0.5, dual=True, neg_threshold=0.0), x)
    expected = theta * _round_half_up(x.cumsum(0) / theta).clamp(min=0)
    torch.testing.assert_close(cumulative, expected, rtol=0, atol=1e-9)
    assert (expected > 0).any() and (expected == 0).any()  # both the clip at 0 and the rounding were exercised


@pytest.mark.parametrize("theta", THETAS)
def test_dual_neuron_matches_round_half_up_on_exact_ties_where_half_to_even_fails(theta: float) -> None:
    """Check that on dyadic inputs (exact ties) the neuron matches ⌊x + ½⌋ everywhere and torch.round somewhere not."""
    g = torch.Generator().manual_seed(int(theta * 8) + 1)
    x = torch.randint(-8, 9, (64, 512), generator=g).double() * (theta / 8)  # multiples of θ/8 in [−θ, θ]
    cumulative = _run(DualThresholdIFNeuron(theta), x)
    ratio = x.cumsum(0) / theta
    ties = (ratio - torch.floor(ratio)) == 0.5
    assert ties.sum() > 100  # the inputs really hit exact ties
    torch.testing.assert_close(cumulative, theta * _round_half_up(ratio).clamp(min=0), rtol=0, atol=0)
    half_to_even = theta * torch.round(ratio).clamp(min=0)
    assert (cumulative != half_to_even).sum() > 0  # so the test tells the two roundings apart
    assert torch.equal(cumulative[~ties], half_to_even[~ties])  # and they differ only on the ties


@pytest.mark.parametrize("neg_threshold", [0.0, -0.25, -0.5])
def test_dual_neuron_net_count_never_negative(neg_threshold: float) -> None:
    """Check that the dual neuron's net spike count N stays ≥ 0 at every step, also for large and negative inputs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g, dtype=torch.float64) * 5.0  # often far outside [−θ, θ]
    x[:, :64] -= 3.0  # some neurons driven mostly negative after an early burst
    x[:4, :64] = 6.0
    neuron = DualThresholdIFNeuron(1.0, v0_ratio=0.5, dual=True, neg_threshold=neg_threshold)
    spikes = neuron.multi_step(x)
    assert set(spikes.unique().tolist()) == {-1.0, 0.0, 1.0}  # negative spikes do occur
    counts = spikes.cumsum(0)
    assert counts.min() >= 0
    torch.testing.assert_close(neuron.count, counts[-1])


def test_single_threshold_neuron_never_spikes_negative() -> None:
    """Check that with dual=False no negative spike is emitted, whatever the input, and N counts the spikes."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g, dtype=torch.float64) * 3.0
    for v0 in (0.0, 0.5):
        neuron = DualThresholdIFNeuron(1.0, v0_ratio=v0, dual=False)
        spikes = neuron.multi_step(x)
        assert spikes.min() == 0 and spikes.max() == 1
        torch.testing.assert_close(neuron.count, spikes.sum(0))


@pytest.mark.parametrize("theta", [1.0, 2.0])
def test_v0_zero_single_threshold_is_the_classical_if_neuron(theta: float) -> None:
    """Check that v0_ratio=0, dual=False gives cumulative output θ·⌊S_t/θ⌋ for inputs in [0, θ) per step."""
    g = torch.Generator().manual_seed(2)
    random = torch.rand(64, 256, generator=g, dtype=torch.float64) * theta * 0.999
    dyadic = torch.randint(0, 16, (64, 256), generator=g).double() * (theta / 16)  # exact integer crossings
    for x in (random, dyadic):
        cumulative = _run(DualThresholdIFNeuron(theta, v0_ratio=0.0, dual=False), x)
        torch.testing.assert_close(cumulative, theta * torch.floor(x.cumsum(0) / theta), rtol=0, atol=1e-9)
    # v(0) = θ/2 would round instead of floor: the two differ, so the check above sees v0_ratio.
    assert not torch.equal(_run(DualThresholdIFNeuron(theta, v0_ratio=0.5, dual=False), random), cumulative)


def test_neuron_forward_layout_and_state_across_calls() -> None:
    """Check that forward on (steps·B, ...) equals multi_step, and two chunks of steps equal one call."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10, 4, 3, generator=g, dtype=torch.float64)
    whole = DualThresholdIFNeuron(1.0).multi_step(x)
    flat = DualThresholdIFNeuron(1.0)
    flat.steps = 10
    assert torch.equal(flat(x.flatten(0, 1)), whole.flatten(0, 1))
    chunked = DualThresholdIFNeuron(1.0)
    assert torch.equal(torch.cat([chunked.multi_step(x[:3]), chunked.multi_step(x[3:])]), whole)
    chunked.reset()
    assert torch.equal(chunked.multi_step(x), whole)  # reset restores v(0) = θ/2 and N = 0


def test_neuron_rejects_bad_thresholds() -> None:
    """Check that a non-positive θ and a positive θ⁻ ratio raise ValueError."""
    for theta in (0.0, -1.0):
        with pytest.raises(ValueError, match="threshold"):
            DualThresholdIFNeuron(theta)
    with pytest.raises(ValueError, match="neg_threshold"):
        DualThresholdIFNeuron(1.0, neg_threshold=0.1)


# ------------------------------------------------------------------------------------------------ activation
def _per_element_grads(act: ClipQuantActivation, z: Tensor) -> tuple[Tensor, Tensor]:
    z = z.clone().requires_grad_(True)
    h = act(z)
    dz = torch.autograd.grad(h.sum(), z, retain_graph=True)[0]  # h_i depends on z_i only
    dlam = torch.stack([torch.autograd.grad(h[i], act.threshold, retain_graph=True)[0] for i in range(len(z))])
    return dz, dlam


@pytest.mark.parametrize("levels", [1, 4, 8])
def test_clip_quant_forward_and_ste_gradients(levels: int) -> None:
    """Check that h(z) = λ·clip(⌊zL/λ+½⌋/L, 0, 1) and its gradients are the card's §2.1 closed forms."""
    lam = 1.5
    act = ClipQuantActivation(lambda_init=lam, levels=levels).double()
    g = torch.Generator().manual_seed(levels)
    z = torch.rand(200, generator=g, dtype=torch.float64) * 3 * lam - lam  # in [−λ, 2λ]
    u = z * levels / lam + 0.5
    assert (u - torch.round(u)).abs().min() > 1e-6  # no point on a step or a clip boundary
    floor_u = torch.floor(u)
    with torch.no_grad():
        torch.testing.assert_close(act(z), lam * (floor_u / levels).clamp(0, 1))
    dz, dlam = _per_element_grads(act, z)
    # "Un-clipped" is 0 ≤ ⌊u⌋/L ≤ 1, plateaus ⌊u⌋ = 0 and ⌊u⌋ = L included: there q is exactly 0 or 1 over whole
    # intervals of z, so a clip that drops the gradient at its bounds (torch.clamp since 2.14) would differ there.
    inside, top, bottom = (floor_u >= 0) & (floor_u <= levels), floor_u > levels, floor_u < 0
    assert top.any() and bottom.any() and (floor_u == 0).any() and (floor_u == levels).any()
    torch.testing.assert_close(dz, inside.double())
    expected = torch.where(inside, floor_u / levels - z / lam, top.double())
    torch.testing.assert_close(dlam, expected)


def test_pure_clip_variant_and_bad_lambda() -> None:
    """Check that levels=None is clamp(z, 0, λ) with ∂/∂λ = 1 above λ, and lambda_init ≤ 0 or levels < 1 raise."""
    lam = 2.0
    act = ClipQuantActivation(lambda_init=lam, levels=None).double()
    z = torch.linspace(-3.05, 5.05, 81, dtype=torch.float64)  # never exactly 0 or λ
    with torch.no_grad():
        torch.testing.assert_close(act(z), z.clamp(0, lam))
    dz, dlam = _per_element_grads(act, z)
    torch.testing.assert_close(dz, ((z > 0) & (z < lam)).double())
    torch.testing.assert_close(dlam, (z > lam).double())
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="lambda_init"):
            ClipQuantActivation(lambda_init=bad)
    with pytest.raises(ValueError, match="levels"):
        ClipQuantActivation(levels=0)


# ------------------------------------------------------------------------------------------------ conversion
@pytest.mark.parametrize(("levels", "lam"), [(2, 0.75), (4, 1.5), (8, 2.0)])
def test_conversion_is_exact_at_T_equal_L(levels: int, lam: float) -> None:
    """Check that Linear→ClipQuant(λ, L)→Linear converted (v0=½, dual) gives the ANN's output at T = L exactly."""
    # The hidden layer's input z is the same at every step (direct encoding). A neuron with θ = λ, v(0) = θ/2 fed z
    # per step: for z in [−θ, θ] its count after t steps is max(0, ⌊tz/θ + ½⌋) (the closed form above), at most t;
    # for z > θ it fires every step (count t), for z < −θ never (0). So at t = L the count is
    # clip(⌊Lz/θ + ½⌋, 0, L), the mean output θ·count/L = λ·clip(⌊zL/λ + ½⌋/L, 0, 1) = h(z), and the linear read-out
    # of the mean of the spikes is the read-out of h(z): the ANN's logits.
    torch.manual_seed(levels)
    ann = nn.Sequential(nn.Linear(6, 32), ClipQuantActivation(lam, levels), nn.Linear(32, 5))
    x = torch.randn(200, 6) * 2
    with torch.no_grad():
        expected = ann(x)
        hidden = ann[0](x)
    assert ((hidden > 0) & (hidden < lam)).any() and (hidden > lam).any() and (hidden < 0).any()
    snn = convert(ann, v0_ratio=0.5, dual=True)
    prediction = snn.predict(x, steps=levels)
    torch.testing.assert_close(prediction[levels - 1], expected, rtol=0, atol=1e-5)
    if levels > 1:  # before T = L the network has not caught up: the check above is not vacuous
        assert (prediction[0] - expected).abs().max() > 0.1


def test_naive_conversion_converges_at_long_T() -> None:
    """Check that a ReLU MLP converted naively has a far smaller mean-logit error at T=256 than at T=8."""
    torch.manual_seed(0)
    ann = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    x = torch.randn(256, 10)
    with torch.no_grad():
        expected = ann(x)
    snn = naive_convert(ann, x)
    assert all(n.v0_ratio == 0.0 and not n.dual for n in snn.neurons.values())
    prediction = snn.predict(x, steps=256)
    error = {t: float((prediction[t - 1] - expected).abs().mean()) for t in (8, 256)}
    assert error[256] < error[8] / 5, error
    assert error[256] < 0.01 * float(expected.abs().mean()) + 0.01, error


class _Named(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), ClipQuantActivation(1.0))
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class _Reuses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.act = ClipQuantActivation(1.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def test_converter_refuses_unsupported_layers_by_path() -> None:
    """Check that GELU and Sigmoid layers make convert raise a ValueError naming the layer's path and type."""
    with pytest.raises(ValueError, match=r"'head' \(Sigmoid\)"):
        convert(_Named(nn.Sigmoid()))
    nested = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.GELU()))
    with pytest.raises(ValueError, match=r"'1\.1' \(GELU\)"):
        convert(nested)
    convert(_Named(nn.Identity()))  # the same network with a supported head converts


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_bad_step_counts_raise(steps) -> None:
    """Check that a step count that is not a positive integer (0, −1, 2.5, True) raises ValueError."""
    snn = convert(nn.Sequential(nn.Linear(4, 4), ClipQuantActivation(1.0), nn.Linear(4, 2)))
    with pytest.raises(ValueError, match="steps"):
        snn(torch.rand(3, 4), steps)
    with pytest.raises(ValueError, match="steps"):
        snn.predict(torch.rand(3, 4), steps)


def test_reused_activation_and_relu_without_threshold_raise() -> None:
    """Check that an activation module called twice per forward, and a ReLU without a threshold, raise ValueError."""
    ann = _Reuses()
    assert ann(torch.rand(2, 4)).shape == (2, 3)  # fine as an ANN
    with pytest.raises(ValueError, match=r"\['act'\].*called \[2\] times"):
        convert(ann)(torch.rand(2, 4), steps=2)
    relu = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"ReLU layer '1' has no threshold"):
        convert(relu)
    assert float(convert(relu, {"1": 0.75}).neurons["1"].threshold) == 0.75


def test_max_pooling_becomes_average_pooling_of_the_same_geometry() -> None:
    """Check that MaxPool2d becomes AvgPool2d with the same kernel, stride, padding and ceil_mode (adaptive alike)."""
    ann = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), ClipQuantActivation(1.0), nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
        nn.AdaptiveMaxPool2d((2, 3)), nn.Flatten(), nn.Linear(24, 2),
    )  # fmt: skip
    net = convert(ann).net
    pool, adaptive = net[2], net[3]
    assert type(pool) is nn.AvgPool2d and type(adaptive) is nn.AdaptiveAvgPool2d
    assert (pool.kernel_size, pool.stride, pool.padding, pool.ceil_mode) == (3, 2, 1, True)
    assert adaptive.output_size == (2, 3)
    x = torch.rand(2, 1, 9, 9)
    assert pool(x).shape == ann[2](x).shape


def test_conversion_leaves_the_ann_untouched_and_stays_in_eval() -> None:
    """Check that the ANN keeps its modules and thresholds, and the SNN stays in eval mode after .train()."""
    ann = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), ClipQuantActivation(1.25), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16, 2),
    ).train()  # fmt: skip
    before = {k: v.clone() for k, v in ann.state_dict().items()}
    types = [type(m) for m in ann.modules()]
    snn = convert(ann)
    snn(torch.rand(3, 1, 4, 4), steps=4)
    assert [type(m) for m in ann.modules()] == types and ann.training
    assert all(torch.equal(before[k], v) for k, v in ann.state_dict().items())  # BN statistics included
    assert float(ann[2].threshold.detach()) == 1.25
    snn.train()
    assert not any(m.training for m in snn.modules())
    assert isinstance(snn.net[2], DualThresholdIFNeuron) and isinstance(snn.net[3], nn.AvgPool2d)


def test_neuron_thresholds_are_the_learned_lambdas() -> None:
    """Check that to_snn gives every neuron θ = that layer's current λ and the module's neuron defaults."""
    model = ECLClassifier(backbone="mlp")
    acts = [m for m in model.net.modules() if isinstance(m, ClipQuantActivation)]
    for i, act in enumerate(acts):
        act.threshold.data.fill_(0.5 + 0.25 * i)
    snn = model.to_snn()
    assert model.thresholds == {"2": 0.5, "4": 0.75, "6": 1.0, "8": 1.25}
    assert {name: float(n.threshold) for name, n in snn.neurons.items()} == model.thresholds
    assert all(n.v0_ratio == 0.5 and n.dual and n.neg_threshold == 0.0 for n in snn.neurons.values())
    single = model.to_snn(v0_ratio=0.0, dual=False)
    assert all(n.v0_ratio == 0.0 and not n.dual for n in single.neurons.values())


# ------------------------------------------------------------------------------------------------ state handling
def _spiking_mlp() -> SpikingNetwork:
    torch.manual_seed(0)
    ann = nn.Sequential(
        nn.Linear(6, 16), ClipQuantActivation(0.5), nn.Linear(16, 16), ClipQuantActivation(0.5), nn.Linear(16, 4)
    ).double()
    return convert(ann)


def test_states_reset_between_runs_and_batches_are_independent() -> None:
    """Check that two runs on one input agree, and a batch's outputs equal its samples' outputs stacked."""
    snn = _spiking_mlp()
    x = torch.randn(6, 6, dtype=torch.float64)
    first = snn(x, steps=10)
    assert first.shape == (10, 6, 4) and not torch.equal(first[0], first[1])  # the state evolves over steps
    torch.testing.assert_close(snn(x, steps=10), first, rtol=0, atol=0)
    other = snn(torch.randn(6, 6, dtype=torch.float64), steps=10)  # a different input leaves nothing behind
    assert not torch.equal(other, first)
    torch.testing.assert_close(snn(x, steps=10), first, rtol=0, atol=0)
    alone = torch.cat([snn(x[i : i + 1], steps=10) for i in range(len(x))], dim=1)
    torch.testing.assert_close(alone, first)


def test_chunked_simulation_equals_unchunked() -> None:
    """Check that simulating 10 steps in chunks of 3 gives the same per-step outputs and prediction as one pass."""
    snn = _spiking_mlp()
    x = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(snn(x, steps=10, chunk=3), snn(x, steps=10))
    prediction = snn.predict(x, steps=10, chunk=3)
    torch.testing.assert_close(prediction, snn(x, steps=10).cumsum(0) / torch.arange(1, 11).view(-1, 1, 1))
    rates = snn.firing_rates()
    assert set(rates) == {"1", "3"} and all(0 < r < 1 for r in rates.values())


def test_activation_percentiles_agree_with_quantile() -> None:
    """Check that activation_percentiles lies between torch.quantile's neighbouring order statistics per layer."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4), ClipQuantActivation(10.0, levels=None))
    x = torch.randn(50, 3)
    with torch.no_grad():
        outputs = {"1": net[1](net[0](x)), "3": net(x)}
    for p in (90.0, 99.0, 100.0):
        got = activation_percentiles(net, x, percentile=p)
        assert set(got) == {"1", "3"}
        for name, out in outputs.items():
            flat = out.flatten()
            low = float(torch.quantile(flat, p / 100, interpolation="lower"))
            high = float(torch.quantile(flat, p / 100, interpolation="higher"))
            assert low <= got[name] <= high, (p, name, got[name], low, high)
            assert got[name] > 0
        assert activation_percentiles(net, [x[:20], x[20:]], percentile=p) == got  # batches pooled
    assert got == {name: float(out.max()) for name, out in outputs.items()}  # p = 100 is the maximum
    dead = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    nn.init.constant_(dead[0].bias, -100.0)
    assert activation_percentiles(dead, x) == {"1": 1.0}  # never active: a positive fallback threshold
    with pytest.raises(ValueError, match="percentile"):
        activation_percentiles(net, x, percentile=0.0)


# ------------------------------------------------------------------------------------------------ backbones / module
@pytest.mark.parametrize("backbone", ["vgg16", "resnet18"])
def test_cifar_backbones_forward_and_convert(backbone: str) -> None:
    """Check that vgg16 and resnet18 on 3×32×32 give (2, 10) logits and their SNN (steps, 2, 10) outputs."""
    torch.manual_seed(0)
    model = ECLClassifier(backbone=backbone, in_shape=[3, 32, 32])
    x = torch.rand(2, 3, 32, 32)
    assert model(x).shape == (2, 10)
    snn = model.to_snn()
    assert snn.predict(x, steps=2).shape == (2, 2, 10)
    assert len(snn.neurons) == len(model.thresholds) == {"vgg16": 15, "resnet18": 17}[backbone]


def test_resnet18_has_an_activation_after_every_residual_addition() -> None:
    """Check that resnet18 has 17 activation modules and each block's act2 receives the residual sum."""
    torch.manual_seed(0)
    net = build_backbone("resnet18", [3, 16, 16], 10, lambda: ClipQuantActivation(4.0)).eval()
    acts = [m for m in net.modules() if isinstance(m, ClipQuantActivation)]
    blocks = [m for m in net.modules() if isinstance(m, BasicBlock)]
    assert len(acts) == len({id(a) for a in acts}) == 17 and len(blocks) == 8
    seen: dict[int, tuple[Tensor, Tensor]] = {}
    handles = [
        block.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, (i[0], seen[k][1])))
        for k, block in enumerate(blocks)
    ] + [
        block.act2.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, (None, i[0])))
        for k, block in enumerate(blocks)
    ]
    with torch.no_grad():
        net(torch.rand(2, 3, 16, 16))
        for handle in handles:
            handle.remove()
        for k, block in enumerate(blocks):
            x, act_input = seen[k]
            residual = block.bn2(block.conv2(block.act1(block.bn1(block.conv1(x)))))
            torch.testing.assert_close(act_input, residual + block.shortcut(x))
    assert sum(not isinstance(b.shortcut, nn.Identity) for b in blocks) == 3  # the stride-2 stages project


def test_module_and_backbone_errors() -> None:
    """Check that unknown backbones suggest a close name, and wrong shapes and activations raise ValueError."""
    with pytest.raises(ValueError, match=r"unknown backbone 'resnet' \(did you mean 'resnet18'\?\)"):
        build_backbone("resnet", [3, 32, 32], 10, nn.ReLU)
    with pytest.raises(ValueError, match=r"did you mean 'cnn_small'"):
        ECLClassifier(backbone="cnn_smal")
    model = ECLClassifier()
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\)"):
        model(torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match="`activation` to be one of 'clip_floor', 'clip', 'relu', but got 'gelu'"):
        ECLClassifier(activation="gelu")


def test_relu_network_needs_calibration() -> None:
    """Check that a ReLU ECLClassifier's to_snn needs calibration, calibrates on it, and defaults to naive neurons."""
    model = ECLClassifier(backbone="mlp", activation="relu")
    assert model.thresholds == {}
    with pytest.raises(ValueError, match="calibration"):
        model.to_snn()
    x = torch.rand(64, 1, 8, 8)
    snn = model.to_snn(calibration=x, v0_ratio=0.5, dual=True)
    assert {n: float(t.threshold) for n, t in snn.neurons.items()} == pytest.approx(
        activation_percentiles(model.net, x, 99.9)
    )
    assert all(n.v0_ratio == 0.5 and n.dual for n in snn.neurons.values())  # explicit arguments win
    # Unspecified, the naive conversion's own defaults apply (v(0) = 0, single threshold), not ECL's init arguments;
    # likewise for a clip network converted with a calibration percentile.
    clip = ECLClassifier(backbone="mlp")
    for naive in (model.to_snn(calibration=x), clip.to_snn(calibration=x, percentile=99.0)):
        assert all(n.v0_ratio == 0.0 and not n.dual for n in naive.neurons.values())
    assert clip.to_snn(calibration=x, percentile=99.0).neurons["2"].threshold == pytest.approx(
        activation_percentiles(clip.net, x, 99.0)["2"]
    )


def test_make_optimizer_decays_lambdas_with_a_cosine_over_the_epochs() -> None:
    """Check that the λs are in SGD with weight decay (a zero-gradient step shrinks them) and T_max = epochs."""
    model = ECLClassifier(backbone="mlp", lr=0.1, weight_decay=5e-4)
    opt, sched = model.make_optimizer(7)
    assert isinstance(opt, torch.optim.SGD) and sched.T_max == 7
    lambdas = [m.threshold for m in model.net.modules() if isinstance(m, ClipQuantActivation)]
    in_opt = {id(p) for group in opt.param_groups for p in group["params"]}
    assert len(lambdas) == 4 and all(id(lam) in in_opt for lam in lambdas)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = [float(lam) for lam in lambdas]
    opt.step()
    for lam, old in zip(lambdas, before):
        assert float(lam) == pytest.approx(old * (1 - 0.1 * 5e-4), rel=1e-6)
    assert model.make_optimizer(0)[1].T_max == 1


def test_configure_optimizers_runs_the_cosine_over_max_epochs(tmp_path) -> None:
    """Check that under a Trainer the cosine's T_max is max_epochs and it steps once per epoch."""
    model = ECLClassifier(backbone="mlp", lr=0.1)
    trainer = Trainer(
        max_epochs=3,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, ImageDataModule(batch_size=32))
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.T_max == 3 and scheduler.last_epoch == 3
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # cos(π) at the end


def test_spiking_network_refuses_nan_and_wrong_shapes_and_impossible_arguments() -> None:
    """Check the one-line refusals the issue listed: a NaN image (a neuron never fires on NaN, so the SNN answered
    class 6 silently), 3-channel images into the 1-channel network, percentile 0 (used to mean 99.9), v(0) = 5θ."""
    model = ECLClassifier()
    snn = model.to_snn()
    x = torch.rand(3, 1, 8, 8)
    x[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="1 of 3 inputs hold NaN or inf"):
        snn.predict(x, steps=2)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\), got \(2, 3, 8, 8\)"):
        snn.predict(torch.rand(2, 3, 8, 8), steps=2)
    relu = ECLClassifier(activation="relu")
    with pytest.raises(ValueError, match=r"`percentile` to be a finite float in \(0, 100\] or None, but got 0"):
        relu.to_snn(calibration=torch.rand(8, 1, 8, 8), percentile=0)
    with pytest.raises(ValueError, match=r"`v0_ratio` to be a finite float in \[0, 1\), but got 5"):
        ECLClassifier(v0_ratio=5)
    with pytest.raises(ValueError, match=r"`v0_ratio` to be a finite float in \[0, 1\) or None, but got 5"):
        model.to_snn(v0_ratio=5)
    with pytest.raises(ValueError, match="`levels` to be an int >= 1, but got 0"):
        ECLClassifier(levels=0)


# --- pinned to QCFS's official code (tests/fixtures/reference/snn-ecl; ECL has none) -------------------------------


def test_clip_floor_activation_matches_qcfs_myfloor_forward_and_gradients(reference) -> None:
    """Check ClipQuantActivation(λ = 2.5, L = 4) against QCFS's MyFloor(up=2.5, t=4) (putshua/SNN_conversion_QCFS at
    c27a446): the outputs and both gradients (the identity-backward floor gives ∂/∂x = 1 inside the range and the
    λ-gradient ⌊u⌋/L − x/λ there, 1 above it). The fixture's upstream gradient is 0 where the floored value is exactly
    0 or 1: there torch.clamp's boundary subgradient decides, and it changed between torch releases (the zoo keeps
    QCFS-era torch's closed range, ClipQuantActivation's comment)."""
    ref = reference("snn-ecl", "myfloor")
    act = ClipQuantActivation(float(ref["up"]), int(ref["t"])).double()
    x = torch.from_numpy(ref["x"]).requires_grad_(True)
    y = act(x)
    (y * torch.from_numpy(ref["upstream"])).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ref["y"], atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), ref["grad_x"], atol=1e-12)
    np.testing.assert_allclose(act.threshold.grad.numpy().reshape(-1), ref["grad_up"].reshape(-1), atol=1e-10)


def test_single_threshold_neuron_with_half_start_matches_qcfs_scaled_neuron(reference) -> None:
    """Check DualThresholdIFNeuron(θ, v0_ratio=½, dual=False), the QCFS neuron, against QCFS's ScaledNeuron
    (spikingjelly's soft-reset IFNode with the 0.5 precharge) step by step on (12, 40) currents, some negative, some
    above θ."""
    ref = reference("snn-ecl", "scaled_neuron")
    neuron = DualThresholdIFNeuron(float(ref["theta"]), v0_ratio=0.5, dual=False)
    out = neuron.multi_step(torch.from_numpy(ref["inputs"]).float())
    np.testing.assert_allclose(out.numpy(), ref["outputs"], atol=1e-5)


def test_reproduction_arms_convert_the_networks_they_say() -> None:
    """Check the reproduction's arms: every claim names arms the run has, ECL and QCFS differ only in the dual
    threshold, the no-clip ablation is a ReLU network with ECL's neuron, and every arm's neurons are configured as
    named (v(0), dual) after conversion."""
    from zoo.models.snn_ecl.reproduce import ANNS, ARMS, CLAIMS

    for claim in CLAIMS:
        assert {claim.method, *claim.all_stand_ins} <= set(ARMS), claim.name
    assert ARMS["ecl"][0] == ARMS["qcfs"][0] and ARMS["ecl"][1]["dual"] and not ARMS["qcfs"][1]["dual"]
    assert ANNS[ARMS["no-clip"][0]]["activation"] == "relu" and ARMS["no-clip"][1]["dual"]
    models = {name: ECLClassifier(**args) for name, args in ANNS.items()}
    x = torch.rand(16, 1, 8, 8)
    for arm, (name, kwargs) in ARMS.items():
        snn = models[name].to_snn(calibration=x if "percentile" in kwargs else None, **kwargs)
        neurons = list(snn.neurons.values())
        assert neurons and all(n.dual == kwargs["dual"] and n.v0_ratio == kwargs["v0_ratio"] for n in neurons), arm
