"""The arms of ``zoo reproduce tsm``: each trains (or builds) one adapted model from the frozen source UNet.

Budgets, with ``S`` = ``steps`` and ``R`` = ``router_steps`` (scales (4, 2, 1): 7 experts per layer):

* the paper's recipe, every expert trained as long as one LoRA: stage 1 costs 7·S steps, TSM in all 7·S + R;
* the TSM card's §6 budget, every *scale* trained as long as one LoRA (each scale-4 expert S / 4 steps): 3·S + R;
* the LoRA baseline: S steps; the compute-matched arms (same-rank and same-parameter LoRA, full fine-tuning of the
  same layers, LoRA with a timestep-conditioned scale): 7·S + R steps, TSM's total.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from zoo.datamodules.domains import DomainShiftDataModule
from zoo.models.tsm.module import TSMDiffusion, eval_grid

__all__ = ["Arms", "FlippedSource", "GaussianDenoiser", "mean_abs_gate", "uniform_gates"]

SCALES = (4, 2, 1)


def trainer(steps: int, callbacks: list | None = None) -> Any:
    """A quiet Lightning ``Trainer`` for ``steps`` optimiser steps (no validation, logging or checkpoints)."""
    from lightning import Trainer

    return Trainer(
        max_steps=steps,
        max_epochs=-1,
        callbacks=callbacks or [],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )


def test_mse(model: TSMDiffusion, dm: DomainShiftDataModule) -> dict[str, float]:
    """The held-out grid MSE and its buckets: ``{"mse": …, "mse_bucket0": …}`` (the same seeded noise for every arm)."""
    result = trainer(1).test(model, dm, verbose=False)[0]
    return {k.split("/", 1)[1]: v for k, v in result.items()}


test_mse.__test__ = False  # a helper, not a pytest test


class FlippedSource(TSMDiffusion):
    """The source model run on the negated image, its prediction negated: ε(x_t, t) = −ε_source(−x_t, t).

    A non-learned fix for the target's inverted contrast: for x0' = −x0 the noisy image and the noise change sign
    too, so this is exact for the polarity shift and leaves only the new digit shapes unadapted.
    """

    def forward(self, x: Tensor | tuple[Tensor, ...] | list[Tensor], t: Tensor | None = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            x = x[0]
        return -super().forward(-x, t)


class GaussianDenoiser(TSMDiffusion):
    """The optimal (MMSE) ε-prediction if the images were Gaussian with the mean and covariance of ``images``.

    With x_t = a·x0 + b·ε, x0 ~ N(μ, Σ): E[ε | x_t] = b·(a²Σ + b²I)⁻¹(x_t − a·μ), computed in Σ's eigenbasis for every
    sample's own t at once. No training: the closed-form linear denoiser of the field (a Wiener filter per noise
    level), the cheapest model of the target domain. The UNet is unused.
    """

    def fit_images(self, images: Tensor) -> GaussianDenoiser:
        flat = images.flatten(1).double()
        mean = flat.mean(0)
        eigenvalues, eigenvectors = torch.linalg.eigh(torch.cov(flat.T))
        self.register_buffer("mu", mean.float(), persistent=False)
        self.register_buffer("eigenvalues", eigenvalues.clamp(min=0).float(), persistent=False)
        self.register_buffer("eigenvectors", eigenvectors.float(), persistent=False)
        return self

    def forward(self, x: Tensor | tuple[Tensor, ...] | list[Tensor], t: Tensor | None = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            x = x[0]
        t = torch.as_tensor(t, device=x.device).reshape(-1).expand(len(x))
        abar = self.scheduler.alphas_cumprod.to(x.device)[t].float()
        a, b = abar.sqrt()[:, None], (1 - abar).sqrt()[:, None]
        z = (x.flatten(1) - a * self.mu) @ self.eigenvectors
        return ((b * z / (a**2 * self.eigenvalues + b**2)) @ self.eigenvectors.T).view_as(x)


def uniform_gates(model: TSMDiffusion) -> TSMDiffusion:
    """The no-router ablation, in place: every gate fixed at 1 and every B divided by m, so each adapted layer adds
    the mean of its m active experts' updates (the core's too) instead of the core plus router-gated context."""
    with torch.no_grad():
        for layer in model.experts.values():
            layer.router.weight.zero_()
            layer.router.bias.zero_()
            layer.time_gate.weight.fill_(1.0)
            for b in layer.lora_B:
                b.div_(len(layer.scales))
    return model


def mean_abs_gate(model: TSMDiffusion, images: Tensor) -> float:
    """Mean |G(z_t, t)| over the assembled layers' context gates, on noisy ``images`` at every 4th grid timestep."""
    values: list[float] = []

    def record(layer: Any, args: tuple) -> None:
        x = args[0]
        values.append(float(layer.gates(x, layer._batch_timesteps(len(x)), -1 if x.dim() != 4 else 1).abs().mean()))

    hooks = [layer.register_forward_pre_hook(record) for layer in model.experts.values()]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in eval_grid(model.hparams.num_train_timesteps)[::4]:
            tt = torch.full((len(images),), int(t))
            noise = torch.randn(images.shape, generator=generator)
            model(model.scheduler.add_noise(images, noise, tt), tt)
    for hook in hooks:
        hook.remove()
    return sum(values) / len(values)


