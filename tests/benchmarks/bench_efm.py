"""EFM training speed and target memory at the card's sizes.

    python tests/benchmarks/bench_efm.py [--repeats 5] [--steps 200] [--threads 2]

* training steps/s of the card's toy step (512 field points, 1024 charges per plate, MLP 3 × 256): the whole
  ``EFM.loss`` + Adam step, median over ``repeats`` timed windows of ``steps`` steps, and the share of a step spent
  computing the field target;
* the image step of ``conf/efm-digits.yaml`` (UNet 16/32 on 1×8×8, 128 field points, 256 charges);
* peak CPU memory of ``FieldTarget`` for 512 points as the number of charges per plate grows 1× → 4× → 16×,
  chunked (``chunk_size`` 2048) and unchunked, from the profiler's allocator events.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from zoo.datamodules.pairs import toy_distribution
from zoo.models.efm import EFM, FieldTarget, lift


def peak_cpu_bytes(fn: Callable[[], object]) -> int:
    """Peak of the running sum of CPU allocations and frees the profiler records while ``fn`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def _steps_per_s(model: EFM, batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], steps: int, repeats: int) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rates = []
    for _ in range(repeats + 1):  # the first window warms up
        start = time.perf_counter()
        for _ in range(steps):
            loss = model.loss(*batch())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        rates.append(steps / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)

    toy = EFM(shape=[2])
    pools = toy_distribution("gaussian", 65536, g), toy_distribution("two_modes", 65536, g)

    def toy_batch() -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(65536, (1024,), generator=g)
        return pools[0][i], pools[1][i]

    rate = _steps_per_s(toy, toy_batch, args.steps, args.repeats)
    p, q = toy_batch()
    points = toy.sampler(p, q, 512)
    target = FieldTarget()
    times = []
    for _ in range(args.repeats * 20):
        start = time.perf_counter()
        target(points, lift(p, 0.0), lift(q, 6.0))
        times.append(time.perf_counter() - start)
    print(
        f"toy step (512 points, 1024 charges/plate, MLP 3x256): {rate:.0f} steps/s; "
        f"target {1e3 * statistics.median(times):.2f} ms of {1e3 / rate:.2f} ms"
    )

    image = EFM(
        shape=[1, 8, 8],
        L=10.0,
        net="unet",
        net_kwargs={"block_out_channels": [16, 32], "norm_num_groups": 8},
        sampler="uniform",
        num_field_points=128,
    )
    noise, digits = torch.randn(4096, 1, 8, 8, generator=g), torch.rand(1437, 1, 8, 8, generator=g) * 2 - 1

    def image_batch() -> tuple[torch.Tensor, torch.Tensor]:
        return noise[torch.randint(4096, (256,), generator=g)], digits[torch.randint(1437, (256,), generator=g)]

    rate = _steps_per_s(image, image_batch, max(args.steps // 4, 10), args.repeats)
    print(f"image step (UNet 16/32, 1x8x8, 128 points, 256 charges/plate): {rate:.1f} steps/s")

    print("peak memory of FieldTarget, 512 points in R^3 (MiB):")
    print("charges/plate | chunked (2048) | unchunked")
    for charges in (2048, 8192, 32768):
        pos, neg = lift(torch.randn(charges, 2, generator=g), 0.0), lift(torch.randn(charges, 2, generator=g), 6.0)
        chunked = peak_cpu_bytes(lambda: FieldTarget(chunk_size=2048)(points, pos, neg)) / 2**20
        whole = peak_cpu_bytes(lambda: FieldTarget(chunk_size=charges)(points, pos, neg)) / 2**20
        print(f"{charges:13d} | {chunked:14.1f} | {whole:9.1f}")


if __name__ == "__main__":
    main()
