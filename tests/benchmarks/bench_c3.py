"""C³R's overhead per training step: the host + C³R step against the plain host's, as a ratio (its double backward).

    python tests/benchmarks/bench_c3.py [--repeats 20] [--threads 1] [--batch 128]

One Adam step of the conf's host (MLP encoders 32→64→d, fusion, head) on a batch of the embedded default: CE only,
then CE + C³R (the instrument, the counterfactual through ``autograd.grad(create_graph=True)``, L_nec, L_IV, L_fe);
A wider host (d = 256, hidden 512) too, where the matrix work weighs more than the per-op overhead.
Medians of ``--repeats`` steps after a warm-up.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

from zoo.datamodules.multimodal import MultiModalDataModule
from zoo.models.c3 import C3Classifier


def step_seconds(batch: dict[str, torch.Tensor], c3: bool, repeats: int, hidden: int, dim: int) -> float:
    torch.manual_seed(0)
    model = C3Classifier(c3=c3, hidden=hidden, dim=dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        features, z = model.encode(batch)
        loss = F.cross_entropy(model.head(z), batch["label"])
        if c3:
            loss = loss + model.c3(features, z, model.head, batch["label"])[0]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return median_seconds(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = MultiModalDataModule(n_train=args.batch, n_val=1, n_test=1)
    dm.setup()
    batch = dm.train_set.data
    print(f"batch {args.batch}, {args.threads} thread(s), median of {args.repeats} steps")
    for hidden, dim in ((64, 32), (512, 256)):
        plain = step_seconds(batch, False, args.repeats, hidden, dim)
        regularised = step_seconds(batch, True, args.repeats, hidden, dim)
        print(f"  host {hidden}/{dim}: plain {1000 * plain:6.2f} ms, + C³R {1000 * regularised:6.2f} ms, "
              f"ratio {regularised / plain:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
