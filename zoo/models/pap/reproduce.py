"""``zoo reproduce pap``: phase- and amplitude-aware prompts against the bare model, the C-AVP proxy and controls.

The PAP card's §6 experiment on scikit-learn's digits (1297 train / 500 test, stratified, 1×8×8 in [0, 1]), with
the card's CNN (conv 1→16→32, 3×3, average pooling, FC 64, FC 10), per seed:

* the base: PGD adversarial training (ε = 0.1, α = 0.025, 5 steps, random start; Adam 1e-3, batch 128) in a plain
  loop (:func:`fit_base`); a naturally trained base for the report-only row;
* prompts trained on the frozen base with PAP's recipe (:func:`~zoo.models.pap.training.fit_prompt`: PGD-10 on
  the bare base, the card's loss with the tuned exp-L1 weight 26, sign-SGD lr 0.3 → 0.03 at 75 %, λ updated every
  5 epochs and clamped to [0.1, 10]);
* arms, all with the predicted-label selection rule: **bare**; **pap**; **pap-fixed-lambda** (λ kept at 1);
  **cavp** (the class-wise additive pixel prompt, same loss, budget and rule); **init** (the exemplar-initialised
  prompts, untrained); **random** (Gaussian prompts with the trained prompts' per-class norms); **bare-natural-base**
  and **pap-natural-base** (a naturally trained base, bare and with PAP: the paper's stated limitation; report only);
* each arm scored on the test images: natural accuracy; robust accuracy under PGD-10 (ε = 0.1, α = 0.025) crafted
  on the bare base (**nonadaptive**, the paper's setting), through the whole pipeline with straight-through
  selection (**adaptive**), and the worst case over that attack and the attack with each class's prompt forced
  (**adaptive_worst**); and with the prompts picked by the true label (**oracle**, diagnostic only).

The claims, the stand-in arms each must reject, the sanity checks and their calibration are in ``CLAIMS`` and
``CHECKS`` below.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.attacks import make_attack
from zoo.callbacks.robust_eval import robust_accuracies
from zoo.claims import Check, Claim
from zoo.datamodules.images import ImageDataModule
from zoo.models.pap.attacks import PromptedPipeline
from zoo.models.pap.baselines import PixelPrompt, matched_norm_random_prompt
from zoo.models.pap.module import build_base_net
from zoo.models.pap.prompt import PhaseAmplitudePrompt
from zoo.models.pap.training import fit_prompt
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "fit_base", "run"]

ARMS = ("bare", "pap", "pap-fixed-lambda", "cavp", "init", "random", "bare-natural-base", "pap-natural-base")
METRICS = ("natural", "nonadaptive", "adaptive", "adaptive_worst", "oracle")
EPS, ALPHA = 0.1, 0.025
CAVP_LR = 0.01  # sign steps on pixels in [0, 1]: PAP's 0.3 (a spectrum step) would saturate the image at once


def fit_base(
    x: Tensor, y: Tensor, epochs: int, adversarial: bool = True, attack_steps: int = 5, seed: int = 0
) -> nn.Module:
    """The card's digits CNN trained by PGD adversarial training (or naturally, ``adversarial=False``) in a plain
    loop, Adam lr 1e-3, batch 128; returned frozen, in eval mode."""
    torch.manual_seed(seed)
    net = build_base_net("card_cnn", list(x.shape[1:]), int(y.max()) + 1)
    pgd = make_attack(net, "pgd", EPS, ALPHA, attack_steps, int(y.max()) + 1) if adversarial else None
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(x), 128):
            rows = order[start : start + 128]
            xb = pgd(x[rows], y[rows]) if pgd is not None else x[rows]
            net.train()
            loss = nn.functional.cross_entropy(net(xb), y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return net.requires_grad_(False).eval()


def _minus(metric: str, arm: str):
    """``value(r, a)``: arm ``a``'s ``metric`` minus arm ``arm``'s (points)."""
    return lambda r, a: r[f"{a}/{metric}"] - r[f"{arm}/{metric}"]


def _robust_gain(r: Mapping[str, Any], a: str) -> float:
    """The robust gain over the bare model that holds under both threats: min(non-adaptive, adaptive worst case)."""
    return min(r[f"{a}/nonadaptive"], r[f"{a}/adaptive_worst"]) - r["bare/nonadaptive"]


_BARE = "the bare adversarially trained base, no prompt"
_INIT = "the prompts left at their exemplar initialisation (no training)"
_RANDOM = "random prompts with the trained prompts' per-class norms (any input change, nothing learned)"
_CAVP = "the class-wise additive pixel prompt (C-AVP proxy) with the same loss, budget and selection rule"

# Calibration (``OMP_NUM_THREADS=1 python -m zoo.cli reproduce pap [--quick]``; full: seeds 0 / 1 / 2, quick: seed 0
# at half the epochs): each claim's value for the method | each stand-in, in points.
#
#   pap_natural_within_6_of_bare (pap | random | init):   -2.0 / -4.2 / -1.6 | -80.6 / -78.0 / -89.4 |
#       -92.6 / -92.6 / -94.8; quick 0.0 | -74.0 | -86.8
#   nonadaptive_overstates_pap_by_15 (pap | bare):          24.6 / 28.8 / 29.8 | 0 / 0 / 0; quick 22.6 | 0
#   pap_robust_gain_nonadaptive (pap | bare, init, random, cavp): -3.4 / -5.4 / -4.2 | 0 | about -66 | -52 to -66 |
#       0.0 / 0.0 / 0.0; quick -4.0 | ... | cavp +0.2 (reported: PAP is below the bare model on every seed)
#   pap_robust_gain_nonadaptive_and_adaptive (same arms):  -28.0 / -34.2 / -34.0 | ... | cavp -1.4 / -2.2 / -1.6
#   oracle_prompts_robust_10_above_bare (pap | init | random): 4.0 / -3.2 / 2.2 | about -67 | -53 to -66; quick 5.0
#   adaptive_lambda_beats_fixed_lambda_natural (pap | fixed λ): 58.0 / 49.6 / 58.6 | 0; quick 2.0 | 0 (the card asks
#       for the ablation to be reported only; λ fixed at 1 diverges at lr 0.3: natural 35.4 / 41.2 / 35.6)
#
# Exploratory, seed 0 only (/tmp script, not part of the run; the lr dropped one epoch later): lr 0.1 gives
# natural 94.2, non-adaptive 69.4 against the bare model's 70.0, oracle 75.6, λ ≈ 1; lr 0.03 and the raw exp-L1
# weight 5000 were no better. The card's pilot gain (+1.7 to +2.8 points) came from a numpy MLP whose robust accuracy
# was 20.8 %; this CNN base is at about 70 %.
CLAIMS = (
    Claim(
        "pap_natural_within_6_of_bare",
        _minus("natural", "bare"),
        at_least=-6.0,
        method="pap",
        stand_ins={"random": _RANDOM, "init": _INIT},
        text="PAP's prompted natural accuracy is within 6 points of the bare model's (card §6 assertion 2)",
    ),
    Claim(
        "nonadaptive_overstates_pap_by_15",
        lambda r, a: r[f"{a}/nonadaptive"] - r[f"{a}/adaptive_worst"],
        at_least=15.0,
        method="pap",
        stand_ins={"bare": "the bare base, whose non-adaptive and adaptive attacks are the same attack"},
        text="the non-adaptive attack overstates PAP's robust accuracy by ≥ 15 points against the adaptive worst "
        "case (card §4 and §9: non-adaptive numbers alone overstate robustness)",
    ),
    Claim(
        "pap_robust_gain_nonadaptive",
        _minus("nonadaptive", "bare"),
        at_least=0.5,
        method="pap",
        stand_ins={"bare": _BARE, "init": _INIT, "random": _RANDOM, "cavp": _CAVP},
        asserted=False,
        text="PAP's prompted robust accuracy is ≥ 0.5 points above the bare model's under the non-adaptive attack "
        "(card §6 assertion 1); did not reproduce on digits: PAP is below the bare model on every seed",
    ),
    Claim(
        "pap_robust_gain_nonadaptive_and_adaptive",
        _robust_gain,
        at_least=0.5,
        method="pap",
        stand_ins={"bare": _BARE, "init": _INIT, "random": _RANDOM, "cavp": _CAVP},
        asserted=False,
        text="the same gain under the non-adaptive attack and the adaptive worst case (assertion 1 with the "
        "review's threat model); did not reproduce",
    ),
    Claim(
        "oracle_prompts_robust_10_above_bare",
        lambda r, a: r[f"{a}/oracle"] - r["bare/nonadaptive"],
        at_least=10.0,
        method="pap",
        stand_ins={"init": _INIT, "random": _RANDOM},
        asserted=False,
        text="with the true label's prompts, robust accuracy is ≥ 10 points above the bare model's: the prompts "
        "learned class-conditional robust information (card §6 assertion 3, diagnostic); did not reproduce",
    ),
    Claim(
        "adaptive_lambda_beats_fixed_lambda_natural",
        _minus("natural", "pap-fixed-lambda"),
        at_least=0.5,
        method="pap",
        stand_ins={"pap-fixed-lambda": "PAP with λ kept at 1 (the adaptive amplitude weight off)"},
        asserted=False,
        text="the adaptive λ improves on λ fixed at 1 (card §6 ablation; reported only, as the card asks)",
    ),
)
CHECKS = (
    Check(
        "bare_base_is_robust_above_chance",
        lambda r: r["bare/nonadaptive"],
        at_least=15.0,
        text="the adversarially trained base keeps ≥ 15 % robust accuracy under PGD-10 (chance is 10 %)",
    ),
    Check(
        "adaptive_attack_no_weaker_than_nonadaptive",
        lambda r: r["pap/adaptive_worst"] - r["pap/nonadaptive"],
        at_most=0.0,
        text="the adaptive worst case is at least as strong against PAP as the non-adaptive attack",
    ),
)


class _Experiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``: a seed's two bases and PAP's prompts are trained once and
    shared by the arms that use them."""

    def __init__(self, settings: dict[str, Any], data: tuple[Tensor, ...], r: dict[str, Any]) -> None:
        self.s, self.data, self.r = settings, data, r
        self.seed: int | None = None
        self.cache: dict[str, Any] = {}

    def _get(self, key: str, seed: int, make):
        if seed != self.seed:
            self.seed, self.cache = seed, {}
        if key not in self.cache:
            start = time.perf_counter()
            self.cache[key] = make()
            self.r[f"seconds_train/{key}/seed{seed}"] = time.perf_counter() - start
        return self.cache[key]

    def _base(self, seed: int, adversarial: bool = True) -> nn.Module:
        x, y = self.data[:2]
        epochs = self.s["base_epochs"] if adversarial else self.s["natural_epochs"]
        return self._get(f"base-{'at' if adversarial else 'natural'}", seed,
                         lambda: fit_base(x, y, epochs, adversarial, seed=seed))  # fmt: skip

    def _prompt(self, kind: str, seed: int, base: nn.Module) -> nn.Module:
        x, y = self.data[:2]
        pgd = make_attack(base, "pgd", EPS, ALPHA, 10, 10)

        def make() -> nn.Module:
            torch.manual_seed(seed)
            if kind == "cavp":
                prompt = PixelPrompt(10, tuple(x.shape[1:]))
                fit_prompt(base, prompt, x, y, pgd, self.s["prompt_epochs"], lr=CAVP_LR, lambda_every=None,
                           exemplar_init=False, seed=seed)  # fmt: skip
                return prompt
            prompt = PhaseAmplitudePrompt(10, tuple(x.shape[1:]))
            history = fit_prompt(base, prompt, x, y, pgd, self.s["prompt_epochs"],
                                 lambda_every=None if kind == "pap-fixed-lambda" else 5, seed=seed)  # fmt: skip
            self.r[f"lambda/{kind}/seed{seed}"] = history["lambda"][-1]
            return prompt

        return self._get(kind, seed, make)

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        x, y = self.data[:2]
        x_test, y_test = self.data[2:]
        base = self._base(seed, adversarial=not arm.endswith("natural-base"))
        if arm.startswith("bare"):
            scores = robust_accuracies({"bare": base}, x_test, y_test, eps=EPS, alpha=ALPHA, steps=10)
            robust = scores["robust/pgd/nonadaptive/bare"]  # the bare model attacked through itself: one number
            m = {"natural": scores["natural/bare"], "nonadaptive": robust, "adaptive": robust}
            m |= {"adaptive_worst": robust, "oracle": robust}
            return {k: 100 * v for k, v in m.items()}
        if arm == "init":
            prompt = PhaseAmplitudePrompt(10, tuple(x.shape[1:]))
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))  # fit_prompt's first order
            prompt.init_from_exemplars(x[order], y[order])
        elif arm == "random":
            prompt = PhaseAmplitudePrompt(10, tuple(x.shape[1:]))
            prompt.load_state_dict(self._prompt("pap", seed, base).state_dict())
            matched_norm_random_prompt(prompt, torch.Generator().manual_seed(seed))
        else:
            prompt = self._prompt(arm, seed, base)  # pap-natural-base: PAP's recipe on the natural base
        pipe = PromptedPipeline(base, prompt)
        scores = robust_accuracies({"bare": base, "defended": pipe}, x_test, y_test, eps=EPS, alpha=ALPHA, steps=10)
        x_adv = make_attack(base, "pgd", EPS, ALPHA, 10, 10)(x_test, y_test)
        with torch.no_grad():
            oracle = float((base(prompt(x_adv, y_test)).argmax(1) == y_test).float().mean())
        m = {
            "natural": scores["natural/defended"],
            "nonadaptive": scores["robust/pgd/nonadaptive/defended"],
            "adaptive": scores["robust/pgd/adaptive/defended"],
            "adaptive_worst": scores["robust/pgd/adaptive_worst/defended"],
            "oracle": oracle,
        }
        return {k: 100 * v for k, v in m.items()}


