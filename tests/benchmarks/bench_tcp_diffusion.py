"""Forecasts per second of TCP-Diffusion's ensemble, and milliseconds per training step.

    python tests/benchmarks/bench_tcp_diffusion.py [--repeats 3] [--threads 1] [--cases 200]

Forecasting: the hub model (``zoo.load("tcp-diffusion")``) forecasts ``--cases`` test cases of the embedded default
(16 x 16, 12 h) as an ensemble of the default size (4 members, DDIM 25 steps; every step is one batched UNet call
on all cases and members), then the ARP inverse and the ensemble mean; the official 200-step DDPM for comparison.
Training: one AdamW step of the conf's model on a batch of 32. Medians of ``--repeats`` runs after a warm-up.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
from zoo.datamodules.cyclone import CycloneDataModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = CycloneDataModule(n_train=64, n_val=1, n_test=args.cases)
    dm.setup("test")
    batch = dm.test_set.data
    model = zoo.load("tcp-diffusion")
    f = model.forecaster
    print(f"{args.cases} cases, {args.threads} thread(s), median of {args.repeats}")
    for sampler, steps, members in (("ddim", 25, 4), ("ddim", 25, 8), ("ddim", 10, 4), ("ddpm", 200, 4)):
        seconds = median_seconds(
            lambda s=sampler, n=steps, m=members: f.sample(batch, m, n, s, torch.Generator().manual_seed(0)),
            args.repeats if sampler == "ddim" else 1,
        )
        print(f"  {sampler} {steps:>3} steps x {members} members  {args.cases / seconds:8.1f} forecasts/s  "
              f"({1000 * seconds / args.cases:.1f} ms per forecast)")  # fmt: skip
    dm = CycloneDataModule(n_train=256, n_val=1, n_test=1)
    dm.setup("fit")
    train = {k: v[:32] for k, v in dm.train_set.data.items()}
    f.train()
    optimizer = torch.optim.AdamW(f.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        f.loss(train).backward()
        optimizer.step()

    print(f"  train step  {1000 * median_seconds(step, args.repeats):8.1f} ms (batch 32)")


if __name__ == "__main__":
    main()
