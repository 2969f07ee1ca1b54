"""Sequences/s and reward calls/s of each reward-refine sampler at one population size.

    python tests/benchmarks/bench_reward_refine.py [--repeats 5] [--threads 2] [--n 64]

The hub denoiser ``reward-refine`` (2-layer, 64-wide masked diffusion transformer, L = 32) designs ``--n`` sequences
for the card's motif reward with each sampler at the reproduction's settings: unguided, best-of-N (N = 458),
SVDD (M = 14), RERD (M₀ = M = 4, S = 10, E = 8: 458 reward calls per sequence) and the GA ablation (M = 1, 330
rounds at the same budget). Prints medians of ``--repeats`` runs, and the forwards per sequence that explain them.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
from zoo.models.reward_refine import MotifReward, best_of_n, refine, svdd, unguided


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    net, reward, n = zoo.load("reward-refine").net.eval(), MotifReward(), args.n
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    samplers = {
        "unguided": lambda: unguided(net, n, generator=g()),
        "best-of-n (N = 458)": lambda: best_of_n(net, reward, n, 458, generator=g()),
        "svdd (M = 14)": lambda: svdd(net, reward, n, 14, generator=g()),
        "rerd (S = 10, E = 8, M = 4)": lambda: refine(net, reward, n, 10, 8, 4, 4, generator=g()),
        "ga (M = 1, 330 rounds)": lambda: refine(net, reward, n, 330, 8, 1, 4, generator=g()),
    }
    print(f"threads {args.threads}, population {n}, medians of {args.repeats} runs")
    for name, fn in samplers.items():
        design = fn()
        s = median_seconds(fn, args.repeats)
        print(f"  {name:<28} {n / s:8.1f} sequences/s  {n * design.reward_calls / s:9.0f} reward calls/s  "
              f"({design.reward_calls:.0f} calls, {design.denoiser_calls:.0f} forwards per sequence, {s:.2f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
