"""The zoo on a GPU, in one command: every entry fits 20 bf16-mixed steps on its own DataModule, its hub entry loads
with ``map_location="cuda"`` and tests a few batches there, and the papers' full-scale settings take one training step.

    python tests/gpu/check.py                          # every entry + the full-scale steps (a few minutes on one GPU)
    python tests/gpu/check.py --only ra-sae,snn-ecl    # some entries
    python tests/gpu/check.py --device cpu --steps 2 --only ra-sae,dual --full-scale tiny   # the script itself, no GPU

Full-scale settings (where the zoo offers the paper's architecture): RA-SAE at d = 768 with k = 8,192 atoms over
n' = 8,192 candidates and batches of 4,096 rows; ECL's ResNet-18 on 32 x 32 images (batch 128), trained and then
converted and simulated for 4 steps; TimeStep Master's LoRA timestep experts on a UNet2DConditionModel of Stable
Diffusion 1.5's size, built from its config (no weights), fostering scale 0 on a batch of 4 latents of 4 x 64 x 64.
``--full-scale tiny`` runs the same code at toy sizes (for a CPU); ``off`` skips it.

Prints, per check: steps/s, peak memory (``torch.cuda.max_memory_allocated``) and the failure if any. Every check
catches its own exceptions, so one failure does not stop the rest; the exit status is 1 when any failed. Without CUDA
(and ``--device cuda``) it prints why and exits 0.

Nothing heavy is imported at module level and nothing runs on import: pytest collects this file for doctests
(``--doctest-modules``), and it is not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the repository root (zoo/, datamodules/, callbacks/) goes first on the path.
_ROOT = Path(__file__).resolve().parents[2]

_FULL = {
    "ra-sae": {"dim": 768, "num_atoms": 8192, "num_candidates": 8192, "top_k": 32, "batch": 4096},
    "snn-ecl": {"batch": 128, "snn_steps": 4},
    "tsm": {"blocks": (320, 640, 1280, 1280), "cross": 768, "heads": 8, "latent": 64, "tokens": 77, "batch": 4},
}
_TINY = {
    "ra-sae": {"dim": 32, "num_atoms": 64, "num_candidates": 64, "top_k": 4, "batch": 64},
    "snn-ecl": {"batch": 4, "snn_steps": 2},
    "tsm": {"blocks": (32, 64), "cross": 16, "heads": 2, "latent": 16, "tokens": 7, "batch": 2},
}


@dataclass
class Result:
    """One check's outcome, as printed."""

    name: str
    check: str
    ok: bool
    steps_per_s: float | None = None
    peak_gib: float | None = None
    note: str = ""

    def line(self) -> str:
        rate = f"{self.steps_per_s:8.2f} steps/s" if self.steps_per_s is not None else " " * 16
        peak = f"{self.peak_gib:7.2f} GiB" if self.peak_gib is not None else " " * 11
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name:26s} {self.check:11s} {rate}  {peak}  {self.note}"


