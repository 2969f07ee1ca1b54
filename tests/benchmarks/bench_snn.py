"""Images/s of the converted spiking network at T = 4, against SpikingJelly's multi-step mode on the same network.

    pip install spikingjelly==2.0.0   # optional; only this script uses it
    python tests/benchmarks/bench_snn.py [--steps 4] [--repeats 5] [--threads 2]

Both run the hub's ``snn-ecl`` digits CNN converted to single-threshold soft-reset IF neurons with v(0) = 0 (the
neuron SpikingJelly's ``IFNode(v_reset=None)`` implements; their outputs are checked equal first) on the 500 test
images, every stateless layer on all T steps at once (SpikingJelly: ``SeqToANNContainer``), inference only. Also
timed: the zoo's ECL neuron (v(0) = θ/2, dual threshold), and a CIFAR-sized ResNet-18 at batch 32 (untrained; the
cost does not depend on the weights). Prints medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)
from torch import Tensor, nn

import zoo
from zoo.models.snn_ecl import DualThresholdIFNeuron, ECLClassifier, SpikingNetwork


class _Scale(nn.Module):
    """Multiply spikes by θ (the zoo's neurons output s·θ; SpikingJelly's output s)."""

    def __init__(self, theta: float) -> None:
        super().__init__()
        self.theta = theta

    def forward(self, x: Tensor) -> Tensor:
        return x * self.theta


def spikingjelly_twin(snn: SpikingNetwork) -> nn.Module:
    """The same layers in SpikingJelly's multi-step form: IFNode(v_threshold=θ, v_reset=None) for every neuron."""
    from spikingjelly.activation_based import layer, neuron

    def rebuild(module: nn.Module) -> nn.Module:
        if isinstance(module, DualThresholdIFNeuron):
            theta = float(module.threshold)
            node = neuron.IFNode(v_threshold=theta, v_reset=None, step_mode="m")
            return nn.Sequential(node, layer.SeqToANNContainer(_Scale(theta)))
        if isinstance(module, nn.Sequential):
            return nn.Sequential(*(rebuild(m) for m in module))
        if next(module.children(), None) is None:
            return layer.SeqToANNContainer(module)
        raise TypeError(f"this benchmark rebuilds plain Sequential networks only, not {type(module).__name__}")

    return rebuild(snn.net).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("snn-ecl")
    dm = zoo.datamodule("snn-ecl")
    dm.setup("test")
    x = dm.test_set.x
    T = args.steps
    single = model.to_snn(v0_ratio=0.0, dual=False)
    ecl = model.to_snn()
    rows = {
        "zoo, IF (v0 = 0, single)": len(x) / median_seconds(lambda: single(x, T), args.repeats),
        "zoo, ECL (v0 = θ/2, dual)": len(x) / median_seconds(lambda: ecl(x, T), args.repeats),
    }
    try:
        from spikingjelly.activation_based import functional
    except ImportError:
        print("spikingjelly is not installed: pip install spikingjelly==2.0.0 for the comparison")
    else:
        twin = spikingjelly_twin(single)

        @torch.no_grad()
        def run_sj() -> Tensor:
            functional.reset_net(twin)
            return twin(x.unsqueeze(0).expand(T, *x.shape).contiguous())

        same = torch.allclose(run_sj(), single(x, T), atol=1e-5)
        print(f"SpikingJelly twin gives the same per-step outputs: {same}")
        rows["SpikingJelly 2.0, IFNode multi-step"] = len(x) / median_seconds(run_sj, args.repeats)
    resnet = ECLClassifier(backbone="resnet18", in_shape=[3, 32, 32]).to_snn()
    cifar = torch.rand(32, 3, 32, 32)
    rows["zoo, ECL ResNet-18 32×32 (batch 32)"] = len(cifar) / median_seconds(lambda: resnet(cifar, T), 1)
    print(f"T = {T}, {args.threads} threads, median of {args.repeats} runs")
    for name, rate in rows.items():
        print(f"  {name:40s} {rate:10,.0f} images/s")


if __name__ == "__main__":
    main()
