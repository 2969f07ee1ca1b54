"""``zoo reproduce reward-refine``: RERD against SVDD, best-of-N and the GA ablation at matched reward-call budgets.

The card's §5 experiment on the pretrained denoiser ``reward-refine`` (the hub entry: 2-layer, 64-wide masked
diffusion transformer trained 3,000 steps on the synthetic second-order DNA chain, L = 32), with the motif reward
``act_A − 2·max(0, act_B − 1) − 0.5·|GC − 0.5|`` (constraint ``act_B ≤ 1``). Per seed (the seed of every sampler's
random stream), populations of R = 64 (quick: 32):

* **rerd**: an SVDD pass with M = 4, then S = 10 (quick: 5) rounds of resampling by exp(r/α), re-masking E = 8
  uniformly random positions (K/T = 0.25) and guided re-unmasking with M = 4: ``32·4 + S·(1 + 8·4)`` = 458 reward
  calls per sequence (quick: 293), the card's 448 plus the S scorings for resampling (review). α = 0.2, the
  official exp(5r): the review feared it would keep one ancestor per round on whole motif counts, but much of a
  population shares the top reward, and the effective sample size averaged 15 of 64 over the rounds (single rounds
  dip near 1 when one design leads alone), while the review's α = 1.5 (**rerd-alpha1.5**) barely selects (ESS 56
  of 64) and is reported beside it;
* **svdd**: single-shot SVDD with M = ⌊budget / L⌋ = 14 (quick: 9) candidates, 448 (288) calls;
* **best-of-n**: the best of N = budget unguided samples per output (16 outputs in the full run, 8 in the quick
  one: N·L forwards per output is the run's largest cost, and the mean over 16 is precise enough);
* **ga**: the GA ablation, RERD with unguided re-unmasking (M = 1: selection only), as many rounds as the budget
  pays for (330; quick 165), and **ga-rounds** at RERD's number of rounds (the card's "same number of rounds");
* **refine-no-reward**: the refinement loop with the reward switched off (unguided start and re-unmasking, no
  resampling, S rounds): the pretrained model's own Markov chain;
* **unguided**, **random** (uniform letters) and **data** (held-out chain samples): references.

Metrics: ``reward`` (mean), ``reward_top10``, ``constraint`` (share with act_B ≤ 1), ``naturalness`` (mean
log p(x)/L under the true chain), ``pll`` (pseudo-log-likelihood per letter under the denoiser), ``diversity`` (mean
pairwise Hamming / L), ``calls`` and ``forwards`` per sequence, ``seqs_per_s`` and ``calls_per_s``; for the
refinement arms the mean reward after every round (``round<s>``), ``rises`` (the share of rounds whose mean is not
below the previous round's, on the seed-mean curve) and ``ess``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zoo.claims import Check, Claim
from zoo.datamodules.dna import MarkovDNA
from zoo.models.reward_refine import samplers
from zoo.models.reward_refine.metrics import population_metrics, pseudo_log_likelihood
from zoo.models.reward_refine.rewards import MotifReward
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["CHECKS", "CLAIMS", "SETTINGS", "run"]

POSITIONS, CANDIDATES, ALPHA = 8, 4, 0.2
SETTINGS = {
    "full": {"seeds": (0, 1, 2), "n": 64, "rounds": 10, "bon_n": 16},
    "quick": {"seeds": (0,), "n": 64, "rounds": 10, "bon_n": 8},
}
ARMS = ("rerd", "svdd", "best-of-n", "ga", "ga-rounds", "refine-no-reward", "rerd-alpha1.5", "unguided", "random",
        "data")  # fmt: skip
REFINING = ("rerd", "ga", "ga-rounds", "refine-no-reward", "rerd-alpha1.5")


def budget(settings: Mapping[str, Any], length: int = 32) -> int:
    """RERD's reward calls per sequence, the budget every arm is matched on."""
    return samplers.refine_budget(length, CANDIDATES, settings["rounds"], POSITIONS, CANDIDATES)


