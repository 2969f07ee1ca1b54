"""LoRA timestep experts (TimeStep Master, Zhuang et al., ICML 2025) for any diffusers denoiser.

Each adapted ``nn.Linear`` / ``nn.Conv2d`` of a frozen denoiser gets, for every scale j of ``scales = (n_1 > … > n_m)``,
``n_j`` LoRA experts, one per equal interval of the timesteps [0, T). For a 0-indexed timestep t the expert of scale
j is ``floor(t · n_j / T)``.

* **Fostering** (stage 1, ``set_stage("foster", scale=j)``): only scale j's experts act, each sample through the expert
  of its own interval; training timesteps are drawn inside one interval, or over [0, T) so that each expert learns
  from its own samples.
* **Assembling** (stage 2, ``set_stage("assemble")``): the finest scale's expert is the ungated *core*; each coarser
  scale adds its expert times a gate from the router G(z_t, t) = F(z_t) + ε(t) (a linear map of the layer's input per
  token / pixel, plus a learned row per timestep; no activation by default). Only the router trains.

Routing is per sample: the experts' weights are gathered with the batch's expert indices and applied in one
``einsum`` (Linear) or one stacked convolution (Conv2d), with no Python loop over samples. The timestep comes from
the denoiser call itself: :func:`inject_timestep_experts` registers a forward pre-hook on the model that reads its
``timestep`` argument (positional or keyword; an int, a 0-d or a ``(B,)`` tensor) and hands it to every adapted layer.

peft has LoRA but no timestep routing, so the mixture is written here; :func:`load_peft_expert` copies a peft LoRA
adapter trained on one interval into its expert slot.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "TimestepExpertsConv2d",
    "TimestepExpertsLinear",
    "expert_index",
    "inject_timestep_experts",
    "interval_bounds",
    "load_peft_expert",
    "timestep_row",
]

Stage = Literal["base", "foster", "assemble"]
GateActivation = Literal["none", "sigmoid", "softmax"]


def expert_index(t: Tensor, n: int, num_timesteps: int = 1000, check: bool = True) -> Tensor:
    """The 0-indexed interval ``floor(t · n / T)`` of each timestep in ``t`` (floats are floored first).

    Timesteps lie in [0, T]: float ones come from Euler and flow-matching schedulers
    (``FlowMatchEulerDiscreteScheduler`` starts at t = T = 1000.0), and t = T lands in the last interval with T − 1.
    Raises ``ValueError`` outside [0, T] (``check=False`` skips the test, which reads the tensor back to the host: the
    layers route with it off, after the model's pre-hook checked the call's timesteps once).

    Example:
        >>> expert_index(torch.tensor([0, 249, 250, 999]), 4).tolist()
        [0, 0, 1, 3]
        >>> expert_index(torch.tensor([999.5, 1000.0]), 4).tolist()
        [3, 3]
    """
    t = timestep_row(t, num_timesteps, check)
    return t * n // num_timesteps


def timestep_row(t: Tensor, num_timesteps: int = 1000, check: bool = True) -> Tensor:
    """Integer timesteps in [0, T): floats floored, t = T (a flow-matching start) clamped to T − 1, as ``long``."""
    if check and t.numel():
        low, high = float(t.min()), float(t.max())
        if low < 0 or high > num_timesteps:
            raise ValueError(f"timesteps must lie in [0, {num_timesteps}], got {low:g}…{high:g}")
    t = t.floor().long() if t.is_floating_point() else t.long()
    return t.clamp(max=num_timesteps - 1)


def interval_bounds(n: int, num_timesteps: int = 1000) -> list[tuple[int, int]]:
    """The integer timesteps ``[lo, hi)`` that :func:`expert_index` routes to each of ``n`` experts.

    ``lo_i = ceil(i · T / n)``, the first t with ``floor(t · n / T) = i``; ``i · T // n`` would disagree with the
    routing wherever n does not divide T (n = 3: t = 333 routes to expert 0, not 1).

    Example:
        >>> interval_bounds(3, 1000)
        [(0, 334), (334, 667), (667, 1000)]
    """
    edges = [-(-i * num_timesteps // n) for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:]))


class _TimestepExperts(nn.Module):
    """What the Linear and Conv2d wrappers share: scales, stage, the router and the per-sample timesteps."""

    base: nn.Module

    def __init__(
        self,
        base: nn.Module,
        in_features: int,
        scales: Sequence[int],
        rank: int,
        alpha: float | None,
        num_timesteps: int,
        gate_activation: GateActivation,
    ) -> None:
        super().__init__()
        scales = tuple(int(n) for n in scales)
        if not scales or any(n < 1 for n in scales) or list(scales) != sorted(set(scales), reverse=True):
            raise ValueError(f"scales must be distinct positive interval counts, finest first, got {scales}")
        if rank < 1:
            raise ValueError(f"rank must be ≥ 1, got {rank}")
        if gate_activation not in ("none", "sigmoid", "softmax"):
            raise ValueError(f"gate_activation must be 'none', 'sigmoid' or 'softmax', got {gate_activation!r}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.scales, self.rank, self.num_timesteps = scales, rank, num_timesteps
        self.scaling = (alpha if alpha is not None else rank) / rank
        self.gate_activation = gate_activation
        contexts = len(scales) - 1
        # Zero-initialised router: stage 2 starts exactly at "core experts only".
        self.router = nn.Linear(in_features, contexts) if contexts else None
        self.time_gate = nn.Embedding(num_timesteps, contexts) if contexts else None
        if contexts:
            nn.init.zeros_(self.router.weight)
            nn.init.zeros_(self.router.bias)
            nn.init.zeros_(self.time_gate.weight)
        self.stage: Stage = "foster"
        self._check_timesteps = True
        self.active_scale = 0
        self.timesteps: Tensor | None = None

    def set_stage(self, stage: Stage, scale: int = 0) -> None:
        """``"foster"`` (only scale ``scale``'s experts), ``"assemble"`` (core + gated context) or ``"base"``."""
        if stage not in ("base", "foster", "assemble"):
            raise ValueError(f"stage must be 'base', 'foster' or 'assemble', got {stage!r}")
        if not 0 <= scale < len(self.scales):
            raise ValueError(f"scale must index one of {self.scales}, got {scale}")
        self.stage, self.active_scale = stage, scale

    def _batch_timesteps(self, batch: int) -> Tensor:
        if self.timesteps is None:
            raise RuntimeError(
                "no timestep: call the model that inject_timestep_experts wrapped (its forward passes the timestep "
                "to this layer), or set layer.timesteps"
            )
        t = self.timesteps
        if len(t) == batch:
            return t
        if len(t) == 1 or batch % len(t) == 0:  # one t for all, or a batch doubled after t was built (CFG)
            return t.repeat_interleave(batch // len(t)) if len(t) > 1 else t.expand(batch)
        raise ValueError(f"{len(t)} timesteps for a batch of {batch}")

    def gates(self, x: Tensor, t: Tensor, channel_dim: int, size: Sequence[int] | None = None) -> Tensor:
        """G(z_t, t) = F(z_t) + ε(t), per token / pixel: ``(m − 1)`` gates on ``channel_dim``'s position.

        ``t`` may be float (Euler / flow-matching schedulers): ε reads the row of ``floor(t)``. ``size``: the spatial
        size of the layer's output, when a convolution's stride or padding changes it; F(z_t) is then averaged over
        each output pixel's input region (``adaptive_avg_pool2d``; F is linear, so this is F of the mean input).
        """
        eps = self.time_gate(timestep_row(t, self.num_timesteps, check=False))
        linear = self.router(x.movedim(channel_dim, -1)).movedim(-1, channel_dim)
        if size is not None and tuple(linear.shape[2:]) != tuple(size):
            linear = nn.functional.adaptive_avg_pool2d(linear, tuple(size))
        g = linear.movedim(channel_dim, -1) + eps.view(len(t), *([1] * (linear.dim() - 2)), -1)
        if self.gate_activation == "sigmoid":
            g = g.sigmoid()
        elif self.gate_activation == "softmax":
            g = g.softmax(-1)
        return g.movedim(-1, channel_dim)

    channel_dim = -1

    def _project(self, x: Tensor, scales: list[int], indices: list[Tensor]) -> list[Tensor]:  # pragma: no cover
        """A_j x through each sample's expert, for every scale in ``scales``: rank-r features per scale."""
        raise NotImplementedError

    def _expand(self, h: Tensor, b: Tensor) -> Tensor:  # pragma: no cover
        """B h, with ``b`` the samples' gathered B matrices ``(B, d, r')``."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if self.stage == "base":
            return out
        t = self._batch_timesteps(x.shape[0])
        scales = [self.active_scale] if self.stage == "foster" else list(range(len(self.scales)))
        indices = [expert_index(t, self.scales[j], self.num_timesteps, check=self._check_timesteps) for j in scales]
        self._check_timesteps = True  # the pre-hook clears it for the call it has checked
        hs = self._project(x, scales, indices)
        if self.stage == "assemble" and len(scales) > 1:
            # G ⊙ (B h) = B (G ⊙ h) for a gate per token / pixel: gate the rank-r features, then one B product for
            # the core and every context expert together.
            g = self.gates(x, t, self.channel_dim, hs[0].shape[2:] if self.channel_dim == 1 else None)
            hs = [hs[0], *(h * g.narrow(self.channel_dim, j - 1, 1) for j, h in enumerate(hs[1:], start=1))]
        h = torch.cat(hs, dim=self.channel_dim)
        b = torch.cat([self.lora_B[j][i] for j, i in zip(scales, indices)], dim=-1).to(x.dtype)  # (B, d, Σ r)
        return out + self.scaling * self._expand(h, b)

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if name.startswith(("lora_A", "lora_B"))]

    def router_parameters(self) -> list[nn.Parameter]:
        return [] if self.router is None else [*self.router.parameters(), *self.time_gate.parameters()]


class TimestepExpertsLinear(_TimestepExperts):
    """LoRA timestep experts around an ``nn.Linear``: ``A[j]`` ``(n_j, r, k)`` (Kaiming), ``B[j]`` ``(n_j, d, r)`` (0).

    Example:
        >>> layer = TimestepExpertsLinear(nn.Linear(8, 6), scales=(4, 2, 1), rank=2)
        >>> layer.timesteps = torch.tensor([0, 999, 500])
        >>> x = torch.randn(3, 5, 8)
        >>> torch.equal(layer(x), layer.base(x))  # B = 0: exactly the base layer
        True
    """

    def __init__(
        self,
        base: nn.Linear,
        scales: Sequence[int] = (8, 4, 2, 1),
        rank: int = 4,
        alpha: float | None = None,
        num_timesteps: int = 1000,
        gate_activation: GateActivation = "none",
    ) -> None:
        super().__init__(base, base.in_features, scales, rank, alpha, num_timesteps, gate_activation)
        k, d = base.in_features, base.out_features
        self.lora_A = nn.ParameterList(nn.Parameter(torch.empty(n, rank, k)) for n in self.scales)
        self.lora_B = nn.ParameterList(nn.Parameter(torch.zeros(n, d, rank)) for n in self.scales)
        for a in self.lora_A:
            for i in range(len(a)):  # peft's LoRA A init, per expert
                nn.init.kaiming_uniform_(a.data[i], a=math.sqrt(5))

    def _project(self, x: Tensor, scales: list[int], indices: list[Tensor]) -> list[Tensor]:
        a = torch.cat([self.lora_A[j][i] for j, i in zip(scales, indices)], dim=1).to(x.dtype)  # (B, Σ r, k)
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        h = torch.einsum("blk,brk->blr", flat, a).reshape(*x.shape[:-1], a.shape[1])
        return list(h.split(self.rank, dim=-1))

    def _expand(self, h: Tensor, b: Tensor) -> Tensor:
        flat = h.reshape(h.shape[0], -1, h.shape[-1])
        return torch.einsum("blr,bdr->bld", flat, b).reshape(*h.shape[:-1], b.shape[1])


class TimestepExpertsConv2d(_TimestepExperts):
    """LoRA timestep experts around an ``nn.Conv2d``, in peft's conv-LoRA form: A is a k→r convolution with the base
    layer's kernel, stride and padding, B a 1×1 r→d convolution. All experts of a scale run as one stacked
    convolution; each sample then keeps the r channels of its own expert.

    Example:
        >>> layer = TimestepExpertsConv2d(nn.Conv2d(3, 4, 3, padding=1), scales=(2, 1), rank=2)
        >>> layer.timesteps = torch.tensor([10, 900])
        >>> _ = layer.lora_B[0].data.normal_()
        >>> layer.set_stage("foster", scale=0)
        >>> layer(torch.randn(2, 3, 8, 8)).shape
        torch.Size([2, 4, 8, 8])
    """

    def __init__(
        self,
        base: nn.Conv2d,
        scales: Sequence[int] = (8, 4, 2, 1),
        rank: int = 4,
        alpha: float | None = None,
        num_timesteps: int = 1000,
        gate_activation: GateActivation = "none",
    ) -> None:
        if base.groups != 1:
            raise ValueError("timestep experts support ungrouped convolutions only (groups=1)")
        super().__init__(base, base.in_channels, scales, rank, alpha, num_timesteps, gate_activation)
        k, d, kernel = base.in_channels, base.out_channels, base.kernel_size
        self.lora_A = nn.ParameterList(nn.Parameter(torch.empty(n, rank, k, *kernel)) for n in self.scales)
        self.lora_B = nn.ParameterList(nn.Parameter(torch.zeros(n, d, rank)) for n in self.scales)
        for a in self.lora_A:
            for i in range(len(a)):
                nn.init.kaiming_uniform_(a.data[i], a=math.sqrt(5))

    channel_dim = 1

    def _project(self, x: Tensor, scales: list[int], indices: list[Tensor]) -> list[Tensor]:
        # Every expert of the scales asked for runs in one convolution; each sample keeps its own experts' channels.
        a = torch.cat([self.lora_A[j].flatten(0, 1) for j in scales]).to(x.dtype)  # (Σ n_j r, k, kh, kw)
        base = self.base
        h = nn.functional.conv2d(x, a, None, base.stride, base.padding, base.dilation)
        rows, out, start = torch.arange(x.shape[0], device=x.device), [], 0
        for j, index in zip(scales, indices):
            n = self.scales[j]
            block = h[:, start : start + n * self.rank].view(x.shape[0], n, self.rank, *h.shape[2:])
            out.append(block[rows, index])  # (B, r, H, W)
            start += n * self.rank
        return out

    def _expand(self, h: Tensor, b: Tensor) -> Tensor:
        return torch.einsum("brhw,bdr->bdhw", h, b)


def _call_arguments(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The denoiser call's arguments by name: UNets take ``(sample, timestep, ...)`` but transformers take
    ``(hidden_states, encoder_hidden_states, [pooled_projections,] timestep, ...)``, so position 1 is not always t."""
    return dict(signature.bind_partial(*args, **kwargs).arguments)


def _timestep_from_call(arguments: dict[str, Any], batch: int) -> Tensor:
    t = arguments.get("timestep")
    if t is None:
        raise ValueError("the denoiser was called without a timestep (its `timestep` argument, by position or name)")
    t = torch.as_tensor(t)
    t = t.reshape(-1) if t.dim() else t.reshape(1)
    return t.expand(batch) if len(t) == 1 else t


def inject_timestep_experts(
    model: nn.Module,
    target_modules: Sequence[str],
    scales: Sequence[int] = (8, 4, 2, 1),
    rank: int = 4,
    alpha: float | None = None,
    num_timesteps: int = 1000,
    gate_activation: GateActivation = "none",
) -> dict[str, _TimestepExperts]:
    """Replace the Linear / Conv2d modules of ``model`` whose names end with one of ``target_modules`` (peft's
    matching rule) by timestep-expert wrappers, and register the pre-hook that passes each call's timestep to them.

    The base weights are frozen. Returns the wrappers by module name.

    Raises:
        ValueError: a target that matches no Linear / Conv2d (with the closest module names).

    Example:
        >>> from diffusers import UNet2DModel
        >>> unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
        ...                    block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        ...                    up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)
        >>> experts = inject_timestep_experts(unet, ["to_q", "to_v"], scales=(4, 2, 1), rank=2)
        >>> len(experts), unet(torch.randn(2, 1, 8, 8), torch.tensor([3, 800])).sample.shape
        (8, torch.Size([2, 1, 8, 8]))
    """
    names = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    wrapped: dict[str, _TimestepExperts] = {}
    for target in target_modules:
        matches = [n for n in names if n == target or n.endswith("." + target)]
        if not matches:
            close = difflib.get_close_matches(target, sorted({n.rsplit(".", 1)[-1] for n in names}), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"target module {target!r} matches no Linear or Conv2d of {type(model).__name__}{hint}")
        for name in matches:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            base = getattr(parent, child)
            cls = TimestepExpertsLinear if isinstance(base, nn.Linear) else TimestepExpertsConv2d
            layer = cls(base, scales, rank, alpha, num_timesteps, gate_activation)
            layer.to(device=base.weight.device)
            setattr(parent, child, layer)
            wrapped[name] = layer

    signature = inspect.signature(model.forward)
    if "timestep" not in signature.parameters:
        raise ValueError(
            f"{type(model).__name__}.forward has no `timestep` argument: timestep experts need a denoiser called "
            "with its timestep (diffusers' UNets and transformers are)"
        )
    first = next(iter(signature.parameters))  # the noisy sample: `sample` (UNets) or `hidden_states` (transformers)

    def hand_over_timestep(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        arguments = _call_arguments(signature, args, kwargs)
        sample = arguments[first]
        t = _timestep_from_call(arguments, sample.shape[0]).to(sample.device)
        expert_index(t, 1, num_timesteps)  # one range check (one host read) per call instead of one per layer
        # The layers are looked up on the module called, so a deep copy of the model (an EMA) routes its own.
        for layer in module.modules():
            if isinstance(layer, _TimestepExperts):
                layer.timesteps, layer._check_timesteps = t, False

    model.register_forward_pre_hook(hand_over_timestep, with_kwargs=True)
    return wrapped


def load_peft_expert(
    experts: dict[str, _TimestepExperts],
    peft_state: dict[str, Tensor],
    scale: int,
    interval: int,
    peft_scaling: float = 1.0,
) -> int:
    """Copy a peft LoRA adapter, trained on one timestep interval, into expert ``interval`` of scale ``scale``.

    ``peft_state`` is ``peft.get_peft_model_state_dict(peft_model)`` (keys ``….<module>.lora_A.weight`` and
    ``….lora_B.weight``); ``peft_scaling`` is that adapter's α / r, folded into B so that the expert reproduces the
    adapter's update under the wrapper's own scaling. Returns the number of layers loaded; raises ``KeyError`` when an
    adapted layer has no matching LoRA weights and ``ValueError`` on a shape mismatch.
    """
    loaded = 0
    for name, layer in experts.items():
        keys = {part: [k for k in peft_state if k.endswith(f"{name}.lora_{part}.weight")] for part in ("A", "B")}
        if len(keys["A"]) != 1 or len(keys["B"]) != 1:
            raise KeyError(f"no unique peft LoRA weights for {name!r} (found {keys['A'] + keys['B']})")
        a, b = peft_state[keys["A"][0]], peft_state[keys["B"][0]]
        slot_a, slot_b = layer.lora_A[scale].data[interval], layer.lora_B[scale].data[interval]
        if a.shape != slot_a.shape or b.reshape(b.shape[0], -1).shape != slot_b.shape:
            raise ValueError(
                f"{name}: peft LoRA A {tuple(a.shape)} / B {tuple(b.shape)} do not fit the expert "
                f"{tuple(slot_a.shape)} / {tuple(slot_b.shape)} (same rank and layer needed)"
            )
        slot_a.copy_(a)
        slot_b.copy_(b.reshape(slot_b.shape) * (peft_scaling / layer.scaling))
        loaded += 1
    return loaded
