"""Imputed trajectory windows per second by sampler and steps, and milliseconds per training step, for ProDiff.

    python tests/benchmarks/bench_prodiff.py [--repeats 5] [--threads 2] [--windows 1024]

Imputation: the hub model (``zoo.load("prodiff")``) fills ``--windows`` test windows of the street-grid city in one
batch: DDIM at 10 (the default), 25 and 50 steps, and DDPM over all T = 100 steps; every step is one batched UNet
call on the conditional and unconditional embeddings together. Training: one step (loss, backward, AdamW) on a
128-window batch for ProDiff (two prototype-extractor passes, K-means, two UNet passes) and Diff+Mask. Medians of
``--repeats`` runs after a warm-up.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
from zoo.datamodules.trajectories import TrajectoryDataModule
from zoo.models.prodiff import ProDiff


def step_seconds(raw: torch.Tensor, repeats: int, **kwargs: object) -> float:
    torch.manual_seed(0)
    model = ProDiff(**kwargs).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    def step() -> None:
        optimizer.zero_grad()
        model.losses(raw)["loss"].backward()
        optimizer.step()

    return median_seconds(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = TrajectoryDataModule()
    dm.setup("fit")
    dm.setup("test")
    test = dm.test_set.tensors[-1][: args.windows]
    model = zoo.load("prodiff")
    print(f"{len(test)} windows, {args.threads} thread(s), median of {args.repeats}")
    for sampler, steps in (("ddim", 10), ("ddim", 25), ("ddim", 50), ("ddpm", 100)):
        seconds = median_seconds(
            lambda s=sampler, n=steps: model.impute(
                test, sampler=s, steps=n, generator=torch.Generator().manual_seed(0)
            ),
            args.repeats,
        )
        print(f"  impute {sampler} {steps:>3} steps   {len(test) / seconds:9.0f} windows/s   ({1000 * seconds:.0f} ms)")
    raw = dm.train_set.tensors[-1][:128]
    for name, kwargs in (("ProDiff", {}), ("Diff+Mask", {"prototypes": False})):
        print(f"  train step {name:10s} {1000 * step_seconds(raw, args.repeats, **kwargs):8.1f} ms (batch 128)")


if __name__ == "__main__":
    main()
