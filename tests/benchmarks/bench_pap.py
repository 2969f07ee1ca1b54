"""Images/s of PAP's defended pipeline against the bare base, and PGD-10 prompt-training steps/s.

    python tests/benchmarks/bench_pap.py [--repeats 7] [--threads 2]

The hub's ``pap`` entry (the photo-patch CNN base with its learned prompts) on the 500 test patches (3×8×8): the
bare base's forward, the defended pipeline's (the base's prediction, the prompt of that class through a 3-D FFT and
its inverse, the base again), and one prompt-training step on a 128-image batch (ART's PGD-10 on the bare base,
the card's four-term loss, the signed step). The same three on a CIFAR-sized ResNet-18 base (untrained, 3×32×32;
the cost does not depend on the weights) at batch 32. Prints medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
from zoo.attacks import make_attack
from zoo.models.pap import PAPModule, SignSGD, pap_loss, predict_with_prompts


def _rates(model: PAPModule, x: torch.Tensor, y: torch.Tensor, batch: int, repeats: int) -> tuple[float, ...]:
    base, prompt = model.base, model.prompt
    with torch.no_grad():
        bare = median_seconds(lambda: base(x), repeats)
        defended = median_seconds(lambda: predict_with_prompts(base, prompt, x), repeats)
    pgd = make_attack(base, "pgd", model.hparams.eps, model.hparams.alpha, 10, model.hparams.num_classes)
    opt = SignSGD(prompt.parameters(), lr=0.01)
    xb, yb = x[:batch], y[:batch]

    def step() -> None:
        loss, _ = pap_loss(base, prompt, xb, pgd(xb, yb), yb, model.hparams.exp_l1_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    train = median_seconds(step, repeats)
    return len(x) / bare, len(x) / defended, 1 / train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("pap")
    dm = zoo.datamodule("pap")
    dm.setup("test")
    x, y = dm.test_set.x, dm.test_set.y
    rows = [("photo-patch CNN, 500 images (train batch 128)", *_rates(model, x, y, 128, args.repeats))]
    torch.manual_seed(0)
    cifar = PAPModule(base_backbone="resnet18", in_shape=[3, 32, 32], eps=8 / 255, alpha=2 / 255,
                      exp_l1_weight=5000.0).eval()  # fmt: skip
    xc, yc = torch.rand(32, 3, 32, 32), torch.arange(32) % 10
    rows.append(("CIFAR ResNet-18, 32 images (train batch 32)", *_rates(cifar, xc, yc, 32, max(3, args.repeats // 2))))
    print(f"threads {args.threads}, medians of {args.repeats} runs")
    print(f"{'':<46}{'bare img/s':>12}{'PAP img/s':>12}{'ratio':>8}{'PGD-10 train steps/s':>22}")
    for name, bare, defended, steps in rows:
        print(f"{name:<46}{bare:>12,.0f}{defended:>12,.0f}{defended / bare:>8.2f}{steps:>22.2f}")


if __name__ == "__main__":
    main()
