"""``zoo reproduce tsm``: LoRA timestep experts against one LoRA for domain adaptation of a small diffusion model.

The TSM card's §6 experiment on scikit-learn's digits: a diffusers ``UNet2DModel`` (widths 16 / 32, attention on the
second level; the review's smaller model) is pretrained on the *source* domain (digits 0–4), then adapted to the
*target* domain (digits 5–9 with inverted contrast) with the base weights frozen and LoRA on the attention
projections and the ResNet convolutions, rank 4, AdamW lr 1e-3, batch 64, per seed:

* **LoRA-r4**: one LoRA (peft), ``STEPS`` steps on timesteps over [0, T);
* **TSM-1stage**: experts at scales (4, 2, 1); each scale gets the same ``STEPS`` budget, each expert training on
  timesteps of its own interval only; evaluated with the core (finest) experts alone;
* **TSM-2stage**: the same experts frozen, the router trained for ``ROUTER_STEPS`` steps (lr 1e-3, weight decay 0.01);
* **LoRA-r28**: one LoRA with as many stored parameters as the 7 experts, trained for as many steps as TSM in all.

Metric: denoising MSE on the held-out target images over the fixed grid t = 25, 75, …, 975, with the same seeded
noise for every arm; per bucket of 250 timesteps too; and the mean |gate| of the assembled model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from datamodules.domains import DomainShiftDataModule
from zoo.models.tsm.module import TSMDiffusion
from zoo.reporting import print_claims, write_results

__all__ = ["run"]

ARMS = ("lora_r4", "tsm_1stage", "tsm_2stage", "lora_r28")
SCALES = (4, 2, 1)


def _trainer(steps: int, callbacks: list | None = None) -> Any:
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


def _test(model: TSMDiffusion, dm: DomainShiftDataModule) -> dict[str, float]:
    result = _trainer(1).test(model, dm, verbose=False)[0]
    return {k.split("/", 1)[1]: v for k, v in result.items()}


def _mean_gate(model: TSMDiffusion, dm: DomainShiftDataModule) -> float:
    """Mean |G(z_t, t)| over the assembled layers' context gates, on noisy target images at the grid timesteps."""
    from zoo.models.tsm.module import eval_grid

    values: list[float] = []

    def record(layer: Any, args: tuple) -> None:
        x = args[0]
        values.append(float(layer.gates(x, layer._batch_timesteps(len(x)), -1 if x.dim() != 4 else 1).abs().mean()))

    hooks = [layer.register_forward_pre_hook(record) for layer in model.experts.values()]
    x0 = dm.val_set.tensors[0]
    with torch.no_grad():
        for t in eval_grid(model.hparams.num_train_timesteps)[::4]:
            tt = torch.full((len(x0),), int(t))
            model(model.scheduler.add_noise(x0, torch.randn_like(x0), tt), tt)
    for hook in hooks:
        hook.remove()
    return sum(values) / len(values)


