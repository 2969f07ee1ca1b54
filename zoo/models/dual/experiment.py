"""The grid behind ``zoo reproduce dual``: scoring runs, every selection arm, and subset training batched over arms.

One seed of one label setting (clean, or 20 % symmetric noise flipped with the seed): two scoring runs through the
Trainer with ``callbacks.TrainingDynamics`` (DUAL's 30 recorded epochs of a 200-epoch cosine, and 100 epochs of the
same schedule for the scores the paper computes from full training), every arm's subset at every pruning ratio, and a
fresh MLP trained on each subset for ``SUBSET_EPOCHS`` epochs. The arms of one ratio keep the same number of samples,
so they train side by side as one batched MLP (``train_subsets``): the same initialisation and batch order per seed as
separate runs, in one loop.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zoo.models.dual.data import PrunableImageDataModule
from zoo.models.dual.module import DualClassifier, build_backbone, cosine_schedule
from zoo.models.dual.scores import (
    aum_score,
    balanced_random_select,
    beta_select,
    ccs_select,
    dual_score,
    dyn_unc_score,
    el2n_score,
    entropy_score,
    forgetting_score,
    random_select,
    tdds_score,
    topk_select,
)
from zoo.reporting import run_arms

__all__ = [
    "ABLATIONS",
    "ALTERNATIVES",
    "ARMS",
    "BASELINES",
    "LABELS",
    "RATIOS",
    "SeedData",
    "prepare",
    "record_dynamics",
    "run_setting",
    "select",
    "train_subsets",
]

RATIOS = (0.5, 0.7, 0.8, 0.9)
NOISE = 0.2
SCORE_EPOCHS = 30  # DUAL's T: recorded epochs of the 200-epoch schedule
FULL_EPOCHS = 100  # the "full training" run of the scores the paper computes from all epochs (card §6: 100 here)
SUBSET_EPOCHS = 200  # the paper's CIFAR protocol: a subset trains as many epochs as the full schedule
TDDS_EPOCHS = 90  # TDDS's (T, J) = (90, 10), one of the card's CIFAR settings
#: CCS's hard cut (the fraction of lowest-margin samples dropped before stratifying), tuned as the CCS paper does, by
#: a grid search over 0, 0.1, …, 0.4 per ratio, on held-out seeds 10-13 (never the reported seeds 0-7):
#: ``CCS_HARD_CUT`` is the best cut on the mean of clean and noisy labels (a practitioner who does not know the noise
#: level; also DUAL's repo default), ``CCS_HARD_CUT_BY_SETTING`` the best per label setting (one who does).
#: Measured on those seeds, CCS over the 100-epoch AUM, test accuracy % at cuts 0 / 0.1 / 0.2 / 0.3 / 0.4:
#: clean r 0.5 97.2 95.7 94.9 93.3 91.3, r 0.7 97.5 95.6 94.5 93.0 90.8, r 0.8 96.8 94.9 93.4 91.5 89.3,
#: r 0.9 89.7 92.1 90.1 88.5 87.2; noisy r 0.5 71.9 88.5 96.3 95.6 94.9, r 0.7 43.2 81.5 95.4 94.5 94.2,
#: r 0.8 36.3 72.6 93.5 92.9 92.5, r 0.9 33.1 63.4 88.5 89.5 89.7 (the 30-epoch AUM picks the same cuts).
CCS_HARD_CUT = {0.5: 0.2, 0.7: 0.2, 0.8: 0.2, 0.9: 0.2}
CCS_HARD_CUT_BY_SETTING = {
    "clean": {0.5: 0.0, 0.7: 0.0, 0.8: 0.0, 0.9: 0.1},
    "noisy": {0.5: 0.2, 0.7: 0.2, 0.8: 0.2, 0.9: 0.4},
}

#: the paper's comparisons (Figure 1 and §2.5 of the card), scored as the paper does: from the full run.
BASELINES = ("el2n", "forgetting", "aum", "entropy", "dyn_unc", "tdds", "ccs", "ccs_tuned", "ccs_30")
#: DUAL + β with one part changed: the Beta sampling off, the uncertainty term off, another score or none inside.
ABLATIONS = ("dual", "dual_beta_no_unc", "el2n_beta", "beta_random")
#: what a practitioner tries first: no score (random, class-balanced), or the plainest use of one (easiest first).
ALTERNATIVES = ("random", "balanced", "easy")
ARMS = (*ALTERNATIVES, *BASELINES, *ABLATIONS, "dual_beta")
LABELS = {
    "random": "Random",
    "balanced": "Random, class-balanced",
    "easy": "Easiest first (top mean p)",
    "el2n": "EL2N top-k (epoch 10)",
    "forgetting": "Forgetting top-k",
    "aum": "AUM top-k",
    "entropy": "Entropy top-k",
    "dyn_unc": "Dyn-Unc top-k",
    "tdds": "TDDS top-k",
    "ccs": "CCS over AUM",
    "ccs_tuned": "CCS, cut tuned per label setting",
    "ccs_30": "CCS over AUM, 30 epochs",
    "dual": "DUAL top-k (β off)",
    "dual_beta_no_unc": "DUAL + β without σ",
    "el2n_beta": "β over EL2N",
    "beta_random": "β over a random score",
    "dual_beta": "DUAL + β",
}


def record_dynamics(dm: PrunableImageDataModule, epochs: int, seed: int) -> tuple[dict[str, Tensor], int, float]:
    """Fit a ``DualClassifier`` with ``TrainingDynamics(epochs)`` on ``dm``; returns (record, epochs run, seconds)."""
    from lightning import Trainer, seed_everything

    from zoo.callbacks.training_dynamics import TrainingDynamics

    seed_everything(seed, verbose=False)
    callback = TrainingDynamics(epochs=epochs, record_probs=True, save_dir=tempfile.mkdtemp())
    trainer = Trainer(
        max_epochs=200,  # the schedule's length; the callback stops the run after `epochs`
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    start = time.perf_counter()
    trainer.fit(DualClassifier(schedule_epochs=200), dm)
    return callback.record(), callback.recorded_epochs, time.perf_counter() - start


def train_subsets(
    x: Tensor,
    y: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    epochs: int,
    batch_size: int,
    seed: int,
    lr: float = 0.05,
    logits: bool = False,
) -> Tensor:
    """Train one fresh MLP 64-256-128-10 per subset, all at once, and return each one's test accuracy ``(A,)`` (with
    ``logits``: the test logits ``(A, N_test, 10)``).

    ``x`` ``(A, k, ...)`` and ``y`` ``(A, k)`` hold A subsets of the same size. Every model starts from the
    initialisation ``build_backbone`` draws under ``torch.manual_seed(seed)`` and sees its subset's positions in the
    same shuffled order, with the recipe of ``pruning.sgd_fit`` (SGD, momentum 0.9, Nesterov, wd 5e-4, cosine per
    iteration over ``epochs``): the loss is the sum of the A per-subset mean losses, so each model's gradient is its
    own, and SGD acts elementwise, so this is A separate ``sgd_fit`` runs in one loop (the test logits agree to 1e-4).
    """
    subsets, k = y.shape
    torch.manual_seed(seed)
    template = build_backbone("mlp", list(x.shape[2:]), 10)
    layers = [m for m in template if isinstance(m, nn.Linear)]
    weights = [nn.Parameter(m.weight.detach().t().expand(subsets, -1, -1).clone()) for m in layers]  # (A, in, out)
    biases = [nn.Parameter(m.bias.detach().expand(subsets, 1, -1).clone()) for m in layers]  # (A, 1, out)
    params = [p for pair in zip(weights, biases) for p in pair]  # the order of the template's parameters
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = cosine_schedule(opt, epochs * math.ceil(k / batch_size))

    def forward(h: Tensor) -> Tensor:
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = torch.baddbmm(b, h, w)
            if i < len(weights) - 1:
                h = h.relu()
        return h

    flat = x.flatten(2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(k, generator=g)
        for start in range(0, k, batch_size):
            rows = order[start : start + batch_size]
            out = forward(flat[:, rows])
            loss = nn.functional.cross_entropy(out.flatten(0, 1), y[:, rows].flatten(), reduction="none")
            opt.zero_grad(set_to_none=True)
            loss.view(subsets, -1).mean(dim=1).sum().backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        test = forward(x_test.flatten(1).expand(subsets, -1, -1))
    return test if logits else (test.argmax(dim=-1) == y_test).double().mean(dim=1)


def dual_score_without_uncertainty(target_probs: Tensor, epochs: int = SCORE_EPOCHS, window: int = 10) -> Tensor:
    """DUAL with its uncertainty term σ_k removed: the mean over the windows of 10·(1 − μ_k), difficulty only."""
    w = target_probs[:epochs].double().unfold(0, window, 1)
    return (10 * (1 - w.mean(dim=-1))).mean(dim=0)


@dataclass
class SeedData:
    """One seed of one label setting: the data, the records' summaries and every score (higher = harder)."""

    dm: PrunableImageDataModule
    scores: dict[str, Tensor]
    target_probs: Tensor  # (30, N): the DUAL record, for the Beta sampling's m(n)
    full_target_probs: Tensor  # (100, N): the full run's record (the diagnosis scores DUAL from other T with it)
    info: dict[str, float]
    label_noise: float = 0.0


