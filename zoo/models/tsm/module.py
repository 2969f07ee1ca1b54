"""``TSMDiffusion``: fine-tune a diffusers UNet by pretraining, one LoRA, or TimeStep Master's timestep LoRA experts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel
from torch import Tensor, nn

from zoo.module import ZooModule
from zoo.nn.timestep_experts import _TimestepExperts, inject_timestep_experts

__all__ = ["TSMDiffusion", "eval_grid"]

Mode = Literal["pretrain", "lora", "full", "tsm"]


def eval_grid(num_timesteps: int = 1000, points: int = 20) -> Tensor:
    """The fixed evaluation timesteps: the centres of ``points`` equal intervals (25, 75, …, 975 for T = 1000)."""
    width = num_timesteps // points
    return torch.arange(points) * width + width // 2


class TSMDiffusion(ZooModule):
    """An ε-prediction diffusion model (a diffusers ``UNet2DModel`` and ``DDPMScheduler``) in one of four modes.

    * ``"pretrain"``: every UNet weight trains (the source-domain model).
    * ``"lora"``: the UNet is frozen and one peft LoRA of rank ``rank`` (``peft.inject_adapter_in_model``) trains on
      every timestep: the baseline. With ``lora_time_scale`` each layer's update is also multiplied by a learned
      scale per timestep (:mod:`zoo.nn.timestep_scale`): one LoRA whose strength depends on t.
    * ``"full"``: the UNet is frozen except the ``target_modules`` themselves, which train in full (full fine-tuning
      of the layers the adapters would adapt).
    * ``"tsm"``: the UNet is frozen and every target layer gets LoRA timestep experts at ``scales``
      (:mod:`zoo.nn.timestep_experts`). ``set_phase`` picks what trains: one scale's experts with timesteps drawn in
      ``t_range`` (fostering), or the router with timesteps over [0, T) (assembling). The
      ``callbacks.TimestepExpertsSchedule`` callback runs the whole schedule in one fit.

    Training draws t uniformly in ``t_range`` per sample and minimises ‖ε − ε_θ(√ᾱ_t x0 + √(1−ᾱ_t) ε, t)‖². Validation
    and test report the denoising MSE on a fixed grid of 20 timesteps with seeded noise (``{stage}/mse``) and per
    timestep bucket (``{stage}/mse_bucket{k}``, ``buckets`` equal intervals), so arms compare on the same noise.

    Args:
        mode: ``"pretrain"``, ``"lora"``, ``"full"`` or ``"tsm"``.
        base: a hub entry name or folder of a pretrained ``TSMDiffusion`` whose UNet weights start this one (None:
            random initialisation, for pretraining).
        in_channels: image channels.
        sample_size: image side.
        block_out_channels: UNet widths per level (the second level has attention).
        layers_per_block: ResNet blocks per level.
        norm_num_groups: GroupNorm groups.
        num_train_timesteps: T.
        beta_schedule: the DDPM schedule (``"squaredcos_cap_v2"``: cosine).
        target_modules: adapted layers (peft's suffix matching).
        rank: LoRA rank of every expert (and of the LoRA baseline).
        alpha: LoRA α (None: ``rank``, scaling 1).
        lora_time_scale: mode ``"lora"`` only: multiply each layer's LoRA update by a learned scale per timestep.
        scales: TSM interval counts, finest first.
        gate_activation: TSM router output activation (``"none"``, as the paper's equations).
        lr: learning rate of the trained weights (experts, LoRA or UNet).
        router_lr: learning rate of the TSM router.
        router_weight_decay: AdamW weight decay of the router (the gates are unbounded).
        ema_decay: keep an exponential moving average of the trained weights for evaluation and sampling (0: off).
        buckets: timestep buckets of the validation MSE.
        seed: seed of the evaluation noise and of sampling.

    Example:
        >>> model = TSMDiffusion(mode="tsm", block_out_channels=[16, 32], scales=[4, 2, 1])
        >>> model.set_phase("foster", scale=0, t_range=(250, 500))
        >>> [n for n, p in model.named_parameters() if p.requires_grad][:2]
        ['unet.down_blocks.0.resnets.0.conv1.lora_A.0', 'unet.down_blocks.0.resnets.0.conv1.lora_B.0']
        >>> model(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 1, 8, 8])
    """

    def __init__(
        self,
        mode: Mode = "tsm",
        base: str | None = None,
        in_channels: int = 1,
        sample_size: int = 8,
        block_out_channels: Sequence[int] = (16, 32),
        layers_per_block: int = 1,
        norm_num_groups: int = 8,
        num_train_timesteps: int = 1000,
        beta_schedule: str = "squaredcos_cap_v2",
        target_modules: Sequence[str] = ("to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2"),
        rank: int = 4,
        alpha: float | None = None,
        lora_time_scale: bool = False,
        scales: Sequence[int] = (4, 2, 1),
        gate_activation: str = "none",
        lr: float = 1e-3,
        router_lr: float = 1e-3,
        router_weight_decay: float = 0.01,
        ema_decay: float = 0.0,
        buckets: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if mode not in ("pretrain", "lora", "full", "tsm"):
            raise ValueError(f"mode must be 'pretrain', 'lora', 'full' or 'tsm', got {mode!r}")
        if lora_time_scale and mode != "lora":
            raise ValueError(f"lora_time_scale=True scales a LoRA's update: it needs mode='lora', got mode={mode!r}")
        self.save_hyperparameters()
        self.unet = UNet2DModel(
            sample_size=sample_size,
            in_channels=in_channels,
            out_channels=in_channels,
            layers_per_block=layers_per_block,
            block_out_channels=tuple(block_out_channels),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=norm_num_groups,
        )
        if base is not None:
            self.unet.load_state_dict(_base_unet_state(base))
        self.scheduler = DDPMScheduler(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule)
        self.experts: dict[str, nn.Module] = {}
        if mode == "lora":
            from peft import LoraConfig, inject_adapter_in_model

            self.unet.requires_grad_(False)
            config = LoraConfig(r=rank, lora_alpha=alpha or rank, target_modules=list(target_modules))
            self.unet = inject_adapter_in_model(config, self.unet)  # UNet2DModel has no add_adapter of its own
            if lora_time_scale:
                from zoo.nn.timestep_scale import add_timestep_scale

                add_timestep_scale(self.unet, num_train_timesteps)
        elif mode == "full":
            self.unet.requires_grad_(False)
            for name in _matching_layers(self.unet, target_modules):
                self.unet.get_submodule(name).requires_grad_(True)
        elif mode == "tsm":
            self.unet.requires_grad_(False)  # the experts wrap only the targets: freeze the rest of the UNet too
            self.experts = inject_timestep_experts(
                self.unet, target_modules, scales, rank, alpha, num_train_timesteps, gate_activation
            )
        self.ema = None
        if ema_decay > 0:
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(self.unet, multi_avg_fn=get_ema_multi_avg_fn(ema_decay), use_buffers=True)
        self.t_range = (0, num_train_timesteps)
        self.phase = "train" if mode != "tsm" else "assemble"
        if mode == "tsm":
            # Assembled, as a trained entry is used and evaluated (the phase is not part of the weights). Training
            # chooses its phases through `set_phase`, normally from `callbacks.TimestepExpertsSchedule`.
            self.set_phase("assemble")
            self._phase_chosen = False

    def load_base_weights(self, state: dict[str, Tensor]) -> None:
        """Load a plain ``UNet2DModel`` state dict into the (possibly adapted) UNet: a base weight ``a.b.weight`` may
        live at ``a.b.base_layer.weight`` (peft LoRA) or ``a.b.base.weight`` (timestep experts). Every key must land."""
        own = self.unet.state_dict()
        mapped = {}
        for key, value in state.items():
            prefix, _, leaf = key.rpartition(".")
            for candidate in (key, f"{prefix}.base_layer.{leaf}", f"{prefix}.base.{leaf}"):
                if candidate in own:
                    mapped[candidate] = value
                    break
            else:
                raise KeyError(f"base weight {key!r} has no place in this {self.hparams.mode!r} UNet")
        self.unet.load_state_dict(mapped, strict=False)
        if self.ema is not None:  # the copy that evaluation uses before the first EMA update
            self.ema.module.load_state_dict(mapped, strict=False)

    # ------------------------------------------------------------------------------------------------ phases
    def set_phase(self, phase: Literal["foster", "assemble"], scale: int = 0, t_range: tuple[int, int] | None = None):
        """TSM only: train scale ``scale``'s experts on timesteps in ``t_range`` (``"foster"``), or only the router
        over [0, T) with every expert frozen (``"assemble"``). Rebuild the optimiser after a change."""
        if self.hparams.mode != "tsm":
            raise RuntimeError(f"set_phase is for mode='tsm', this model is mode={self.hparams.mode!r}")
        T = self.hparams.num_train_timesteps  # noqa: N806
        lo, hi = t_range or (0, T)
        if not 0 <= lo < hi <= T:
            raise ValueError(f"t_range must satisfy 0 <= lo < hi <= {T}, got {(lo, hi)}")
        self.phase, self.t_range = phase, (lo, hi)
        self._phase_chosen = True
        for layer in self.experts.values():
            layer.set_stage(phase, scale)
            for j, (a, b) in enumerate(zip(layer.lora_A, layer.lora_B)):
                a.requires_grad_(phase == "foster" and j == scale)
                b.requires_grad_(phase == "foster" and j == scale)
            for p in layer.router_parameters():
                p.requires_grad_(phase == "assemble")
        if self.ema is not None:  # the EMA copy's expert layers are other modules: they must switch too
            for layer in self.ema.module.modules():
                if isinstance(layer, _TimestepExperts):
                    layer.set_stage(phase, scale)

    # ------------------------------------------------------------------------------------------------ maths
    @property
    def denoiser(self) -> nn.Module:
        """The UNet used for evaluation and sampling: the EMA copy when there is one and the model is not training."""
        return self.ema.module if self.ema is not None and not self.training else self.unet

    def forward(self, x: Tensor | tuple[Tensor, ...] | list[Tensor], t: Tensor | None = None) -> Tensor:
        """Predicted noise ``(B, C, H, W)`` of noisy images ``x`` at timesteps ``t`` (default: the middle, T/2)."""
        if isinstance(x, (tuple, list)):
            x = x[0]
        hp = self.hparams
        expected = (hp.in_channels, hp.sample_size, hp.sample_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"expected images (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}")
        if t is None:
            t = torch.full((len(x),), hp.num_train_timesteps // 2, device=x.device)
        t = torch.as_tensor(t, device=x.device).reshape(-1)
        if len(t) not in (1, len(x)):
            raise ValueError(f"got {len(t)} timesteps for a batch of {len(x)} images: pass one, or one per image")
        t = t.expand(len(x))
        # One host read for both checks. x is a noisy image (it may exceed [-1, 1]), so only finiteness is checked.
        low, high, finite = torch.stack([t.min().double(), t.max().double(), torch.isfinite(x).all().double()]).tolist()
        if not finite:
            raise ValueError("images x contain NaN or inf")
        if int(low) < 0 or int(high) >= hp.num_train_timesteps:
            raise ValueError(f"timesteps must lie in [0, {hp.num_train_timesteps}), got {t.tolist()[:8]}")
        return self.denoiser(x, t).sample

    def loss(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """Per-sample ε-prediction MSE ``(B,)`` of clean images ``x0`` in [−1, 1] at timesteps ``t`` (one, or one per
        image) with noise ``noise``. Training and evaluation reach their checks through here."""
        if not x0.is_floating_point():
            raise ValueError(
                f"clean images x0 must be floating point in [-1, 1], got {x0.dtype}: rescale 0..255 pixels with "
                "x0.float() / 127.5 - 1"
            )
        t = torch.as_tensor(t, device=x0.device)
        if t.numel() not in (1, len(x0)):
            raise ValueError(f"got {t.numel()} timesteps for a batch of {len(x0)} images: pass one, or one per image")
        # One host read: x0's range (NaN and inf propagate through min / max) and the noise's finiteness.
        low, high, noise_max = torch.stack([x0.min().float(), x0.max().float(), noise.abs().max().float()]).tolist()
        if not abs(low) < float("inf") or not abs(high) < float("inf"):  # False for NaN as for inf
            raise ValueError("clean images x0 contain NaN or inf")
        if not noise_max < float("inf"):
            raise ValueError("noise contains NaN or inf")
        if low < -1 - 1e-3 or high > 1 + 1e-3:  # a little slack for float rounding of rescaled pixels
            raise ValueError(
                f"clean images x0 must lie in [-1, 1], got {low:g}…{high:g}: rescale 0..255 pixels with "
                "x0 / 127.5 - 1 (0..1 ones with 2 * x0 - 1)"
            )
        x_t = self.scheduler.add_noise(x0, noise, t)
        return ((self(x_t, t) - noise) ** 2).flatten(1).mean(1)

    def grid_mse(self, x0: Tensor, generator: torch.Generator) -> Tensor:
        """Denoising MSE ``(len(grid), B)`` on the fixed timestep grid, with noise from ``generator``."""
        grid = eval_grid(self.hparams.num_train_timesteps)
        noise = torch.randn((len(grid), *x0.shape), generator=generator).to(x0.device)
        return torch.stack(
            [self.loss(x0, torch.full((len(x0),), int(t), device=x0.device), n) for t, n in zip(grid, noise)]
        )

    @torch.no_grad()
    def sample(self, n: int, steps: int = 50, generator: torch.Generator | None = None) -> Tensor:
        """``n`` images in [−1, 1] by DDIM (η = 0, ``steps`` steps) from diffusers' ``DDIMScheduler``."""
        scheduler = DDIMScheduler.from_config(self.scheduler.config)
        scheduler.set_timesteps(steps)
        hp = self.hparams
        generator = generator or torch.Generator().manual_seed(hp.seed)
        x = torch.randn((n, hp.in_channels, hp.sample_size, hp.sample_size), generator=generator).to(self.device)
        for t in scheduler.timesteps:
            x = scheduler.step(self(x, t.expand(n).to(self.device)), t, x).prev_sample
        return x.clamp(-1, 1)

    # ------------------------------------------------------------------------------------------------ training
    def training_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x0 = batch[0] if isinstance(batch, (tuple, list)) else batch
        lo, hi = self.t_range
        t = torch.randint(lo, hi, (len(x0),), device=x0.device)
        # Float noise even for integer pixels, so that loss refuses them with its own message (randn_like cannot).
        noise = torch.randn_like(x0, dtype=x0.dtype if x0.is_floating_point() else torch.float32)
        loss = self.loss(x0, t, noise).mean()
        self.log_train({"train/loss": loss}, batch_idx)
        return loss

    def on_fit_start(self) -> None:
        if self.hparams.mode == "tsm" and not self._phase_chosen:
            raise RuntimeError(
                "mode='tsm' trains in phases: add callbacks.TimestepExpertsSchedule to the Trainer (conf/tsm.yaml "
                "does), or call model.set_phase(...) first. Assembled from scratch, the zero router would learn nothing."
            )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update_parameters(self.unet)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        router = {id(p) for layer in self.experts.values() for p in layer.router_parameters()}
        trained = [p for p in self.unet.parameters() if p.requires_grad and id(p) not in router]
        routers = [p for p in self.unet.parameters() if p.requires_grad and id(p) in router]
        groups = []
        if trained:
            groups.append({"params": trained, "lr": hp.lr, "weight_decay": 0.0})
        if routers:
            groups.append({"params": routers, "lr": hp.router_lr, "weight_decay": hp.router_weight_decay})
        if not groups:
            raise RuntimeError("nothing to train: every parameter is frozen")
        return torch.optim.AdamW(groups)

    # ------------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, batch: tuple[Tensor, ...], batch_idx: int, stage: str) -> None:
        x0 = batch[0]
        mse = self.grid_mse(x0, torch.Generator().manual_seed(self.hparams.seed * 100_003 + batch_idx))
        self.log(f"{stage}/mse", mse.mean(), batch_size=len(x0), prog_bar=stage == "val")
        per_bucket = mse.mean(1).view(self.hparams.buckets, -1).mean(1)
        for k, value in enumerate(per_bucket):
            self.log(f"{stage}/mse_bucket{k}", value, batch_size=len(x0))

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        x0 = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.sample(len(x0), generator=torch.Generator().manual_seed(self.hparams.seed + batch_idx))

    def card_notes(self) -> str:
        hp = self.hparams
        return (
            f"A {hp.sample_size}×{hp.sample_size} diffusers UNet2DModel (widths {list(hp.block_out_channels)}) with "
            f"ε-prediction on a {hp.beta_schedule} DDPM schedule (T = {hp.num_train_timesteps}); mode {hp.mode!r}"
            + (
                f": LoRA timestep experts (rank {hp.rank}, scales {list(hp.scales)}) on {list(hp.target_modules)}, "
                "assembled with the trained router."
                if hp.mode == "tsm"
                else "."
            )
            + " `model.sample(n)` draws images in [-1, 1] by 50-step DDIM; test/mse is the denoising MSE on the fixed "
            "20-timestep grid with seeded noise."
        )


def _matching_layers(model: nn.Module, target_modules: Sequence[str]) -> list[str]:
    """The Linear / Conv2d modules whose names end with one of ``target_modules`` (peft's rule); each target must
    match one."""
    names = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    out = []
    for target in target_modules:
        matches = [n for n in names if n == target or n.endswith("." + target)]
        if not matches:
            raise ValueError(f"target module {target!r} matches no Linear or Conv2d of the UNet")
        out += matches
    return out


def _base_unet_state(base: str) -> dict[str, Tensor]:
    """The UNet weights of a pretrained ``TSMDiffusion`` (hub name or folder), for a fine-tuning run to start from.

    Read from the entry's checksum-verified safetensors directly: building the module here would run inside the
    caller's ``save_hyperparameters`` context (under the CLI it would record the caller's arguments).
    """
    import safetensors.torch

    from zoo import hub

    folder = hub.find(base)
    config = hub.read_config(folder)
    hub.verify_checksums(folder, config)
    if config.get("mode") != "pretrain":
        raise ValueError(
            f"base={base!r} is not a pretrained TSMDiffusion (mode='pretrain'), got mode={config.get('mode')!r}"
        )
    state = safetensors.torch.load_file(str(folder / hub.WEIGHTS))
    return {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")}
