"""ANN → SNN conversion: swap every activation for a spiking neuron, max-pooling for average pooling, and simulate
the result for T steps as a multi-step network (stateless layers run on all steps at once)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from zoo.models.snn_ecl.activation import ClipQuantActivation
from zoo.models.snn_ecl.neuron import DualThresholdIFNeuron

__all__ = ["SpikingNetwork", "activation_percentiles", "convert", "naive_convert"]

# Layers that act on every time step independently and linearly in the spikes (or are identities in eval mode).
_STATELESS = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Linear,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.Flatten,
    nn.Identity,
    nn.Dropout,
)
_ACTIVATIONS = (nn.ReLU, ClipQuantActivation)


def _activations(net: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in net.named_modules() if isinstance(m, _ACTIVATIONS)}


def _check_layers(net: nn.Module) -> None:
    for name, m in net.named_modules():
        if isinstance(m, _ACTIVATIONS + _STATELESS + (nn.MaxPool2d, nn.AdaptiveMaxPool2d, DualThresholdIFNeuron)):
            continue
        if next(m.children(), None) is None:  # a leaf the converter does not know
            raise ValueError(
                f"cannot convert layer {name or '<root>'!r} ({type(m).__name__}) to a spiking network: supported are "
                "ReLU and ClipQuantActivation (→ neurons), max-pooling (→ average pooling), and "
                f"{', '.join(t.__name__ for t in _STATELESS)}"
            )


def _swap(net: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(net.get_submodule(parent_name) if parent_name else net, child, new)


class SpikingNetwork(nn.Module):
    """A converted network of :class:`DualThresholdIFNeuron`\\ s, run for ``steps`` time steps on analog input.

    The input image is fed at every step (direct encoding); the last layer has no neuron, and its outputs are the
    per-step logits, averaged over steps for the prediction. States are reset at every :meth:`forward`. The network
    always runs in eval mode (BatchNorm with its running statistics, as an affine layer before the neuron).

    Example:
        >>> ann = nn.Sequential(nn.Linear(4, 8), ClipQuantActivation(1.0), nn.Linear(8, 3))
        >>> snn = convert(ann)
        >>> snn(torch.rand(5, 4), steps=16).shape  # (steps, batch, classes), per-step logits
        torch.Size([16, 5, 3])
    """

    def __init__(self, net: nn.Module, in_shape: tuple[int, ...] | list[int] | None = None) -> None:
        super().__init__()
        self.net = net.eval()
        self.in_shape = tuple(in_shape) if in_shape is not None else None

    def train(self, mode: bool = True) -> SpikingNetwork:
        return super().train(False)  # BatchNorm in train mode would mix the statistics of time steps and samples

    @property
    def neurons(self) -> dict[str, DualThresholdIFNeuron]:
        """The spiking layers by name (the names of the activations they replaced)."""
        return {name: m for name, m in self.net.named_modules() if isinstance(m, DualThresholdIFNeuron)}

    def reset(self) -> None:
        for neuron in self.neurons.values():
            neuron.reset()

    def forward(self, x: Tensor, steps: int, chunk: int | None = None) -> Tensor:
        """Per-step outputs ``(steps, B, ...)`` for input ``x`` ``(B, ...)`` fed at every step.

        Args:
            x: a batch of analog inputs.
            steps: T ≥ 1 time steps.
            chunk: steps simulated per pass through the network (memory ∝ chunk·B; default all at once).
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer number of time steps, got {steps!r}")
        if self.in_shape is not None and tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"expected images of shape (B, {', '.join(map(str, self.in_shape))}), got "
                             f"{tuple(x.shape)}: the spiking network keeps its ANN's input shape")  # fmt: skip
        if not torch.isfinite(x).all():
            bad = int((~torch.isfinite(x)).flatten(1).any(1).sum())
            raise ValueError(f"{bad} of {len(x)} inputs hold NaN or inf: a neuron never crosses its threshold on NaN, "
                             "so the network would answer silently")  # fmt: skip
        chunk = steps if chunk is None else chunk
        if chunk < 1:
            raise ValueError(f"chunk must be ≥ 1, got {chunk}")
        self.reset()
        neurons = self.neurons
        outputs = []
        for start in range(0, steps, chunk):
            n = min(chunk, steps - start)
            for neuron in neurons.values():
                neuron.steps, neuron.calls = n, 0
            out = self.net(x.unsqueeze(0).expand(n, *x.shape).reshape(n * len(x), *x.shape[1:]))
            reused = [name for name, neuron in neurons.items() if neuron.calls != 1]
            if reused:
                raise ValueError(
                    f"spiking layers {reused} were called {[neurons[k].calls for k in reused]} times per pass: a "
                    "neuron holds state, so each activation call in the ANN's forward needs its own module"
                )
            outputs.append(out.reshape(n, len(x), *out.shape[1:]))
        return torch.cat(outputs)

    @torch.no_grad()
    def predict(self, x: Tensor, steps: int, chunk: int | None = None) -> Tensor:
        """Running mean of the logits after every step, ``(steps, B, C)``: row ``t−1`` is the prediction at T = t."""
        out = self(x, steps, chunk)
        return out.cumsum(0) / torch.arange(1, steps + 1, device=out.device, dtype=out.dtype).view(-1, 1, 1)

    def firing_rates(self) -> dict[str, float]:
        """Spikes per neuron per step of every spiking layer in the last simulation."""
        return {name: neuron.firing_rate for name, neuron in self.neurons.items()}