def prepare(noise: float, seed: int) -> SeedData:
    """The data (labels flipped with ``seed``), both scoring runs, and every score the arms use."""
    dm = PrunableImageDataModule(label_noise=noise, noise_seed=seed, batch_size=64)
    dm.setup("fit")
    y = dm.train_set.y
    short, epochs_short, seconds_short = record_dynamics(dm, SCORE_EPOCHS, seed)
    full, epochs_full, seconds_full = record_dynamics(dm, FULL_EPOCHS, seed)
    tp = short["target_probs"]
    scores = {
        "dual": dual_score(tp, epochs=SCORE_EPOCHS, window=10),
        "dual_no_unc": dual_score_without_uncertainty(tp),
        "el2n": el2n_score(short["probs"][10], y),  # the card's epoch 10 of 30 (the official code: 20 of 200)
        "aum_30": aum_score(short["probs"], y),
        "forgetting": forgetting_score(full["probs"], y),
        "aum": aum_score(full["probs"], y),
        "entropy": entropy_score(full["probs"][-1]),
        "dyn_unc": dyn_unc_score(full["target_probs"], window=10),
        "tdds": tdds_score(full["probs"], epochs=TDDS_EPOCHS, window=10),
        "easy": tp.double().mean(dim=0),  # top-k of the mean target probability keeps the easiest
    }
    info = {
        "epochs_recorded_dual": epochs_short,
        "epochs_recorded_full": epochs_full,
        "seconds_score_dual": seconds_short,
        "seconds_score_full": seconds_full,
    }
    return SeedData(dm, scores, tp, full["target_probs"], info, noise)


