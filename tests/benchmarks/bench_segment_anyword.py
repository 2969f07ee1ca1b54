"""Images per second of the Segment Anyword pipeline at its default settings, step by step.

    python tests/benchmarks/bench_segment_anyword.py [--scenes 16] [--threads 1]

The hub model (``zoo.load("segment-anyword")``) segments ``--scenes`` of the reproduction's scenes (textured, half
shared-colour): the full pipeline (40 textual-inversion steps of 8 draws, DDIM inversion and Direct-Inversion
denoising in 20 steps with the cross-attention recorder, R1, R2, the random-walker refiner), and its parts timed on
their own: textual inversion, inversion + recording, and the prompts + refiner; the raw-attention baseline for
comparison.
"""

from __future__ import annotations

import argparse
import time

import torch

import zoo
from zoo.datamodules.shapes import captioned_shapes
from zoo.models.segment_anyword.experiment import SCENES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("segment-anyword")
    data = captioned_shapes(args.scenes, seed=123, **SCENES)
    print(f"{args.scenes} scenes, {args.threads} thread(s)")
    for name, overrides in (("full pipeline", {}), ("no textual inversion", {"tuning_steps": 0}),
                            ("raw attention (B0)", {"mode": "raw", "tuning_steps": 0, "refiner": None})):  # fmt: skip
        pipe = model.pipeline(**overrides)
        timings = {"maps": 0.0, "masks": 0.0}
        start = time.perf_counter()
        for i in range(args.scenes):
            image, caption, ids = data["image"][i], data["caption"][i], data["tokens"][i]
            phrases, tokens = pipe.targets(caption)
            t0 = time.perf_counter()
            maps = pipe.attention_maps(image, ids, pipe.flat_positions(tokens), torch.Generator().manual_seed(i))
            t1 = time.perf_counter()
            pipe.masks_from_maps(image, maps, phrases, tokens, torch.Generator().manual_seed(i))
            timings["maps"] += t1 - t0
            timings["masks"] += time.perf_counter() - t1
        total = time.perf_counter() - start
        print(f"  {name:22s} {args.scenes / total:7.2f} images/s   maps {1000 * timings['maps'] / args.scenes:7.1f} "
              f"ms, prompts + refiner {1000 * timings['masks'] / args.scenes:6.1f} ms per image")  # fmt: skip


if __name__ == "__main__":
    main()
