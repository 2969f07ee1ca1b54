"""``zoo reproduce snn-ecl``: does ECL convert at ultra-low latency, and better than QCFS, on the digits CNN?

The ECL card's §6 experiment on scikit-learn's digits (1297 train / 500 test, stratified) with the card's CNN (conv
16-32, avg-pool, conv 32, avg-pool, FC 128, FC 10; BatchNorm before every activation). Per seed, three ANNs are
trained the same way (60 epochs, SGD lr 0.05, momentum 0.9, wd 5e-4 on weights and λ, cosine, batch 64;
``ECLClassifier.make_optimizer``) in a plain loop: ReLU, clip-floor with L = 4 (matched to the low T) and clip-floor
with L = 16 (QCFS's code default), λ initialised at 4. Every arm converts one of them and is simulated once for its
largest T (accuracy read at T = 1 … 32; naive conversion also at T = 256, the long-T exactness check):

* the method, **ecl**: clip-floor L = 4, θ = λ, v(0) = θ/2, dual threshold (θ⁻ = 0);
* baselines: **qcfs** (the same ANN, single threshold: QCFS, ECL's closest baseline), **qcfs-L16** / **ecl-L16**
  (both at L = 16) and **maxnorm** (threshold balancing: the ReLU network with each layer's maximum activation as
  its threshold, plain IF neurons);
* ablations: **no-clip** (a ReLU network with 99.9th-percentile thresholds, v(0) = θ/2 and the dual neuron: ECL
  without its learnable clip) and **v0=0** (ECL with v(0) = 0);
* alternatives: **naive** (the ReLU network, 99.9th-percentile thresholds, plain IF neurons: what a practitioner
  converts first) and **relu-half** (the same with QCFS's v(0) = θ/2).

What the run shows (the page's verdict table has the numbers): ECL reaches ≥ 98 % at T = 2 where every stand-in
stays below (asserted); it beats QCFS at T = 2 on every seed, but a ReLU network with v(0) = θ/2 and the dual neuron
does about as well, so "beyond QCFS" is reported with the diagnosis (``zoo reproduce snn-ecl --diagnose``: L and
training budget).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.claims import Check, Claim, TaskCheck
from zoo.datamodules.images import ImageDataModule
from zoo.evidence import Headline
from zoo.models.snn_ecl.module import ECLClassifier
from zoo.reporting import arm_table, conclude, plot_sweep, run_arms

__all__ = ["ANNS", "ARMS", "CHECKS", "CLAIMS", "HEADLINES", "STEPS", "diagnose", "fit_ann", "run", "snn_accuracy"]

STEPS = (1, 2, 4, 8, 16, 32)
LONG = 256  # naive conversion's exactness check (card review: T = 32 is too short for the CNN's five layers)
# ANN name -> ECLClassifier arguments (λ initialised at 4 for every clip network)
ANNS: dict[str, dict[str, Any]] = {
    "relu": {"activation": "relu"},
    "L4": {"activation": "clip_floor", "levels": 4},
    "L16": {"activation": "clip_floor", "levels": 16},
}
# arm -> (ANN, to_snn arguments); arms with a percentile calibrate their thresholds on the training images.
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "ecl": ("L4", {"v0_ratio": 0.5, "dual": True, "neg_threshold": 0.0}),
    "qcfs": ("L4", {"v0_ratio": 0.5, "dual": False}),
    "maxnorm": ("relu", {"percentile": 100.0, "v0_ratio": 0.0, "dual": False}),
    "ecl-L16": ("L16", {"v0_ratio": 0.5, "dual": True, "neg_threshold": 0.0}),
    "qcfs-L16": ("L16", {"v0_ratio": 0.5, "dual": False}),
    "no-clip": ("relu", {"percentile": 99.9, "v0_ratio": 0.5, "dual": True}),
    "v0=0": ("L4", {"v0_ratio": 0.0, "dual": True}),
    "naive": ("relu", {"percentile": 99.9, "v0_ratio": 0.0, "dual": False}),
    "relu-half": ("relu", {"percentile": 99.9, "v0_ratio": 0.5, "dual": False}),
}


def fit_ann(
    model: ECLClassifier, x: Tensor, y: Tensor, epochs: int, batch_size: int = 64, seed: int = 0
) -> ECLClassifier:
    """Train ``model`` on ``(x, y)`` with its own recipe (``make_optimizer``) in a plain loop; returns it, in eval
    mode."""
    opt, sched = model.make_optimizer(epochs)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(x), batch_size):
            rows = order[start : start + batch_size]
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    return model.eval()


@torch.no_grad()
def snn_accuracy(snn: Any, x: Tensor, y: Tensor, steps: int, chunk: int | None = None) -> Tensor:
    """Accuracy after every step ``(steps,)`` from one simulation of ``steps`` steps."""
    return (snn.predict(x, steps, chunk).argmax(-1) == y).float().mean(-1)


_BASELINES = {
    "qcfs": "QCFS: the same L = 4 network with single-threshold neurons (v(0) = θ/2)",
    "maxnorm": "threshold balancing: the ReLU network, each layer's maximum activation as θ, plain IF neurons",
}
_ABLATIONS = {
    "no-clip": "ECL without its learnable clip: a ReLU network, 99.9th-percentile θ, v(0) = θ/2, dual neurons",
    "v0=0": "ECL with v(0) = 0 (the half-threshold start off)",
}
_ALTERNATIVES = {
    "naive": "the ReLU network with 99.9th-percentile thresholds and plain IF neurons (naive conversion)",
    "relu-half": "the same with QCFS's v(0) = θ/2",
}

# Calibration: `OMP_NUM_THREADS=1 python explore.py {60,30} 0,1,2,3,4` (every arm, both budgets, seeds 0-4; the run
# uses 0-2; the CALIBRATION block below lists T = 2 accuracy in %, full (60 epochs) | quick (30), per seed):
#   ecl       99.4 98.2 98.4 96.6 98.6 | 98.4 98.8 99.0      qcfs      97.8 96.8 98.0 87.8 96.6 | 96.2 97.2 97.4
#   no-clip   98.4 94.8 94.6 98.4 98.8 | 98.0 95.0 97.4      relu-half 84.0 92.6 92.2 82.4 90.0 | 82.2 91.0 97.2
#   maxnorm    9.6  9.8 10.2  9.6  9.6 |  9.6  9.8 10.2      naive      9.6  9.8 10.2  9.6  9.6 |  9.6  9.8 10.2
#   v0=0       9.6  9.6  9.6 10.8  9.8 |  9.6  9.6  9.6      ecl-L16   90.0 94.6 89.8 87.2 96.4 | 94.4 94.6 92.2
#   qcfs-L16  76.0 88.2 78.0 23.4 76.2 | 87.0 90.2 80.0      (quick: seeds 0-2)
# ecl_T2_at_least_98 on the run's 3-seed means: ecl 98.7 | 98.7; the best stand-in qcfs 97.5 | 96.9 (0.5 below the
#   bound in the full run: about 2 of the 500 test digits). ecl_T2_above_qcfs (reported): ecl +1.6 +1.4 +0.4 +8.8
#   +2.0; no-clip +0.6 −2.0 −3.4 +10.6 +2.2 (its 5-seed mean, +1.6, passes the bound: seed luck decides it).
#   ecl_T4_within_1_of_ann (reported): qcfs and relu-half pass. The task check's margin: ecl − max(naive, maxnorm)
#   at T = 2 is 86-89 points on every seed. Checks: naive at T = 4 −35 to −79 below its ANN; at T = 256 within 0.4.
CLAIMS = (
    Claim(
        "ecl_T2_at_least_98",
        lambda r, a: r[f"{a}/T2"],
        at_least=98.0,
        method="ecl",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        text="ECL converts at ultra-low latency: ≥ 98 % test accuracy at T = 2 (its ANN: 99.4 %)",
    ),
    Claim(
        "ecl_T2_above_qcfs_by_0.3",
        lambda r, a: r[f"{a}/T2"] - r["qcfs/T2"],
        at_least=0.3,
        method="ecl",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="ECL beats QCFS at T = 2 (same network, L = 4) by ≥ 0.3 points (reported: ECL without its learnable "
        "clip matches it over 5 seeds)",
    ),
    Claim(
        "ecl_L16_T2_above_qcfs_L16_by_3",
        lambda r, a: r[f"{a}/T2"] - r["qcfs-L16/T2"],
        at_least=3.0,
        method="ecl-L16",
        baselines={"qcfs-L16": "QCFS on the same L = 16 network", "maxnorm": _BASELINES["maxnorm"]},
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="with QCFS's code default L = 16, ECL beats QCFS at T = 2 by ≥ 3 points (reported: a ReLU network with "
        "the dual neuron beats both)",
    ),
    Claim(
        "ecl_T4_within_1_of_ann",
        lambda r, a: r[f"{a}/T4"] - r[f"{a}/ann"],
        at_least=-1.0,
        method="ecl",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="ECL at T = 4 is within 1 point of its ANN (card §6 assertion 1; reported: QCFS and the ReLU network with "
        "the half start pass too)",
    ),
)
CHECKS = (
    TaskCheck(
        lambda r, a: r[f"{a}/T2"],
        method="ecl",
        heuristics={"naive": _ALTERNATIVES["naive"], "maxnorm": _BASELINES["maxnorm"]},
        margin=50.0,
        text="at T = 2 the classical conversions (percentile or max-activation thresholds, plain IF neurons) are far "
        "below: the task needs a low-latency conversion",
    ),
    Check(
        "naive_T4_at_least_30_below_ann",
        lambda r: r["naive/T4"] - r["naive/ann"],
        at_most=-30.0,
        text="the baseline behaves as the card says: naive conversion is ≥ 30 points below its ANN at T = 4",
    ),
    Check(
        f"naive_T{LONG}_within_2_of_ann",
        lambda r: r[f"naive/T{LONG}"] - r["naive/ann"],
        at_least=-2.0,
        text=f"the simulator is exact in the long-T limit: naive conversion within 2 points of its ANN at T = {LONG}",
    ),
)
HEADLINES = [
    Headline(
        "ultra_low_latency",
        "ECL converts an ANN into an SNN that keeps high accuracy at ultra-low latency (T = 2)",
        claims=["ecl_T2_at_least_98"],
        paper="94.75 % on CIFAR-10 with ResNet-18 at T = 2",
    ),
    Headline(
        "beyond_qcfs",
        "ECL's error compensation (learnable clip, dual-threshold neuron, half-threshold start) beats QCFS, its "
        "closest baseline, at low T",
        claims=["ecl_T2_above_qcfs_by_0.3", "ecl_L16_T2_above_qcfs_L16_by_3"],
        paper="large gains over QCFS at T = 2 (tables not retrieved; QCFS ResNet-18 T = 2 ≈ 75 % in its own paper)",
        diagnosis=(
            "ECL beats QCFS at T = 2 on every seed at L = 4 (+0.4 to +8.8 points, seeds 0-4, 60 epochs), and by far "
            "more when L exceeds T (L = 16: +6 to +64): the dual-threshold neuron compensates what the paper says. "
            "But the learnable clip is not what does it: a ReLU network with 99.9th-percentile thresholds, the "
            "half-threshold start and the same dual neuron gains over QCFS as much on 5-seed average (+1.6 against "
            "ECL's +2.8; −3.4 to +10.6 per seed), and at L = 16 it beats ECL itself (95.9 against 91.5 %, seeds 0-2). "
            "The sweep (zoo reproduce snn-ecl --diagnose) keeps ECL's lead over QCFS at L = 4 from 30 to 120 epochs "
            "(+1.2 to +1.9) and shows it growing with L as QCFS's quantisation error dominates at T < L; with the ANN "
            "at 99.4 % on 8×8 digits (500 test images, 0.2 points each) a harder task may still separate the "
            "learnable clip, which this one cannot. No official ECL code exists; QCFS's official activation and "
            "neuron match the zoo's (tests/fixtures/reference/snn-ecl)."
        ),
    ),
]


class _Experiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``: a seed's ANNs are trained once, then every arm converts its
    ANN and simulates it once for its largest T. Writes the ANN accuracies, training seconds and learned λ of the seed
    into ``r`` (``ann/<name>/seed<s>``, ...), which ``run_arms`` averages over seeds with the rest."""

    def __init__(self, epochs: int, data: tuple[Tensor, ...], r: dict[str, Any], anns: Mapping[str, Mapping] = ANNS,
                 arms: Mapping[str, tuple[str, dict[str, Any]]] = ARMS) -> None:  # fmt: skip
        self.epochs, self.data, self.r, self.ann_args, self.arms = epochs, data, r, anns, arms
        self.seed: int | None = None
        self.anns: dict[str, ECLClassifier] = {}

    def _ann(self, name: str, seed: int) -> ECLClassifier:
        if seed != self.seed:
            self.seed, self.anns = seed, {}
        if name not in self.anns:
            x, y, x_test, y_test = self.data
            torch.manual_seed(seed)
            start = time.perf_counter()
            ann = fit_ann(ECLClassifier(lambda_init=4.0, **self.ann_args[name]), x, y, self.epochs, seed=seed)
            self.r[f"seconds_train/{name}/seed{seed}"] = time.perf_counter() - start
            with torch.no_grad():
                self.r[f"ann/{name}/seed{seed}"] = 100 * float((ann(x_test).argmax(1) == y_test).float().mean())
            for layer, value in ann.thresholds.items():
                self.r[f"lambda/{name}/{layer}/seed{seed}"] = value
            self.anns[name] = ann
        return self.anns[name]

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        name, kwargs = self.arms[arm]
        ann = self._ann(name, seed)
        x, _, x_test, y_test = self.data
        snn = ann.to_snn(calibration=x if "percentile" in kwargs else None, **kwargs)
        steps = LONG if arm == "naive" else STEPS[-1]
        start = time.perf_counter()
        acc = snn_accuracy(snn, x_test, y_test, steps, chunk=16)  # small chunks stay in cache: fastest here
        m = {"seconds_snn": time.perf_counter() - start, "ann": self.r[f"ann/{name}/seed{seed}"]}
        for t in STEPS + ((LONG,) if arm == "naive" else ()):
            m[f"T{t}"] = 100 * float(acc[t - 1])
        return m