def select(arm: str, data: SeedData, ratio: float, seed: int) -> Tensor:
    """The indices ``arm`` keeps at pruning ratio ``ratio``; each stochastic arm draws from a generator seeded by
    ``seed``, so an arm's subset depends only on its seed, setting and ratio."""
    s, tp, n = data.scores, data.target_probs, len(data.target_probs[0])
    g = torch.Generator().manual_seed(seed)
    if arm == "random":
        return random_select(n, ratio, generator=g)
    if arm == "balanced":
        return balanced_random_select(data.dm.train_set.y, ratio, generator=g)
    if arm == "dual_beta":
        return beta_select(s["dual"], tp, ratio, c_d=4.0, generator=g)
    if arm == "dual_beta_no_unc":
        return beta_select(s["dual_no_unc"], tp, ratio, c_d=4.0, generator=g)
    if arm == "el2n_beta":
        return beta_select(s["el2n"], tp, ratio, c_d=4.0, generator=g)
    if arm == "beta_random":
        # A uniform random score in DUAL's place (anchor and weights): the Beta density over m(n) alone.
        return beta_select(torch.rand(n, generator=g, dtype=torch.float64), tp, ratio, c_d=4.0, generator=g)
    if arm in ("ccs", "ccs_30", "ccs_tuned"):
        aum = s["aum_30" if arm == "ccs_30" else "aum"]
        cuts = CCS_HARD_CUT_BY_SETTING["noisy" if data.label_noise else "clean"] if arm == "ccs_tuned" else CCS_HARD_CUT
        if ratio not in cuts:
            raise ValueError(f"no tuned CCS hard cut for r = {ratio}; the grid's ratios are {sorted(cuts)}")
        return ccs_select(aum, ratio, hard_cut=cuts[ratio], cut_by=aum, generator=g)
    if arm not in s:
        raise ValueError(f"unknown arm {arm!r}; choose one of {ARMS}")
    return topk_select(s[arm], ratio)


