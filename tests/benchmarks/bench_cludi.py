"""Seconds per CLUDI training step (and per digits epoch of 5 steps) by teacher option, teacher steps R and copies S.

    python tests/benchmarks/bench_cludi.py [--repeats 5] [--threads 2]

One step = the teacher's DDIM chain of R steps over S copies of a 256-row batch, the student's denoising pass (and
self-conditioning pass), the losses, backward and the AdamW update with per-parameter clipping, on the conf's digits
model. "through chain" is the official teacher (student in eval mode, gradients through all R steps), "detached"
samples it under no_grad, "ema" from the EMA copy. Medians of ``--repeats`` runs after a warm-up.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.models.cludi import CLUDIModule


def step_seconds(batch: tuple[torch.Tensor, ...], repeats: int, **kwargs: object) -> float:
    torch.manual_seed(0)
    model = CLUDIModule(**kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    model.log = model.log_dict = lambda *a, **k: None  # no Trainer attached: logging is a no-op here

    def step() -> None:
        optimizer.zero_grad()
        model.training_step(batch, 0).backward()
        model.on_before_optimizer_step(optimizer)
        optimizer.step()

    return median_seconds(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = FeatureClusteringDataModule()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    print(f"batch {len(batch[0])}, {args.threads} thread(s), median of {args.repeats}; ms per step (s per epoch)")
    rows = [
        ("no diffusion (ablation)", {"mode": "no_diffusion"}),
        *((f"S = 4, R = {r}, through chain", {"train_steps": r}) for r in (5, 10, 25)),
        ("S = 4, R = 10, detached", {"detach_teacher": True}),
        ("S = 4, R = 10, ema", {"teacher": "ema"}),
        *((f"S = {s}, R = 10, through chain", {"batch_diffusion": s}) for s in (2, 8)),
    ]
    for name, kwargs in rows:
        seconds = step_seconds(batch, args.repeats, **kwargs)
        print(f"  {name:32s} {1000 * seconds:8.1f} ms   ({5 * seconds:.2f} s per 5-step epoch)")


if __name__ == "__main__":
    main()