SETTINGS = {
    "full": {"base_epochs": 20, "natural_epochs": 30, "prompt_epochs": 20, "seeds": (0, 1, 2), "arms": ARMS},
    "quick": {"base_epochs": 10, "natural_epochs": 15, "prompt_epochs": 10, "seeds": (0,), "arms": ARMS[:6]},
}


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms over 3 seeds, print the tables and claims, and (with ``out``) write ``pap.json`` and
    ``pap.png``. ``quick`` is the card review's size: seed 0, base and prompts for 10 epochs, without the
    naturally trained base's two report-only arms.

    Returns:
        flat results: ``<arm>/<metric>`` test accuracy in % for the metrics ``natural``, ``nonadaptive``,
        ``adaptive``, ``adaptive_worst`` and ``oracle``, each also per seed (``.../seed<s>``), the final λ, the
        training seconds, and the verdicts ``claims/...``, ``reported/...``, ``checks/...``, ``values/...``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an 8×8 CNN on batches of 128: extra threads only add overhead
    try:
        start = time.perf_counter()
        dm = ImageDataModule()
        dm.setup("fit")
        data = (dm.train_set.x, dm.train_set.y, dm.test_set.x, dm.test_set.y)
        settings = SETTINGS["quick" if quick else "full"]
        seeds, arms = settings["seeds"], list(settings["arms"])
        r: dict[str, Any] = {k: v for k, v in settings.items() if k.endswith("epochs")} | {"num_seeds": len(seeds)}
        run_arms(arms, seeds, _Experiment(settings, data, r), results=r)
        r["seconds"] = time.perf_counter() - start
        table = arm_table(
            r,
            arms,
            list(METRICS),
            f"PAP on digits: test accuracy %, PGD-10 ε = {EPS}, mean ± std of {len(seeds)} seeds",
            fmt="{:.1f}",
        )
        lam = r.get("lambda/pap", float("nan"))
        gain = r["pap/nonadaptive"] - r["bare/nonadaptive"], r["pap/adaptive_worst"] - r["bare/nonadaptive"]
        notes = [
            (
                f"final λ (mean over seeds): PAP {lam:.2f}; robust gain over the bare model, non-adaptive / adaptive "
                f"worst case: PAP {gain[0]:+.1f} / {gain[1]:+.1f} points; total {r['seconds']:.0f} s"
            )
        ]
        if "pap-natural-base/natural" in r:
            nat, bare = "pap-natural-base", "bare-natural-base"
            change = [r[f"{nat}/{m}"] - r[f"{bare}/{m}"] for m in ("natural", "nonadaptive", "adaptive_worst")]
            notes.append(
                f"on the naturally trained base, PAP changes natural accuracy by {change[0]:+.1f} points and "
                f"non-adaptive / adaptive worst-case robust accuracy by {change[1]:+.1f} / {change[2]:+.1f} points"
            )
        return conclude("pap", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[table], notes=notes)
    finally:
        torch.set_num_threads(threads)


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if f"{a}/natural" in r]
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(METRICS)
    for i, metric in enumerate(METRICS):
        ax.bar([j + i * width for j in range(len(arms))], [r[f"{a}/{metric}"] for a in arms], width, label=metric)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(arms))], arms, fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("PAP on digits: natural and PGD-10 robust accuracy (non-adaptive, adaptive, worst case, oracle)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