def run_setting(
    tag: str,
    noise: float,
    seeds: Sequence[int],
    r: dict[str, Any],
    arms: Sequence[str] = ARMS,
    ratios: Sequence[float] = RATIOS,
    epochs: int = SUBSET_EPOCHS,
    log: Any = print,
) -> None:
    """Every arm × ratio of one label setting, seed by seed; writes into ``r`` (per seed and the means):

    ``<tag>/<arm>/r<ratio>`` test accuracy (%), ``.../min_class`` the smallest class among the kept (given labels),
    with noise ``.../noisy_kept_pct`` (% of the kept samples that are mislabelled); ``<tag>/scoring/<info>`` the
    scoring runs' epochs and seconds.
    """
    cache: dict[int, dict[str, dict[str, float]]] = {}

    def cell(arm: str, seed: int) -> Mapping[str, float]:
        if seed not in cache:
            cache.clear()  # seed-major: one seed's data at a time
            start = time.perf_counter()
            data = prepare(noise, seed)
            for key, value in data.info.items():
                r[f"{tag}/scoring/{key}/seed{seed}"] = value
            x, y, noisy = data.dm.train_set.x, data.dm.train_set.y, data.dm.noisy
            out: dict[str, dict[str, float]] = {a: {} for a in arms}
            for ratio in ratios:
                keep = torch.stack([select(a, data, ratio, seed) for a in arms])  # (A, k)
                # The card's §6 batch of 64, halved at r = 0.9 as the official runs do (they halve 128 at r = 0.8 too).
                batch = 32 if ratio >= 0.9 else 64
                acc = train_subsets(x[keep], y[keep], data.dm.test_set.x, data.dm.test_set.y, epochs, batch, seed)
                for i, a in enumerate(arms):
                    out[a][f"r{ratio}"] = 100 * float(acc[i])
                    out[a][f"r{ratio}/min_class"] = float(torch.bincount(y[keep[i]], minlength=10).min())
                    if noise:
                        out[a][f"r{ratio}/noisy_kept_pct"] = 100 * float(noisy[keep[i]].double().mean())
            share = (time.perf_counter() - start) / len(arms)  # the arms train together: each gets an equal share
            cache[seed] = {a: {**m, "seconds": share} for a, m in out.items()}
        return cache[seed][arm]

    run_arms(arms, seeds, cell, prefix=f"{tag}/", results=r, log=log)
    for key in ("epochs_recorded_dual", "epochs_recorded_full", "seconds_score_dual", "seconds_score_full"):
        r[f"{tag}/scoring/{key}"] = sum(r[f"{tag}/scoring/{key}/seed{s}"] for s in seeds) / len(seeds)