class _Experiment:
    """``arm(name, seed) -> metrics`` with the hub's pretrained denoiser."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        import zoo

        self.s = settings
        self.model = zoo.load("reward-refine")
        self.net = self.model.net.eval()
        self.length = self.net.length
        self.chain = MarkovDNA(self.length, seed=self.model.hparams.chain_seed)
        self.reward = MotifReward()
        self.budget = budget(settings, self.length)

    def _design(self, arm: str, g: torch.Generator) -> samplers.Design:
        s, n, net, reward = self.s, self.s["n"], self.net, self.reward
        common = {"positions": POSITIONS, "init_candidates": CANDIDATES, "alpha": ALPHA, "generator": g}
        if arm == "rerd":
            return samplers.refine(net, reward, n, s["rounds"], candidates=CANDIDATES, **common)
        if arm == "rerd-alpha1.5":
            return samplers.refine(net, reward, n, s["rounds"], candidates=CANDIDATES, **{**common, "alpha": 1.5})
        if arm == "ga":
            rounds = samplers.rounds_for_budget(self.budget, self.length, CANDIDATES, POSITIONS, 1)
            return samplers.refine(net, reward, n, rounds, candidates=1, **common)
        if arm == "ga-rounds":
            return samplers.refine(net, reward, n, s["rounds"], candidates=1, **common)
        if arm == "refine-no-reward":
            return samplers.refine(net, reward, n, s["rounds"], candidates=1, scheme=None,
                                   **{**common, "init_candidates": 1})  # fmt: skip
        if arm == "svdd":
            return samplers.svdd(net, reward, n, self.budget // self.length, generator=g)
        if arm == "best-of-n":
            return samplers.best_of_n(net, reward, s["bon_n"], self.budget, generator=g)
        if arm == "unguided":
            return samplers.unguided(net, n, reward, generator=g)
        x = torch.randint(4, (n, self.length), generator=g) if arm == "random" else self.chain.sample(n, generator=g)
        return samplers.Design(x, reward(x), 0.0, 0.0)

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        d = self._design(arm, torch.Generator().manual_seed(1000 * seed + ARMS.index(arm)))
        x = d.sequences
        out = population_metrics(x, d.rewards, self.reward.satisfied(x), self.chain.log_prob)
        out["pll"] = float(pseudo_log_likelihood(self.net, x, self.net.mask_id).mean())
        out |= {"calls": d.reward_calls, "forwards": d.denoiser_calls}
        if d.seconds:
            out |= {"seqs_per_s": len(x) / d.seconds, "calls_per_s": len(x) * d.reward_calls / d.seconds}
        if arm in REFINING:
            out |= {f"round{i}": v for i, v in enumerate(d.trajectory[: self.s["rounds"] + 1])}
            out["rounds"] = len(d.trajectory) - 1
            out["rises"] = _rises(d.trajectory)  # the GA's whole 330-round curve; the others have S rounds
            out["refine_gain"] = d.trajectory[-1] - d.trajectory[0]
            if d.ess:
                out["ess"] = sum(d.ess) / len(d.ess)
        return out


def _rises(curve: list[float]) -> float:
    """The share of rounds whose mean reward is not below the previous round's.

    Example:
        >>> _rises([0.0, 1.0, 0.5, 2.0, 2.0])
        0.75
    """
    steps = list(zip(curve, curve[1:]))
    return sum(b >= a for a, b in steps) / len(steps) if steps else 0.0


def _curve_rises(r: dict[str, Any], rounds: int) -> None:
    """``<arm>/rises`` on the seed-mean curve (review: not the mean of per-seed shares)."""
    for arm in REFINING:
        if f"{arm}/round0" in r and r[f"{arm}/rounds"] == rounds:
            r[f"{arm}/rises"] = _rises([r[f"{arm}/round{i}"] for i in range(rounds + 1)])


_SVDD = "single-shot SVDD with as many candidates as the budget pays for (M = 14, 448 reward calls)"
_BON = "best-of-N unguided samples at the same budget (N = 458)"
_GA = "GA: refinement with the reward switched off in the denoising (unguided re-unmasking, 330 rounds at the budget)"
_NOREWARD = "the refinement loop with the reward switched off entirely (unguided, no resampling)"

# Calibration (``python -c "from zoo.models.reward_refine.reproduce import run; run(out='/tmp/rr-full')"``, seeds 0, 1,
# 2, 177 s): per seed 0 / 1 / 2, method | stand-ins.
#
#   rerd_gain_over_unguided_at_least_0.7   rerd 1.18 / 1.03 / 0.95 | svdd 0.40 / 0.42 / 0.46, refine-no-reward
#       0.00 / −0.05 / 0.03. The GA ablation at the same budget reached 0.80 / 0.69 / 0.93 and best-of-N 1.08 / 1.05 /
#       1.01, so neither can be a stand-in of this bound; they have their own reported claims.
#   rerd_rounds_raise_reward_by_0.5        rerd 0.97 / 0.75 / 0.72 (round 10 − round 0) | refine-no-reward −0.04 /
#       0.01 / −0.03. (ga-rounds, unguided re-unmasking at the same 10 rounds: 0.51 / 0.24 / 0.34; not a stand-in.)
#   rerd_naturalness_above_uniform         rerd −1.08 / −1.19 / −1.16 | random −2.40 / −2.37 / −2.44
#   reported: rerd_beats_ga_by_0.1         +0.38 / +0.33 / +0.02 (2 of 3 seeds)
#   reported: rerd_beats_best_of_n         +0.10 / −0.03 / −0.06: did not reproduce (best-of-N ties RERD)
#   reported: rerd_reward_rises_in_80pct   0.7 on the seed-mean curve: RERD's mean reward plateaus at ≈ 1.0 after
#       3 rounds and then moves with resampling noise
# Checks: constraint satisfaction ≥ SVDD's (both 1.00), unguided naturalness within 0.2 of the data's (−0.13).
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "rerd_gain_over_unguided_at_least_0.7",
        lambda r, a: r[f"{a}/reward"] - r["unguided/reward"],
        at_least=0.7,
        method="rerd",
        stand_ins={"svdd": _SVDD, "refine-no-reward": _NOREWARD},
        text="RERD beats single-shot SVDD at a matched reward-call budget (card §5 (1), on r − r_unguided as the "
        "review asks: the toy reward is near 0 for unguided samples)",
    ),
    Claim(
        "rerd_rounds_raise_reward_by_0.5",
        lambda r, a: r[f"{a}/refine_gain"],
        at_least=0.5,
        method="rerd",
        stand_ins={"refine-no-reward": _NOREWARD},
        text="the refinement rounds improve on their own starting population (the paper's point: single-shot "
        "errors are corrected by iterating)",
    ),
    Claim(
        "rerd_naturalness_above_uniform",
        lambda r, a: r[f"{a}/naturalness"],
        at_least=-math.log(4),
        method="rerd",
        stand_ins={"random": "uniformly random sequences"},
        text="designs stay more natural than uniformly random DNA under the true chain (card §5 (5))",
    ),
    Claim(
        "rerd_beats_ga_by_0.1",
        lambda r, a: r[f"{a}/reward"] - r["ga/reward"],
        at_least=0.1,
        method="rerd",
        stand_ins={"ga-rounds": "GA at RERD's number of rounds (the card's 'same number of rounds')"},
        asserted=False,
        text="guided re-unmasking matters: RERD beats the GA ablation at the same budget (card §5 (2); held on 2 of "
        "3 seeds: reported)",
    ),
    Claim(
        "rerd_beats_best_of_n",
        lambda r, a: r[f"{a}/reward"] - r["best-of-n/reward"],
        at_least=0.0,
        method="rerd",
        stand_ins={"svdd": _SVDD},
        asserted=False,
        text="RERD beats best-of-N at the same budget (did not reproduce: best-of-N ties RERD on this sparse reward)",
    ),
    Claim(
        "rerd_reward_rises_in_80pct_of_rounds",
        lambda r, a: r[f"{a}/rises"],
        at_least=0.8,
        method="rerd",
        stand_ins={"refine-no-reward": _NOREWARD},
        asserted=False,
        text="the population's mean reward is non-decreasing in ≥ 80 % of rounds (card §5 (3), seed-mean curve; did "
        "not hold: 0.7, a plateau after 3 rounds)",
    ),
)
CHECKS: tuple[Check, ...] = (
    Check("rerd_constraint_at_least_svdd", lambda r: r["rerd/constraint"] - r["svdd/constraint"], at_least=0.0,
          text="card §5 (4): RERD's constraint-satisfaction rate ≥ SVDD's"),  # fmt: skip
    Check("unguided_naturalness_within_0.2_of_data", lambda r: r["unguided/naturalness"] - r["data/naturalness"],
          at_least=-0.2, text="the pretrained model's samples are nearly as natural as the data (card §5 sanity: "
          "the review expected the card's 0.05 to be too tight; measured 0.13)"),  # fmt: skip
)


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rounds = int(max(k.split("/round")[1] for k in r if "/round" in k and "/seed" not in k and k.split("/round")[1].isdigit()))
    for arm, style in (("rerd", "o-"), ("rerd-alpha1.5", "s--"), ("ga-rounds", "^-"), ("refine-no-reward", "x-")):
        if f"{arm}/round0" in r:
            axes[0].plot(range(rounds + 1), [r[f"{arm}/round{i}"] for i in range(rounds + 1)], style, label=arm)
    for arm, color in (("svdd", "C4"), ("best-of-n", "C5"), ("ga", "C6"), ("unguided", "grey")):
        axes[0].axhline(r[f"{arm}/reward"], color=color, ls=":", label=f"{arm} (final)")
    axes[0].set(xlabel="refinement round", ylabel="population mean reward", title="reward over rounds")
    axes[0].legend(fontsize=8)
    for arm in ARMS:
        axes[1].plot(r[f"{arm}/naturalness"], r[f"{arm}/reward"], "o", label=arm)
    axes[1].axvline(-math.log(4), color="grey", ls=":", label="uniform letters")
    axes[1].set(xlabel="naturalness: log p(x)/L under the true chain", ylabel="mean reward", title="reward vs naturalness")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool = False, out: Path | str | None = None, console: Any = "default") -> dict[str, Any]:
    """Run every arm over the seeds, evaluate the claims, print the tables; returns the flat results."""
    settings = SETTINGS["quick" if quick else "full"]
    torch.set_num_threads(min(2, torch.get_num_threads()))
    r = run_arms(ARMS, settings["seeds"], _Experiment(settings), log=None if console is None else print)
    _curve_rises(r, settings["rounds"])
    metrics = ["reward", "reward_top10", "constraint", "naturalness", "pll", "diversity", "calls", "forwards", "rises",
               "ess", "seqs_per_s", "calls_per_s"]  # fmt: skip
    title = f"reward-refine: populations of {settings['n']}, {budget(settings)} reward calls per sequence"
    table = arm_table(r, ARMS, metrics, title)
    return conclude("reward-refine", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[table], console=console)