class _Memory:
    """Peak memory of one check: reset before, read after (CUDA only; None on a CPU)."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device == "cuda"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float | None:
        import torch

        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30


def _run(name: str, check: str, device: str, fn: Callable[[], tuple[float | None, str]]) -> Result:
    """Run one check, catching everything it raises (the rest of the checks go on)."""
    memory = _Memory(device)
    try:
        rate, note = fn()
        result = Result(name, check, True, rate, memory.peak(), note)
    except Exception as error:  # noqa: BLE001 - one failing entry must not stop the others
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"\n        at {frame.filename}:{frame.lineno} in {frame.name}"
        result = Result(name, check, False, None, memory.peak(), f"{type(error).__name__}: {error}"[:300] + where)
    print(result.line(), flush=True)
    return result


def _conf_trainer(name: str) -> dict[str, Any]:
    import yaml

    from zoo.registry import conf_path

    return yaml.safe_load(conf_path(name).read_text(encoding="utf-8")).get("trainer") or {}


def _conf_callbacks(name: str) -> list[Any]:
    """The conf's callbacks (some papers' schedules and metrics live there), without checkpointing or progress bars."""
    from zoo.registry import import_object

    out = []
    for spec in _conf_trainer(name).get("callbacks") or []:
        cls = import_object(spec["class_path"])
        if cls.__name__ in ("ModelCheckpoint", "RichProgressBar", "TQDMProgressBar"):
            continue
        out.append(cls(**(spec.get("init_args") or {})))
    return out


def _trainer(device: str, callbacks: list[Any], **kwargs: Any) -> Any:
    from lightning import Trainer

    return Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **kwargs,
    )


def _step_timer() -> Any:
    """A callback timing training batches after the first (which pays for kernels, autotuning, allocations)."""
    from lightning import Callback

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            import torch

            if torch.cuda.is_available() and pl_module.device.type == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

        def rate(self) -> float | None:
            return (len(self.times) - 1) / (self.times[-1] - self.times[0]) if len(self.times) > 1 else None

    return StepTimer()


def check_fit(name: str, device: str, steps: int) -> tuple[float | None, str]:
    """``steps`` bf16-mixed training steps of the entry's conf model on its own DataModule."""
    from lightning import seed_everything

    import zoo

    seed_everything(0, verbose=False)
    timer = _step_timer()
    conf = _conf_trainer(name)
    max_epochs = conf.get("max_epochs")
    trainer = _trainer(
        device,
        [*_conf_callbacks(name), timer],
        max_steps=steps,
        max_epochs=-1 if max_epochs in (None, -1) else max_epochs,
        precision="bf16-mixed",
        limit_val_batches=2,
    )
    model = zoo.create(name)
    trainer.fit(model, datamodule=zoo.datamodule(name))
    batches = len(timer.times)
    return timer.rate(), f"{batches} batches, {trainer.global_step} optimiser steps"


def check_hub(name: str, device: str, batches: int = 2) -> tuple[float | None, str]:
    """The hub entry loaded with ``map_location=device``, then ``batches`` test batches on that device."""
    import zoo

    model = zoo.load(name, map_location=device)
    where = sorted({p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()})
    if where and where != [device]:  # reported, not failed: the Trainer moves the rest
        print(f"     {name}: map_location={device!r} left tensors on {where}", flush=True)
    start = time.perf_counter()
    trainer = _trainer(device, _conf_callbacks(name), limit_test_batches=batches)
    metrics = trainer.test(model, datamodule=zoo.datamodule(name), verbose=False)[0]
    seconds = time.perf_counter() - start
    shown = ", ".join(f"{k}={v:.3g}" for k, v in list(metrics.items())[:3])
    return None, f"loaded on {device}; {batches} test batches in {seconds:.1f}s: {shown}"


def _timed_steps(step: Callable[[], None], device: str, repeats: int = 2) -> float:
    """Steps/s of ``step`` after one warm-up call."""
    import torch

    step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return repeats / (time.perf_counter() - start)


