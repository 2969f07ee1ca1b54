"""Planning steps per second for ZILOT and its baselines, the share of a ZILOT step spent in Sinkhorn, and the
milliseconds per training step.

    python tests/benchmarks/bench_zilot.py [--repeats 5] [--episodes 3] [--threads 2] [--population 128]
                                           [--truncation remaining]

Planning: the hub model (``zoo.load("zilot")``) imitates the dense zig-zag (22 goals, 113 steps: the largest cost
matrices of the card's demonstrations) with iCEM at the conf's settings (H 12, 3 iterations) and ``--population``
candidates; the Sinkhorn share is its time inside :func:`zoo.nn.sinkhorn.sinkhorn` over the episode's wall time, with
the early stop at marginal error 1e-4 and with the card's 100 full iterations, under ``--truncation`` (the default
``remaining`` keeps the imagined states in the objective, so a step costs more than with ``official``, which plans a
constant and evaluates no imagined state once the learned expert time has passed; both rows are printed). Training: one step on a 512-transition
batch (loss, backward, Adam). Planners: medians of ``--episodes`` episodes; training: of ``--repeats`` runs after a
warm-up.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
import zoo.datamodules.envs  # noqa: F401  (registers zoo/DubinsPoint-v0)
from zoo.datamodules.demos import make_demo
from zoo.datamodules.offline_goals import OfflineGoalDataModule
from zoo.models.zilot import run_episode


def episode(model, name: str, demo: dict, **kw) -> tuple[float, float]:
    """(steps per second, Sinkhorn share) of one episode."""
    env = gym.make("zoo/DubinsPoint-v0", max_episode_steps=10_000)
    planner = model.planner(name, generator=torch.Generator().manual_seed(0), **kw)
    start = time.perf_counter()
    path = run_episode(env, planner, demo)
    seconds = time.perf_counter() - start
    return (len(path) - 1) / seconds, getattr(planner, "sinkhorn_seconds", 0.0) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--population", type=int, default=128)
    parser.add_argument("--episodes", type=int, default=3, help="episodes per planner (each 113 steps)")
    parser.add_argument("--truncation", default="remaining", help="ZILOT's horizon truncation: remaining or official")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("zilot")
    demo = make_demo("zigzag", dense=True)
    print(f"dense zig-zag ({len(demo['goals'])} goals, {demo['budget']} steps), population {args.population}, "
          f"{args.threads} thread(s); planners: medians of {args.episodes} episodes, training: of {args.repeats} steps")  # fmt: skip
    zilot = {"population": args.population, "truncation": args.truncation}
    runs = [
        (f"ZILOT (tol 1e-4, {args.truncation})", "zilot", zilot),
        ("ZILOT (100 iterations)", "zilot", {**zilot, "tol": None}),
        ("ZILOT (official truncation)", "zilot", {**zilot, "truncation": "official"}),
        ("MPC+Cls", "mpc_cls", {"population": args.population}),
        ("Pi+Cls", "pi_cls", {}),
    ]
    for label, name, kw in runs:
        results = [episode(model, name, demo, **kw) for _ in range(args.episodes)]
        rate = sorted(r[0] for r in results)[len(results) // 2]
        share = sorted(r[1] for r in results)[len(results) // 2]
        print(f"  {label:32s} {rate:8.1f} steps/s   Sinkhorn {100 * share:4.0f} % of a step")
    dm = OfflineGoalDataModule(episodes=50, val_episodes=5)
    dm.setup("fit")
    batch = dm.train_set.__getitems__(list(range(512)))
    trainee = zoo.create("zilot").train()
    optimizer = trainee.configure_optimizers()

    def step() -> None:
        optimizer.zero_grad()
        sum(trainee.losses(batch).values()).backward()
        optimizer.step()

    print(f"  train step {1000 * median_seconds(step, args.repeats):.1f} ms (batch 512)")


if __name__ == "__main__":
    main()
