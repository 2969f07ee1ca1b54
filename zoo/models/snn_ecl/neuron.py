"""The SNN side of ECL: an integrate-and-fire neuron with soft reset, a chosen initial membrane potential and a
negative threshold that takes back spikes the later input contradicts."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.arguments import check_range

__all__ = ["DualThresholdIFNeuron"]


class DualThresholdIFNeuron(nn.Module):
    """Multi-step dual-threshold integrate-and-fire neuron (ECL §2.3–2.4), simulated for a whole batch at once.

    Per step, with membrane ``v`` (starts at ``v0_ratio·θ``) and net spike count ``N`` (starts at 0):
    ``m = v + input``; a positive spike (``s = +1``, ``m -= θ``) if ``m ≥ θ``; else, with ``dual``, a negative spike
    (``s = −1``, ``m += θ``) if ``m < neg_threshold·θ`` and ``N > 0``; then ``v = m``, ``N += s``. The output is
    ``s·θ``. With ``neg_threshold = 0`` and per-step input in [−θ, θ], the cumulative output after t steps is exactly
    ``θ·max(0, ⌊S_t/θ + ½⌋)`` (``S_t`` the cumulative input): the rounding the clip-floor activation (φ = ½) trained for.
    ``dual=False, v0_ratio=0`` is the classical IF neuron of naive conversion; ``dual=False, v0_ratio=0.5`` is
    QCFS's.

    Inputs arrive as ``(steps·B, ...)`` (time-major, the layout of a multi-step network whose stateless layers run
    on all steps at once); ``steps`` is set by :class:`~zoo.models.snn_ecl.convert.SpikingNetwork`. State persists
    across calls until :meth:`reset`, so a long simulation can run in chunks of steps.

    Args:
        threshold: θ (> 0): λ of the activation it replaces, or a calibrated percentile.
        v0_ratio: initial membrane potential as a fraction of θ (ECL: ½).
        dual: emit negative spikes.
        neg_threshold: θ⁻ as a ratio of θ, ≤ 0, in the coordinates where v starts at ``v0_ratio·θ`` (0: negative spike
            when ``m < 0``; the rounding identity holds only for 0).

    Example:
        >>> neuron = DualThresholdIFNeuron(1.0)
        >>> out = neuron.multi_step(torch.tensor([[0.6], [0.6], [-0.9]]))  # steps × batch
        >>> out.flatten().tolist(), neuron.count.tolist()
        ([1.0, 0.0, -1.0], [0.0])
    """

    def __init__(
        self, threshold: float | Tensor, v0_ratio: float = 0.5, dual: bool = True, neg_threshold: float = 0.0
    ) -> None:
        super().__init__()
        threshold = torch.as_tensor(threshold, dtype=torch.float32).detach().clone()
        if threshold.numel() != 1 or not float(threshold) > 0:
            raise ValueError(f"threshold must be one positive number, got {threshold.tolist()}")
        check_range("v0_ratio", v0_ratio, 0.0, 1.0, high_open=True)  # v(0) in [0, θ): a neuron at θ fires at once
        check_range("neg_threshold", neg_threshold, -1.0, 0.0)  # a ratio of θ, at or below the reset point
        self.register_buffer("threshold", threshold)
        self.v0_ratio, self.dual, self.neg_threshold = float(v0_ratio), bool(dual), float(neg_threshold)
        self.steps = 1
        self.calls = 0
        self.reset()

    def reset(self) -> None:
        """Forget the membrane potentials, spike counts and firing statistics (call between inputs)."""
        self.v: Tensor | None = None
        self.count: Tensor | None = None
        self.spike_total: Tensor | float = 0.0  # |spikes| emitted since reset, for firing rates
        self.neuron_steps = 0  # neurons × steps simulated since reset

    @torch.no_grad()
    def multi_step(self, x: Tensor) -> Tensor:
        """Run ``steps = x.shape[0]`` steps on ``x`` of shape ``(steps, B, ...)``; returns the outputs ``s·θ``."""
        theta = float(self.threshold)
        if self.v is None or self.v.shape != x.shape[1:]:
            self.v = torch.full_like(x[0], self.v0_ratio * theta)
            self.count = torch.zeros_like(x[0])
        v, count = self.v, self.count
        neg = self.neg_threshold * theta
        spikes = torch.empty_like(x)
        # A loop over time is inherent to the neuron (each step depends on the last); every step is a few in-place
        # tensor operations over all samples and neurons (2.5x faster than allocating ones; tests/benchmarks/bench_snn.py).
        for t in range(x.shape[0]):
            s = spikes[t]
            v.add_(x[t])
            torch.ge(v, theta, out=s)  # +1 where m ≥ θ
            if self.dual:  # m ≥ θ and m < θ⁻·θ ≤ 0 exclude each other, so s ends as +1, −1 or 0
                s.sub_(((v < neg) & (count > 0)).to(s.dtype))
                count.add_(s)
            v.sub_(s, alpha=theta)
        if not self.dual:
            count.add_(spikes.sum(0))
        self.spike_total = self.spike_total + spikes.abs().sum()  # a tensor: no host sync per call
        self.neuron_steps += spikes.numel()
        return spikes.mul_(theta)

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.multi_step(x.reshape(self.steps, -1, *x.shape[1:])).flatten(0, 1)

    @property
    def firing_rate(self) -> float:
        """Spikes (either sign) per neuron per step since the last reset."""
        return float(self.spike_total) / max(self.neuron_steps, 1)

    def extra_repr(self) -> str:
        return (
            f"threshold={float(self.threshold):.4g}, v0_ratio={self.v0_ratio}, dual={self.dual}, "
            f"neg_threshold={self.neg_threshold}"
        )
