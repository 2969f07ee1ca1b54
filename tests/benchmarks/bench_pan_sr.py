"""Seconds of the PAN screen against the number of columns p, and of the SR stage with and without it.

    python tests/benchmarks/bench_pan_sr.py [--repeats 3] [--threads 1] [--p 100 500 2000]

Data: Feynman I.12.1 (F = μ N, p_0 = 2) with (p / 2 - 1) same-distribution irrelevant copies per true variable,
1,000 training rows. Screen: one BART chain (20 trees, bartMachine's priors, 500 + 500 draws, the reproduction's
chain) and the whole screen of R = 20 such chains with the rank-clustering rule (the screen's cost is R chains,
so the second figure is about 20x the first). SR: gplearn with the card's §5 settings on all p columns and on
the screened ones. Medians of ``--repeats`` runs after a warm-up (the whole screen: one run).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

from zoo.datamodules.symbolic import feynman_dataset, split_with_noise
from zoo.models.pan_sr import GplearnSR, PanScreen, StochtreeBART

CHAIN = {"num_trees": 20, "burnin": 500, "draws": 500}


def sr_seconds(X: np.ndarray, y: np.ndarray, names: list[str], repeats: int) -> float:
    return median_seconds(lambda: GplearnSR(population=500, generations=15).fit(X, y, names), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--p", type=int, nargs="+", default=[100, 500, 2000])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(f"n_train 1,000, {args.threads} thread(s), medians of {args.repeats}")
    print(f"{'p':>6} {'one chain s':>12} {'screen (R=20) s':>16} {'kept':>5} {'SR all p s':>11} {'SR kept s':>10}")
    for p in args.p:
        X, y, names = feynman_dataset("I.12.1", n=1334, copies=p // 2 - 1, seed=0)
        X_tr, _, y_tr, _ = split_with_noise(X, y, seed=0)
        chain = median_seconds(lambda X=X_tr, y=y_tr: StochtreeBART(**CHAIN).split_counts(X, y, seed=0), args.repeats)
        start = time.perf_counter()
        kept = PanScreen(replicates=20, **CHAIN).fit(X_tr, y_tr).selected_
        screen_seconds = time.perf_counter() - start
        sr_all, sr_kept = (sr_seconds(X_tr[:, cols], y_tr, [names[i] for i in cols], args.repeats)
                           for cols in (np.arange(X.shape[1]), kept))  # fmt: skip
        print(f"{X.shape[1]:>6} {chain:>12.2f} {screen_seconds:>16.1f} {len(kept):>5} {sr_all:>11.2f} {sr_kept:>10.2f}")


if __name__ == "__main__":
    main()