def convert(
    net: nn.Module,
    thresholds: Mapping[str, float] | None = None,
    v0_ratio: float = 0.5,
    dual: bool = True,
    neg_threshold: float = 0.0,
    in_shape: tuple[int, ...] | list[int] | None = None,
) -> SpikingNetwork:
    """Convert a trained ANN (a copy: ``net`` is untouched) into a :class:`SpikingNetwork`.

    Every ``ClipQuantActivation`` becomes a neuron with θ = its learned λ, every ``ReLU`` one with the threshold given
    in ``thresholds`` (by module name; :func:`naive_convert` calibrates them), every max-pooling an average pooling of
    the same geometry. Other layers must be stateless (convolutions, linear, BatchNorm, average pooling, flatten,
    dropout); anything else is refused by name.

    Args:
        net: the ANN.
        thresholds: θ per activation name, overriding λ (required for ReLU layers).
        v0_ratio: initial membrane potential / θ (ECL: ½; naive: 0).
        dual: dual-threshold neurons (ECL) or single-threshold IF neurons.
        neg_threshold: θ⁻ / θ of the dual neurons.
        in_shape: the shape of one input, checked at every simulation (the ANN's ``in_shape``).
    """
    _check_layers(net)
    thresholds = dict(thresholds or {})
    snn = copy.deepcopy(net)
    for name, act in _activations(snn).items():
        if name in thresholds:
            theta = float(thresholds[name])
        elif isinstance(act, ClipQuantActivation):
            theta = float(act.threshold.detach())
        else:
            raise ValueError(
                f"ReLU layer {name!r} has no threshold: pass thresholds={{name: θ}}, or calibrate them on training "
                "data with naive_convert(net, data)"
            )
        neuron = DualThresholdIFNeuron(theta, v0_ratio=v0_ratio, dual=dual, neg_threshold=neg_threshold)
        _swap(snn, name, neuron.to(next(net.parameters(), torch.empty(0)).device))
    for name, m in list(snn.named_modules()):
        if isinstance(m, nn.MaxPool2d):
            if m.dilation not in (1, (1, 1)):
                raise ValueError(f"cannot convert dilated max-pooling {name!r} to average pooling")
            _swap(snn, name, nn.AvgPool2d(m.kernel_size, m.stride, m.padding, ceil_mode=m.ceil_mode))
        elif isinstance(m, nn.AdaptiveMaxPool2d):
            _swap(snn, name, nn.AdaptiveAvgPool2d(m.output_size))
    return SpikingNetwork(snn, in_shape)


@torch.no_grad()
def activation_percentiles(
    net: nn.Module, data: Tensor | Iterable[Tensor], percentile: float = 99.9, max_values: int = 1 << 20, seed: int = 0
) -> dict[str, float]:
    """The ``percentile`` of every activation layer's outputs on ``data`` (a tensor or an iterable of batches).

    At most ``max_values`` outputs per layer are kept (a seeded uniform subsample per batch), so calibrating a
    ResNet on many CIFAR batches stays within memory. A layer whose percentile is 0 falls back to its maximum (1 if it
    never activates), since a neuron needs a positive threshold.
    """
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    batches = [data] if isinstance(data, Tensor) else data
    acts = _activations(net)
    if not acts:
        raise ValueError(f"{type(net).__name__} has no ReLU or ClipQuantActivation layer to calibrate")
    values: dict[str, list[Tensor]] = {name: [] for name in acts}
    g = torch.Generator().manual_seed(seed)
    budget = {"per_batch": max_values}

    def hook(name: str):  # noqa: ANN202
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            flat = output.detach().flatten().float().cpu()
            if flat.numel() > budget["per_batch"]:
                flat = flat[torch.randint(flat.numel(), (budget["per_batch"],), generator=g)]
            values[name].append(flat)

        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in acts.items()]
    was_training = net.training
    net.eval()
    try:
        batches = list(batches)
        budget["per_batch"] = max(max_values // max(len(batches), 1), 1)
        for batch in batches:
            net(batch)
    finally:
        for handle in handles:
            handle.remove()
        net.train(was_training)
    out = {}
    for name, chunks in values.items():
        flat = torch.cat(chunks)
        k = max(int(round(percentile / 100 * flat.numel())), 1)
        theta = float(flat.kthvalue(k).values)
        out[name] = theta if theta > 0 else (float(flat.max()) if flat.max() > 0 else 1.0)
    return out


def naive_convert(
    net: nn.Module,
    data: Tensor | Iterable[Tensor],
    percentile: float = 99.9,
    v0_ratio: float = 0.0,
    dual: bool = False,
    neg_threshold: float = 0.0,
    in_shape: tuple[int, ...] | list[int] | None = None,
) -> SpikingNetwork:
    """The classical baseline: thresholds = the ``percentile`` of each layer's training activations (data-based
    normalisation), v(0) = 0, single-threshold IF neurons with soft reset. Works on any ReLU network.

    Example:
        >>> ann = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> snn = naive_convert(ann, torch.rand(64, 4))
        >>> snn.predict(torch.rand(5, 4), steps=8).shape
        torch.Size([8, 5, 3])
    """
    thresholds = activation_percentiles(net, data, percentile)
    return convert(net, thresholds, v0_ratio=v0_ratio, dual=dual, neg_threshold=neg_threshold, in_shape=in_shape)