def _seed(seed: int, base: dict[str, torch.Tensor], steps: int, router_steps: int, r: dict[str, Any]) -> None:
    from lightning import seed_everything

    from callbacks.timestep_experts import TimestepExpertsSchedule

    dm = DomainShiftDataModule("target", batch_size=64, seed=0)
    dm.setup("fit")

    def fresh(mode: str, **kwargs: Any) -> TSMDiffusion:
        seed_everything(seed, verbose=False)
        model = TSMDiffusion(mode=mode, seed=0, **kwargs)
        model.load_base_weights(base)  # the frozen source weights; the adapters keep their initialisation
        return model

    def record(arm: str, model: TSMDiffusion, seconds: float, trained_steps: int) -> None:
        for key, value in _test(model, dm).items():
            r[f"{arm}/{key}/seed{seed}"] = value
        r[f"{arm}/seconds/seed{seed}"] = seconds
        r[f"{arm}/steps"] = trained_steps
        adapters = [p for n, p in model.unet.named_parameters() if "lora" in n or "router" in n or "time_gate" in n]
        if arm == "tsm_1stage":  # the router exists but is still zero: not part of this arm
            adapters = [p for layer in model.experts.values() for p in layer.expert_parameters()]
        r[f"{arm}/adapter_params"] = sum(p.numel() for p in adapters)

    for arm, rank, arm_steps in (("lora_r4", 4, steps), ("lora_r28", 28, len(SCALES) * steps + router_steps)):
        model = fresh("lora", rank=rank)
        start = time.perf_counter()
        _trainer(arm_steps).fit(model, dm)
        record(arm, model, time.perf_counter() - start, arm_steps)

    model = fresh("tsm", scales=SCALES)
    foster = TimestepExpertsSchedule(steps_per_scale=steps, router_steps=0)
    start = time.perf_counter()
    _trainer(foster.total_steps(SCALES, 1000), [foster]).fit(model, dm)
    record("tsm_1stage", model, time.perf_counter() - start, foster.total_steps(SCALES, 1000))
    stored = sum(p.numel() for layer in model.experts.values() for p in layer.expert_parameters())
    r["tsm/stored_expert_params"] = stored
    seed_everything(seed, verbose=False)
    assemble = TimestepExpertsSchedule(router_steps=router_steps, scales=[])
    start = time.perf_counter()
    _trainer(router_steps, [assemble]).fit(model, dm)
    record("tsm_2stage", model, time.perf_counter() - start, router_steps)
    r[f"tsm_2stage/mean_abs_gate/seed{seed}"] = _mean_gate(model.eval(), dm)


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Pretrain on the source domain, run the four arms per seed, print the table, and (with ``out``) write
    ``tsm.json`` and ``tsm.png``.

    ``quick`` runs one seed with half the steps (about 2 minutes instead of 8 on 2 CPU cores).

    Returns:
        flat results: ``<arm>/mse`` and ``<arm>/mse_bucket<k>`` (means over seeds, and per seed), steps, adapter
        parameters and seconds per arm, the mean |gate| after assembling, and ``claims/...`` (1.0 when a claim
        holds). All values are numbers.
    """
    from lightning import seed_everything

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    try:
        pretrain_steps, steps, router_steps = (800, 400, 150) if quick else (1500, 800, 300)
        seeds = (0,) if quick else (0, 1)
        r: dict[str, Any] = {"num_seeds": len(seeds), "pretrain_steps": pretrain_steps}
        seed_everything(0, verbose=False)
        source = TSMDiffusion(mode="pretrain", lr=2e-3)
        source_dm = DomainShiftDataModule("source", batch_size=64, seed=0)
        t0 = time.perf_counter()
        _trainer(pretrain_steps).fit(source, source_dm)
        r["pretrain/seconds"] = time.perf_counter() - t0
        r["pretrain/source_mse"] = _test(source, source_dm)["mse"]
        base = {k: v.clone() for k, v in source.unet.state_dict().items()}
        target_dm = DomainShiftDataModule("target", batch_size=64, seed=0)
        r["pretrain/target_mse"] = _test(source, target_dm)["mse"]  # before any adaptation
        for seed in seeds:
            _seed(seed, base, steps, router_steps, r)
        keys = {k.rsplit("/", 1)[0] for k in r if k.endswith("/seed0")}
        for key in keys:
            r[key] = sum(r[f"{key}/seed{s}"] for s in seeds) / len(seeds)
        r["seconds"] = time.perf_counter() - start
        r["tsm_2stage_over_lora_r4"] = r["tsm_2stage/mse"] / r["lora_r4/mse"]
        r["tsm_2stage_over_lora_r28"] = r["tsm_2stage/mse"] / r["lora_r28/mse"]
        r.update(_claims(r))
        _print(r)
        if out is not None:
            write_results(r, out, "tsm", _plot)
        return r
    finally:
        torch.set_num_threads(threads)


def _claims(r: dict[str, Any]) -> dict[str, float]:
    """Checks on the seed means; 1.0 when a claim holds.

    The card's headline, TSM-2stage ≤ 0.98 × LoRA-r4, did not hold in the first calibrated run (quick: 0.260 against
    0.228; TSM-1stage 0.298): at this scale, an expert that sees only its own interval's steps learns less than one
    LoRA that shares every step across timesteps. As the card asks, that is reported (``tsm_2stage_over_lora_r4``),
    not tuned away; the full run agreed (2 seeds: TSM-2stage 0.2225, LoRA-r4 0.1977, TSM-1stage 0.2476, LoRA-r28
    0.1562). What held is asserted: assembling beats the core experts alone (0.87× quick, 0.90× full) in at least 3 of
    4 timestep buckets (4 quick; the full run is flat, +1 %, at t ≥ 750), the router's gates are in use, and
    adaptation beats the unadapted source model.
    """
    buckets = [k.split("/")[1] for k in r if k.startswith("tsm_1stage/mse_bucket") and k.count("/") == 1]
    return {
        "claims/assembling_beats_core_only_by_5pct": float(r["tsm_2stage/mse"] <= 0.95 * r["tsm_1stage/mse"]),
        "claims/assembling_helps_in_3_of_4_buckets": float(
            sum(r[f"tsm_2stage/{b}"] < r[f"tsm_1stage/{b}"] for b in buckets) >= len(buckets) - 1
        ),
        "claims/router_gates_not_zero": float(r["tsm_2stage/mean_abs_gate"] > 1e-3),
        "claims/adaptation_helps": float(max(r["lora_r4/mse"], r["tsm_2stage/mse"]) < r["pretrain/target_mse"]),
    }


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=130)
    buckets = sorted(k.split("/")[1] for k in r if k.startswith("lora_r4/mse_bucket") and k.count("/") == 1)
    table = Table(title=f"target-domain denoising MSE (held-out, 20-timestep grid), mean of {r['num_seeds']} seed(s)")
    for column in (
        "arm",
        "MSE",
        *(f"t∈[{250 * i},{250 * (i + 1)})" for i in range(len(buckets))),
        "steps",
        "adapter params",
    ):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm in ARMS:
        table.add_row(
            arm,
            f"{r[f'{arm}/mse']:.4f}",
            *(f"{r[f'{arm}/{b}']:.4f}" for b in buckets),
            f"{r[f'{arm}/steps']}",
            f"{r[f'{arm}/adapter_params']:,}",
        )
    console.print(table)
    console.print(
        f"source model before adaptation: {r['pretrain/target_mse']:.4f} on the target ({r['pretrain/source_mse']:.4f} "
        f"on the source); TSM's 7 experts hold {r['tsm/stored_expert_params']:,} parameters (the rest of tsm_2stage's "
        f"count is the router); mean |gate| after "
        f"assembling {r['tsm_2stage/mean_abs_gate']:.4f}; reported, not asserted: TSM-2stage / LoRA-r4 "
        f"{r['tsm_2stage_over_lora_r4']:.3f}, / LoRA-r28 {r['tsm_2stage_over_lora_r28']:.3f}; total {r['seconds']:.0f} s"
    )
    print_claims(console, r)


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = sorted(k.split("/")[1] for k in r if k.startswith("lora_r4/mse_bucket") and k.count("/") == 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in ARMS:
        ax.plot(range(len(buckets)), [r[f"{arm}/{b}"] for b in buckets], marker="o", label=arm)
    ax.set_xticks(range(len(buckets)), [f"[{250 * i},{250 * (i + 1)})" for i in range(len(buckets))])
    ax.set_yscale("log")
    ax.set_xlabel("timestep bucket")
    ax.set_ylabel("denoising MSE (held-out target)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