def full_ra_sae(device: str, size: dict[str, Any]) -> tuple[float | None, str]:
    """RA-SAE training steps at the paper's width: D = (W C + Λ) e^m with W of k x n', TopK codes, Adam, bf16."""
    import torch

    from zoo.models.ra_sae import RASAE
    from zoo.models.ra_sae.sae import sae_loss

    dims = {k: size[k] for k in ("dim", "num_atoms", "top_k", "num_candidates")}
    model = RASAE(**dims)
    model.set_candidates(torch.randn(size["num_candidates"], size["dim"]))
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(size["batch"], size["dim"], device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            pre, codes, x_hat = model.sae(x)
            loss = sae_loss(x, x_hat.float(), pre, codes, None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        model.sae.dictionary.project_()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss {float(loss)}")

    rate = _timed_steps(step, device)
    return rate, f"d={size['dim']} k={size['num_atoms']} n'={size['num_candidates']} batch {size['batch']}"


def full_snn_ecl(device: str, size: dict[str, Any]) -> tuple[float | None, str]:
    """ECL's ResNet-18 on 32 x 32: SGD steps of the clip-floor network, then its conversion simulated a few steps."""
    import torch

    from zoo.models.snn_ecl import ECLClassifier

    model = ECLClassifier(backbone="resnet18", in_shape=[3, 32, 32], num_classes=10, lambda_init=8.0, lr=0.1).to(device)
    optimizer, _ = model.make_optimizer(epochs=300)
    x = torch.randn(size["batch"], 3, 32, 32, device=device)
    y = torch.randint(0, 10, (size["batch"],), device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    model.train()
    rate = _timed_steps(step, device)
    with torch.no_grad():
        out = model.to_snn()(x, steps=size["snn_steps"])
    return rate, f"batch {size['batch']}; SNN simulated {size['snn_steps']} steps -> {tuple(out.shape)}"


def full_tsm(device: str, size: dict[str, Any]) -> tuple[float | None, str]:
    """TimeStep Master's experts (rank 4, scales 4/2/1) on an SD-sized UNet2DConditionModel built from its config."""
    import torch
    from diffusers import UNet2DConditionModel

    from zoo.nn.timestep_experts import inject_timestep_experts

    blocks = tuple(size["blocks"])
    n = len(blocks)
    config = {
        "sample_size": size["latent"],
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 2,
        "block_out_channels": blocks,
        "down_block_types": ("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",),
        "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1),
        "cross_attention_dim": size["cross"],
        "attention_head_dim": size["heads"],
        "norm_num_groups": 32 if blocks[0] >= 32 else blocks[0],
    }
    with torch.device(device):  # initialise the ~860 M parameters where they will live, not on the host first
        unet = UNet2DConditionModel(**config)
    experts = inject_timestep_experts(unet, ["to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2"], (4, 2, 1), rank=4)
    for layer in experts.values():
        layer.set_stage("foster", 0)
    params = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    b, side = size["batch"], size["latent"]
    latents = torch.randn(b, 4, side, side, device=device)
    text = torch.randn(b, size["tokens"], size["cross"], device=device)
    t = torch.randint(0, 250, (b,), device=device)  # scale 0's first expert's interval

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            noise_pred = unet(latents, t, encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(noise_pred.float(), latents)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    rate = _timed_steps(step, device)
    total, trained = (sum(p.numel() for p in group) / 1e6 for group in (unet.parameters(), params))
    return rate, f"UNet {total:.0f} M parameters, {len(experts)} expert layers, {trained:.1f} M trained"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="training steps per entry")
    parser.add_argument("--only", default=None, help="comma-separated entries (default: every zoo.list_models())")
    parser.add_argument(
        "--full-scale",
        choices=("auto", "on", "tiny", "off"),
        default="auto",
        help="the papers' full-scale steps: auto = on with CUDA, off on a CPU; tiny = the same code at toy sizes",
    )
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("No CUDA device available: the GPU check is skipped (use --device cpu to dry-run it).")
        return 0
    sys.path.insert(0, str(_ROOT))
    import zoo

    names = args.only.split(",") if args.only else zoo.list_models()
    unknown = sorted(set(names) - set(zoo.list_models()))
    if unknown:
        parser.error(f"unknown entries {unknown}; see zoo.list_models()")
    if args.device == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    start = time.perf_counter()
    results: list[Result] = []
    for name in names:
        results.append(_run(name, "fit", args.device, lambda n=name: check_fit(n, args.device, args.steps)))
        results.append(_run(name, "hub", args.device, lambda n=name: check_hub(n, args.device)))
    scale = {"auto": "on" if args.device == "cuda" else "off"}.get(args.full_scale, args.full_scale)
    if scale != "off":
        sizes = _FULL if scale == "on" else _TINY
        for name, fn in (("ra-sae", full_ra_sae), ("snn-ecl", full_snn_ecl), ("tsm", full_tsm)):
            if name in names:
                results.append(_run(name, f"full-{scale}", args.device, lambda f=fn, n=name: f(args.device, sizes[n])))
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} checks passed in {time.perf_counter() - start:.0f}s")
    for r in failed:
        print(f"  failed: {r.name} {r.check}: {r.note.splitlines()[0]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
