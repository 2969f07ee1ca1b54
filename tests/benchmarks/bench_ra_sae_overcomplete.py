"""Training steps/s of the zoo's RA-SAE against overcomplete's ``RATopKSAE`` (the paper's official library), same loop.

    pip install --no-deps overcomplete==0.3.0 einops opencv-python-headless scikit-image lazy_loader imageio tifffile
    python tests/benchmarks/bench_ra_sae_overcomplete.py [--large] [--repeats 5]

Both are a TopK SAE over a relaxed archetypal dictionary D = (W C + Λ)·e^m built from the same candidate points C
and formed anew at every training step (W C each step), each with its library's default encoder (the zoo: linear +
ReLU; overcomplete: linear + batch norm). One loop for both: Adam (lr 1e-3), reconstruction MSE, gradient-norm clip
1.0, on the same random batches. The card's size is d 32, k 64, top-k 3, batch 256; ``--large`` adds d 768,
k 8,192, top-k 20, batch 1,024. Prints the medians of ``--repeats`` timed runs and the ratio zoo / overcomplete.
overcomplete 0.3.0 calls ``matplotlib.cm.get_cmap`` at import, which matplotlib 3.9 removed: the script maps it to
``matplotlib.colormaps.get_cmap`` first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from zoo.models.ra_sae.sae import SparseAutoencoder


def _overcomplete(dim: int, k: int, top_k: int, points: torch.Tensor) -> torch.nn.Module:
    import matplotlib
    import matplotlib.cm

    if not hasattr(matplotlib.cm, "get_cmap"):
        matplotlib.cm.get_cmap = matplotlib.colormaps.get_cmap
    from overcomplete.sae import RATopKSAE

    return RATopKSAE(dim, k, points=points, top_k=top_k, delta=1.0, use_multiplier=True)


def _zoo(dim: int, k: int, top_k: int, points: torch.Tensor) -> torch.nn.Module:
    sae = SparseAutoencoder(dim, k, top_k, "ra", 1.0, True, k, "tied")
    sae.set_candidates(points)
    return sae


def steps_per_second(build: Callable, dim: int, k: int, top_k: int, batch: int, steps: int) -> float:
    g = torch.Generator().manual_seed(0)
    model = build(dim, k, top_k, torch.randn(k, dim, generator=g)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [torch.randn(batch, dim, generator=g) for _ in range(4)]

    def step(x: torch.Tensor) -> None:
        x_hat = model(x)[2]
        loss = (x - x_hat).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step(batches[0])  # warm-up
    start = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large", action="store_true", help="also d 768, k 8,192, batch 1,024 (a few minutes)")
    args = parser.parse_args()
    sizes = [(32, 64, 3, 256, 300)] + ([(768, 8192, 20, 1024, 3)] if args.large else [])
    for dim, k, top_k, batch, steps in sizes:
        zoo, ref = [], []
        for _ in range(args.repeats):
            zoo.append(steps_per_second(_zoo, dim, k, top_k, batch, steps))
            ref.append(steps_per_second(_overcomplete, dim, k, top_k, batch, steps))
        z, r = statistics.median(zoo), statistics.median(ref)
        print(
            f"d {dim}, k {k}, top-k {top_k}, batch {batch}: zoo {z:.2f} steps/s {[round(v, 2) for v in zoo]}, "
            f"overcomplete RATopKSAE {r:.2f} {[round(v, 2) for v in ref]}: {z / r:.2f}x ({torch.get_num_threads()} "
            "threads)"
        )


if __name__ == "__main__":
    main()