def _digits() -> tuple[Tensor, ...]:
    dm = ImageDataModule()
    dm.setup("fit")
    return dm.train_set.x, dm.train_set.y, dm.test_set.x, dm.test_set.y


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms over 3 seeds, print the tables and claims, and (with ``out``) write ``snn-ecl.json`` and
    ``snn-ecl.png``.

    ``quick`` trains the ANNs for 30 epochs instead of 60 (calibrated at both; about half the time).

    Returns:
        flat results: ``<arm>/T<t>`` mean test accuracy in % and ``<arm>/ann`` (its ANN's), each also per seed
        (``.../seed<s>``), ``ann/<name>``, training and simulation seconds, the learned λ per layer
        (``lambda/<name>/<layer>``), and the verdicts.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an 8×8 CNN on batches of 64: extra threads only add overhead
    try:
        start = time.perf_counter()
        seeds, epochs = (0, 1, 2), 30 if quick else 60
        r: dict[str, Any] = {"epochs": epochs, "num_seeds": len(seeds)}
        run_arms(list(ARMS), seeds, _Experiment(epochs, _digits(), r), results=r)
        r["seconds"] = time.perf_counter() - start
        table = arm_table(
            r,
            list(ARMS),
            ["ann", *(f"T{t}" for t in STEPS), f"T{LONG}"],
            f"SNN test accuracy % on digits, mean ± std of {len(seeds)} seeds ({epochs} ANN epochs)",
            fmt="{:.1f}",
        )
        note = (
            f"dual − single threshold at T = 2: L = 4 {r['ecl/T2'] - r['qcfs/T2']:+.1f}, L = 16 "
            f"{r['ecl-L16/T2'] - r['qcfs-L16/T2']:+.1f}, ReLU network {r['no-clip/T2'] - r['relu-half/T2']:+.1f} "
            f"points; total {r['seconds']:.0f} s"
        )
        return conclude("snn-ecl", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[table], notes=[note],
                        headlines=HEADLINES)  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        (("ecl", "qcfs", "maxnorm", "naive", "relu-half"), "ECL against the baselines and alternatives (L = 4)"),
        (("ecl", "no-clip", "v0=0", "ecl-L16", "qcfs-L16"), "ablations, and both at L = 16"),
    )
    for ax, (arms, title) in zip(axes, panels):
        for arm in arms:
            ax.plot(STEPS, [r[f"{arm}/T{t}"] for t in STEPS], marker="o", label=arm)
        for name, style in (("relu", ":"), ("L4", "--")):
            ax.axhline(r[f"ann/{name}"], color="grey", linestyle=style, linewidth=1, label=f"ANN ({name})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("time steps T")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- diagnosis -----------------------------------------------------------------------------------------------------

DIAGNOSIS_ARMS = ("ecl", "qcfs", "no-clip")


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Does ECL's lead over QCFS and over its no-clip ablation depend on L and the training budget? T = 2 accuracy of
    ECL, QCFS and no-clip with the clip-floor network at L = 4, 8, 16 (60 epochs) and at L = 4 with 30 and 120 epochs
    (quick: L = 4, 16 and 30 epochs only), seeds 0-2; writes ``snn-ecl.diagnose.json`` / ``.png``."""
    sizes = ["L4/e30", "L4/e60", "L16/e60"] if quick else ["L4/e30", "L4/e60", "L4/e120", "L8/e60", "L16/e60"]
    data = _digits()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def cell(size: str, seed: int) -> dict[str, float]:
            level, epochs = size.split("/e")
            anns = {"relu": {"activation": "relu"}, "clip": {"activation": "clip_floor", "levels": int(level[1:])}}
            arms = {"ecl": ("clip", ARMS["ecl"][1]), "qcfs": ("clip", ARMS["qcfs"][1]), "no-clip": ARMS["no-clip"]}
            experiment = _Experiment(int(epochs), data, {}, anns, arms)
            return {f"{arm}/T2": experiment(arm, seed)["T2"] for arm in DIAGNOSIS_ARMS}

        r = run_arms(sizes, (0, 1, 2), cell, log=print)
    finally:
        torch.set_num_threads(threads)

    def plot(res: Mapping[str, Any], path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        series = {a: "{size}/" + f"{a}/T2" for a in DIAGNOSIS_ARMS}
        by_level = [s for s in sizes if s.endswith("/e60")]
        plot_sweep(axes[0], res, by_level, [int(s.split("/")[0][1:]) for s in by_level], series, "quantisation levels "
                   "L (60 epochs)", "accuracy at T = 2 (%)", title="T = 2 against L", log_x=True)  # fmt: skip
        by_budget = [s for s in sizes if s.startswith("L4/")]
        plot_sweep(axes[1], res, by_budget, [int(s.split("/e")[1]) for s in by_budget], series, "ANN epochs (L = 4)",
                   "", title="T = 2 against the training budget", log_x=True)  # fmt: skip
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    table = arm_table(r, sizes, [f"{a}/T2" for a in DIAGNOSIS_ARMS], "Diagnosis: T = 2 accuracy (%) by L and "
                      "epochs, seeds 0-2", fmt="{:.1f}")  # fmt: skip
    return conclude("snn-ecl.diagnose", r, out=out, plot=plot, tables=[table])