class Arms:
    """``fn(arm, seed)`` for :func:`zoo.reporting.run_arms`: trains one arm from the frozen source weights.

    The fostered experts of a seed (for each budget) are trained once and kept, so every arm built on them (core
    only, uniform gates, assembled, core given the router's steps) starts from the same weights; the arms that train
    after fostering reseed first, so they see the same batches, timesteps and noise. Per-arm facts that do not vary
    with the seed (steps, trained parameters) go to ``static``.
    """

    def __init__(
        self, base: dict[str, Tensor], steps: int, router_steps: int, samples: int = 256, sample_steps: int = 50
    ) -> None:
        from zoo.models.tsm.quality import SampleQuality

        self.base, self.steps, self.router_steps = base, steps, router_steps
        self.samples, self.sample_steps = samples, sample_steps
        self.total = sum(SCALES) * steps + router_steps  # the paper's recipe: 7·S + R
        self.fostered: dict[tuple[int, str], tuple[dict[str, Tensor], float]] = {}
        self.static: dict[str, float] = {}
        self.dm = DomainShiftDataModule("target", batch_size=64, seed=0)
        self.dm.setup("fit")
        source = DomainShiftDataModule("source", batch_size=64, seed=0)
        source.setup("fit")
        # The sample-quality classifier reads every digit in the target's look: the target's training digits and the
        # source's training digits inverted; never the held-out target images it scores against.
        x, y = self.dm.train_set.tensors[:2]
        sx, sy = source.train_set.tensors[:2]
        self.quality = SampleQuality(torch.cat([x, -sx]), torch.cat([y, sy]), self.dm.val_set.tensors[0])
        self.static["quality/classifier_accuracy"] = self.quality.accuracy(*self.dm.val_set.tensors[:2])
        # The floor of the Fréchet distance at this sample size: real target training images against the held-out.
        self.static["quality/real_fd"] = self.quality(x[:samples])["fd"]


    def _fresh(self, seed: int, mode: str, cls: type[TSMDiffusion] = TSMDiffusion, **kwargs: Any) -> TSMDiffusion:
        from lightning import seed_everything

        seed_everything(seed, verbose=False)
        model = cls(mode=mode, seed=0, **kwargs)
        model.load_base_weights(self.base)  # the frozen source weights; the adapters keep their initialisation
        return model

    def _foster(self, seed: int, budget: str) -> TSMDiffusion:
        """The seed's fostered experts (stage 1, router still zero) for ``budget`` ``"expert"`` (S steps per expert)
        or ``"scale"`` (S steps per scale), trained on first use and then reloaded."""
        from lightning import seed_everything

        from zoo.callbacks.timestep_experts import TimestepExpertsSchedule

        model = self._fresh(seed, "tsm", scales=SCALES)
        key = (seed, budget)
        if key not in self.fostered:
            per_expert = self.steps if budget == "expert" else None
            schedule = TimestepExpertsSchedule(self.steps, router_steps=0, steps_per_expert=per_expert)
            start = time.perf_counter()
            seed_everything(seed, verbose=False)  # after building: every arm's training draws from the same stream
            trainer(schedule.total_steps(SCALES, 1000), [schedule]).fit(model, self.dm)
            self.fostered[key] = ({k: v.clone() for k, v in model.state_dict().items()}, time.perf_counter() - start)
        else:
            model.load_state_dict(self.fostered[key][0])
            model.set_phase("assemble")
        return model

    def _assemble(self, model: TSMDiffusion, seed: int) -> float:
        """Stage 2: the experts frozen, the router trained for ``router_steps`` steps; returns the seconds."""
        from zoo.callbacks.timestep_experts import TimestepExpertsSchedule

        schedule = TimestepExpertsSchedule(router_steps=self.router_steps, scales=[])
        return self._train(model, self.router_steps, seed, [schedule])

    def _train(self, model: TSMDiffusion, steps: int, seed: int, callbacks: list | None = None) -> float:
        """Train ``steps`` steps, reseeded first: models of different sizes consume different amounts of the random
        stream when built, and the batches, timesteps and noise of every arm of a seed must be the same."""
        from lightning import seed_everything

        seed_everything(seed, verbose=False)
        start = time.perf_counter()
        trainer(steps, callbacks).fit(model, self.dm)
        return time.perf_counter() - start

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        extra: dict[str, float] = {}
        S, R = self.steps, self.router_steps
        card_total = len(SCALES) * S + R
        if arm == "source":
            model, steps, seconds, trained = self._fresh(seed, "pretrain"), 0, 0.0, []
        elif arm == "source_flip":
            model, steps, seconds, trained = self._fresh(seed, "pretrain", FlippedSource), 0, 0.0, []
        elif arm == "gaussian":
            model = GaussianDenoiser(mode="pretrain", seed=0).fit_images(self.dm.train_set.tensors[0])
            steps, seconds, trained = 0, 0.0, []
        elif arm in ("lora_r4", "lora_r4_long", "lora_r28", "lora_tscale"):
            rank = 28 if arm == "lora_r28" else 4
            model = self._fresh(seed, "lora", rank=rank, lora_time_scale=arm == "lora_tscale")
            steps = S if arm == "lora_r4" else self.total
            seconds = self._train(model, steps, seed)
            trained = [p for n, p in model.unet.named_parameters() if "lora" in n]
        elif arm == "full_ft":
            model, steps = self._fresh(seed, "full"), self.total
            seconds = self._train(model, steps, seed)
            trained = [p for p in model.unet.parameters() if p.requires_grad]
        elif arm in ("tsm_core", "tsm_uniform", "tsm_card_core"):
            budget = "scale" if arm == "tsm_card_core" else "expert"
            model = self._foster(seed, budget)
            steps = card_total - R if budget == "scale" else self.total - R
            seconds = self.fostered[(seed, budget)][1]
            trained = [p for layer in model.experts.values() for p in layer.expert_parameters()]
            if arm == "tsm_uniform":
                uniform_gates(model)
        elif arm == "tsm_core_matched":  # only the core experts, each trained (7·S + R) / 4 steps: TSM's compute
            from zoo.callbacks.timestep_experts import TimestepExpertsSchedule

            model = self._fresh(seed, "tsm", scales=SCALES)
            per_expert = self.total // SCALES[0]
            schedule = TimestepExpertsSchedule(router_steps=0, scales=[0], steps_per_expert=per_expert)
            steps = schedule.total_steps(SCALES, 1000)
            seconds = self._train(model, steps, seed, [schedule])
            trained = [p for layer in model.experts.values() for p in (layer.lora_A[0], layer.lora_B[0])]
        elif arm in ("tsm", "tsm_card", "tsm_core_more", "tsm_const_gates"):
            budget = "scale" if arm == "tsm_card" else "expert"
            model = self._foster(seed, budget)
            steps = card_total if budget == "scale" else self.total
            if arm == "tsm_core_more":  # the router's steps spent on the core experts: each sample through its own
                model.set_phase(
                    "foster", scale=0
                )  # interval's expert, the same batches, timesteps and noise as stage 2
                seconds = self._train(model, R, seed)
                model.set_phase("assemble")  # zero router: exactly the core experts alone
                trained = [p for layer in model.experts.values() for p in layer.expert_parameters()]
            elif arm == "tsm_const_gates":  # a router without inputs: one learned gate per context scale and layer
                model.set_phase("assemble")
                for layer in model.experts.values():  # F's bias is that constant; F's weight and ε(t) stay zero
                    layer.router.weight.requires_grad_(False)
                    layer.time_gate.weight.requires_grad_(False)
                seconds = self._train(model, R, seed)
                trained = [p for layer in model.experts.values() for p in layer.expert_parameters()]
                trained += [layer.router.bias for layer in model.experts.values()]
                extra["mean_abs_gate"] = mean_abs_gate(model.eval(), self.dm.val_set.tensors[0])
            else:
                seconds = self._assemble(model, seed)
                trained = [p for layer in model.experts.values() for p in layer.expert_parameters()]
                trained += [p for layer in model.experts.values() for p in layer.router_parameters()]
                extra["mean_abs_gate"] = mean_abs_gate(model.eval(), self.dm.val_set.tensors[0])
            seconds += self.fostered[(seed, budget)][1]
        else:
            raise ValueError(f"unknown arm {arm!r}")
        self.static[f"{arm}/steps"] = steps
        self.static[f"{arm}/trained_params"] = sum(p.numel() for p in trained)
        generator = torch.Generator().manual_seed(seed)  # every arm of a seed starts its samples from the same noise
        quality = self.quality(model.eval().sample(self.samples, self.sample_steps, generator))
        return {**test_mse(model, self.dm), **quality, **extra, "seconds": seconds}
