"""Points/s of SEAD's torch detector pool against a per-sample PySAD loop over a comparable pool.

    pip install pysad==0.7.0   # optional; only this script uses it
    python tests/benchmarks/bench_sead_pysad.py [--points 2000] [--repeats 5]

Both pools: LODA ×4, RS-Hash ×4, Half-Space Trees ×4 at the settings of ``zoo.models.sead.paper_pool`` where PySAD
has the same knob (projections/bins, components/hash functions, trees/depth/window; LODA follows PySAD's growing
histograms; PySAD's RS-Hash decays counts instead of a sliding window); the zoo's pool also has its MAD rule, which
PySAD (univariate MAD only) lacks. Each point is scored then learnt by every detector (prequential), one thread.
Prints medians of ``--repeats`` runs: the zoo's detectors row by row and chunked, the zoo's whole SEAD ensemble
(chunked detectors + normaliser + Hedge), and PySAD's per-sample loop over its detectors alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from zoo.datamodules.streams import make_drifting_stream
from zoo.models.sead import SEADEnsemble, build_pool, paper_pool
from zoo.models.sead.detectors import score_learn_many


def zoo_detectors_rowwise(x: torch.Tensor) -> float:
    pool = build_pool(paper_pool(x.shape[1]), x.shape[1])
    start = time.perf_counter()
    with torch.no_grad():
        for row in x:
            for detector in pool:
                detector.score_learn(row)
    return len(x) / (time.perf_counter() - start)


def zoo_detectors(x: torch.Tensor) -> float:
    pool = build_pool(paper_pool(x.shape[1]), x.shape[1])
    start = time.perf_counter()
    with torch.no_grad():
        score_learn_many(pool, x)  # each family's settings stacked, as the ensemble runs them
    return len(x) / (time.perf_counter() - start)


def zoo_ensemble(x: torch.Tensor) -> float:
    ens = SEADEnsemble(paper_pool(x.shape[1]), x.shape[1])
    start = time.perf_counter()
    ens(x)
    return len(x) / (time.perf_counter() - start)


def pysad_loop(x: np.ndarray) -> float:
    from pysad.models import LODA, HalfSpaceTrees, RSHash

    lo, hi = x[:256].min(0), x[:256].max(0)
    pool = (
        [
            LODA(num_bins=b, num_random_cuts=p)
            for p, b, _ in [(25, 10, 128), (50, 20, 256), (100, 20, 256), (50, 30, 512)]
        ]
        + [
            RSHash(feature_mins=lo, feature_maxes=hi, num_components=r, num_hash_fns=h)
            for r, h in [(25, 2), (50, 4), (100, 4), (50, 6)]
        ]
        + [
            HalfSpaceTrees(feature_mins=lo, feature_maxes=hi, window_size=w, num_trees=t, max_depth=d)
            for t, d, w in [(25, 6, 128), (25, 8, 250), (50, 8, 250), (25, 10, 500)]
        ]
    )  # PySAD's MedianAbsoluteDeviation is univariate only: its 12 detectors face the zoo's 13
    start = time.perf_counter()
    for row in x:
        for model in pool:
            model.score_partial(row)
            model.fit_partial(row)
    return len(x) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # PySAD runs on one thread; so does the zoo here
    x, _ = make_drifting_stream(n=args.points, seed=0)
    runs = {"zoo detectors rowwise": [], "zoo detectors": [], "zoo SEAD ensemble": [], "pysad loop": []}
    for _ in range(args.repeats):
        runs["zoo detectors rowwise"].append(zoo_detectors_rowwise(x))
        runs["zoo detectors"].append(zoo_detectors(x))
        runs["zoo SEAD ensemble"].append(zoo_ensemble(x))
        runs["pysad loop"].append(pysad_loop(x.double().numpy()))
    medians = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{k:<22} {[round(s) for s in v]} points/s, median {medians[k]:.0f}")
    print(
        f"zoo detectors (chunked) / pysad = {medians['zoo detectors'] / medians['pysad loop']:.2f}x; "
        f"zoo SEAD ensemble / pysad detectors alone = {medians['zoo SEAD ensemble'] / medians['pysad loop']:.2f}x"
    )


if __name__ == "__main__":
    main()
