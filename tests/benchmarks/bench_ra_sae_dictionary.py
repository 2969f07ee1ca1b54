"""Can RA-SAE form D = (W C + Λ)·e^m cheaper than a dense W C per training step? W's density, and dense against sparse.

    python tests/benchmarks/bench_ra_sae_dictionary.py [--steps 500] [--large]

1. Trains RASAE (the conf's settings, plain loop, Adam, clip 1.0) at the card's size (d = 32, k = 64) and at
   d = 64, k = 1,024, and prints the fraction of W's entries that are non-zero after the simplex projection
   (ReLU, then rows divided by their sums) as training goes: the sparsity a sparse product could exploit.
2. Times one thread forming W C densely (forward, and forward + backward: the gradient of W is the dense
   grad_D Cᵀ whatever W's sparsity) against the forward of a CSR copy of W (conversion included), at the card's
   size and, with ``--large``, at d = 768, k = 8,192 for W with 50 % and 5 % non-zeros. Medians of several runs.

In eval mode the dictionary is already fused once and cached until a parameter changes (exact: ``_version_key``);
in training W changes at every optimizer step, so there is nothing to cache between steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from zoo.datamodules.activations import ActivationsDataModule
from zoo.models.ra_sae import RASAE


def density_during_training(dim: int, num_atoms: int, steps: int) -> list[tuple[int, float]]:
    dm = ActivationsDataModule(
        source="synthetic", dim=dim, num_true_atoms=4 * num_atoms, n_samples=20000, center=True, batch_size=256
    )
    dm.setup("fit")
    model = RASAE(dim=dim, num_atoms=num_atoms, top_k=8 if num_atoms > 64 else 3, num_candidates=num_atoms)
    model.set_candidates(dm.candidate_points(num_atoms, seed=0))
    opt = torch.optim.Adam(model.parameters(), lr=model.hparams.lr)
    marks, out, step = {1, 10, 100, steps}, [], 0
    while step < steps:
        for x in dm.train_dataloader():
            loss = model._loss(x)[0]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step in marks:
                model.sae.dictionary.project_()
                out.append((step, float((model.sae.dictionary.W > 0).float().mean())))
            if step == steps:
                break
    return out


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def dense_vs_sparse(num_atoms: int, dim: int, density: float, repeats: int) -> tuple[float, float, float]:
    g = torch.Generator().manual_seed(0)
    W = torch.rand(num_atoms, num_atoms, generator=g) * (torch.rand(num_atoms, num_atoms, generator=g) < density)
    W = (W / W.sum(1, keepdim=True).clamp_min(1e-8)).requires_grad_(True)
    C = torch.randn(num_atoms, dim, generator=g)
    dense_fwd = _median_ms(lambda: W.detach() @ C, repeats)
    dense_step = _median_ms(lambda: (W @ C).sum().backward(), repeats)
    sparse_fwd = _median_ms(lambda: W.detach().to_sparse_csr() @ C, repeats)
    return dense_fwd, dense_step, sparse_fwd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--large", action="store_true", help="also time d = 768, k = 8,192 (about a minute)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for dim, k in ((32, 64), (64, 1024)):
        trace = ", ".join(f"step {s}: {100 * f:.0f} %" for s, f in density_during_training(dim, k, args.steps))
        print(f"d = {dim}, k = {k}: non-zero entries of W after the projection: {trace}")
    sizes = [(64, 32, 0.95, 50)] + ([(8192, 768, 0.5, 3), (8192, 768, 0.05, 3)] if args.large else [])
    for k, dim, density, repeats in sizes:
        dense_fwd, dense_step, sparse_fwd = dense_vs_sparse(k, dim, density, repeats)
        print(
            f"k = {k}, d = {dim}, {100 * density:.0f} % non-zero: dense W C {dense_fwd:.2f} ms (with backward "
            f"{dense_step:.2f} ms); CSR W C {sparse_fwd:.2f} ms, {dense_fwd / sparse_fwd:.2f}x the dense forward"
        )


if __name__ == "__main__":
    main()
