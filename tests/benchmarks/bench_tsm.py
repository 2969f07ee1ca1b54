"""Training steps/s of LoRA timestep experts against one peft LoRA of the same rank, on the tsm conf's UNet.

    python tests/benchmarks/bench_tsm.py [--repeats 7] [--threads 2] [--batch 64]

One step: the ε-prediction loss on a batch of 8×8 target digits with per-sample timesteps over [0, T), backward and
an AdamW step of the trained adapter weights (rank 4 on to_q, to_k, to_v, to_out.0, conv1, conv2). Rows: the frozen
UNet with a peft LoRA; TSM fostering one scale (one expert per sample, the LoRA's cost plus routing); TSM assembled
(the core and two gated context experts per sample, the router trained). Medians of ``--repeats`` runs of 10 steps.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

from zoo.datamodules.domains import DomainShiftDataModule
from zoo.models.tsm import TSMDiffusion


def steps_per_second(model: TSMDiffusion, x0: torch.Tensor, repeats: int) -> float:
    optimizer = model.configure_optimizers()
    model.train()

    def ten_steps() -> None:
        for _ in range(10):
            optimizer.zero_grad()
            t = torch.randint(0, 1000, (len(x0),))
            model.loss(x0, t, torch.randn_like(x0)).mean().backward()
            optimizer.step()

    return 10 / median_seconds(ten_steps, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = DomainShiftDataModule("target", batch_size=args.batch)
    dm.setup("fit")
    x0 = dm.train_set.tensors[0][: args.batch]
    torch.manual_seed(0)
    lora = TSMDiffusion(mode="lora", rank=4)
    foster = TSMDiffusion(mode="tsm", rank=4)
    foster.set_phase("foster", scale=0)
    assemble = TSMDiffusion(mode="tsm", rank=4)
    assemble.set_phase("assemble")
    rows = {"peft LoRA r4": lora, "TSM fostering (1 expert)": foster, "TSM assembled (3 experts + router)": assemble}
    rates = {name: steps_per_second(model, x0, args.repeats) for name, model in rows.items()}
    print(f"batch {args.batch}, {args.threads} thread(s), median of {args.repeats} × 10 steps")
    for name, rate in rates.items():
        print(f"  {name:36s} {rate:7.1f} steps/s   ({rates['peft LoRA r4'] / rate:.2f}× the LoRA's time)")


if __name__ == "__main__":
    main()
