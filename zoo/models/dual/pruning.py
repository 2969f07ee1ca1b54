"""DUAL's workflow pieces: the short scoring run as a plain loop, and "record → score → kept indices"."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from zoo.datamodules.checks import check_finite
from zoo.models.dual.module import build_backbone, cosine_schedule
from zoo.models.dual.scores import (
    aum_score,
    beta_select,
    ccs_select,
    check_probabilities,
    dual_score,
    dyn_unc_score,
    el2n_score,
    random_select,
    topk_select,
)

__all__ = ["METHODS", "load_record", "prune_indices", "score_run", "sgd_fit"]

METHODS = ("dual_beta", "dual", "dyn_unc", "el2n", "aum", "ccs", "random")


def sgd_fit(
    x: Tensor,
    y: Tensor,
    epochs: int,
    schedule_epochs: int | None = None,
    batch_size: int = 64,
    lr: float = 0.05,
    backbone: str = "mlp",
    num_classes: int | None = None,
    seed: int = 0,
    record: bool = False,
) -> tuple[nn.Module, Tensor | None]:
    """DUAL's training recipe as a plain loop: SGD (momentum 0.9, Nesterov, wd 5e-4), cosine per iteration built for
    ``schedule_epochs`` (default ``epochs``), shuffled batches, ``epochs`` epochs.

    With ``record``, also returns each sample's softmax ``(epochs, N, C)`` from its own training step (train mode),
    by index: the protocol of ``DualClassifier`` + ``callbacks.TrainingDynamics`` without a Trainer.
    """
    torch.manual_seed(seed)
    classes = num_classes or int(y.max()) + 1
    net = build_backbone(backbone, list(x.shape[1:]), classes)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = cosine_schedule(opt, (schedule_epochs or epochs) * math.ceil(len(x) / batch_size))
    probs = torch.empty(epochs, len(x), classes) if record else None
    g = torch.Generator().manual_seed(seed)
    net.train()
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(x), batch_size):
            rows = order[start : start + batch_size]
            logits = net(x[rows])
            loss = nn.functional.cross_entropy(logits, y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if probs is not None:
                probs[epoch, rows] = logits.detach().softmax(dim=-1)
    return net.eval(), probs


def score_run(
    x: Tensor,
    y: Tensor,
    epochs: int = 30,
    schedule_epochs: int = 200,
    batch_size: int = 64,
    lr: float = 0.05,
    backbone: str = "mlp",
    seed: int = 0,
) -> dict[str, Tensor]:
    """DUAL's scoring run without a Trainer: ``sgd_fit`` with the cosine built for ``schedule_epochs``, stopped after
    ``epochs``, recording every sample's softmax (for DataModules that prune before training starts: a Trainer inside
    another Trainer's setup is not an option).

    Returns:
        ``{"target_probs": (epochs, N), "probs": (epochs, N, C), "labels": (N,)}``.
    """
    _, probs = sgd_fit(x, y, epochs, schedule_epochs, batch_size, lr, backbone, seed=seed, record=True)
    target = probs.gather(-1, y[None, :, None].expand(epochs, -1, 1)).squeeze(-1)
    return {"target_probs": target, "probs": probs, "labels": y.clone()}


def load_record(path: str | Path, n: int) -> dict[str, Tensor]:
    """Read a ``dynamics.npz`` (``callbacks.TrainingDynamics``) or a ``.npy`` of per-sample scores for ``n`` samples."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"No score file at {file}: give the dynamics.npz that callbacks.TrainingDynamics saved "
            "(zoo fit -c conf/dual-score.yaml) or a .npy of one score per training sample"
        )
    if file.suffix == ".npz":
        with np.load(file, allow_pickle=False) as data:
            record = {k: torch.from_numpy(data[k]) for k in data.files}
        if "target_probs" not in record:
            raise ValueError(
                f"{file} holds {sorted(record)} but no 'target_probs': give the dynamics.npz that "
                "callbacks.TrainingDynamics saved"
            )
        length = record["target_probs"].shape[-1]
    else:
        record = {"score": torch.from_numpy(np.load(file, allow_pickle=False)).double().flatten()}
        length = len(record["score"])
    # A NaN score (a sample TrainingDynamics never saw in some epoch, or a broken file) would be ranked arbitrarily.
    for key, values in record.items():
        check_finite(values, f"{file} ({key})" if file.suffix == ".npz" else file)
    if length != n:
        raise ValueError(f"the score file {file} covers {length} samples but the training set has {n}")
    return record


def prune_indices(
    method: str,
    ratio: float,
    record: dict[str, Tensor] | None,
    n: int,
    c_d: float = 4.0,
    seed: int = 0,
    epochs: int = 30,
    hard_cut: float = 0.2,
) -> Tensor:
    """Indices kept when pruning a fraction ``ratio`` of ``n`` samples with ``method`` (one of ``METHODS``).

    ``record`` holds ``target_probs`` (and ``probs``/``labels`` for EL2N, AUM and CCS) or a ready ``score``. DUAL and
    DUAL + β use the first ``epochs`` (T = 30) recorded epochs and refuse a shorter record (a 12-epoch record is a
    different score, not DUAL with T = 12: pass ``epochs=12`` to ask for that); EL2N reads epoch 10, Dyn-Unc and AUM
    all recorded epochs; CCS stratifies over AUM after dropping the ``hard_cut`` lowest margins, as the CCS code does.

    Example:
        >>> rec = score_run(torch.rand(200, 1, 8, 8), torch.randint(0, 10, (200,)), epochs=12)
        >>> prune_indices("dual_beta", 0.5, rec, 200, epochs=12).shape
        torch.Size([100])
    """
    if method not in METHODS:
        raise ValueError(f"unknown pruning method {method!r}; choose one of {METHODS}")
    g = torch.Generator().manual_seed(seed)
    if method == "random":
        return random_select(n, ratio, generator=g)
    if record is None:
        raise ValueError(f"pruning with {method!r} needs the training dynamics or a score file")
    if "score" in record:
        if method in ("dual_beta", "ccs"):
            raise ValueError(f"{method!r} needs the recorded dynamics: give a dynamics.npz, not a score .npy")
        return topk_select(record["score"], ratio)
    tp = record["target_probs"]
    if method in ("dual", "dual_beta"):
        if len(tp) < epochs:
            raise ValueError(
                f"DUAL scores the first T = {epochs} recorded epochs and the record holds {len(tp)}: record longer, "
                "or set the scoring epochs to what was recorded"
            )
        score = dual_score(tp, epochs=epochs, window=min(10, epochs))
        if method == "dual_beta":
            return beta_select(score, tp, ratio, c_d=c_d, epochs=epochs, generator=g)
        return topk_select(score, ratio)
    if method == "dyn_unc":
        return topk_select(dyn_unc_score(tp, window=min(10, len(tp))), ratio)
    if "probs" not in record:
        raise ValueError(f"{method!r} needs the full softmax: record with TrainingDynamics(record_probs=True)")
    probs, labels = record["probs"], record["labels"]
    check_probabilities(probs, "probs")
    if method == "el2n":
        if len(probs) <= 10:
            raise ValueError(f"EL2N reads epoch 10 and the record holds {len(probs)} epochs: record at least 11")
        return topk_select(el2n_score(probs[10], labels), ratio)
    aum = aum_score(probs, labels)
    if method == "aum":
        return topk_select(aum, ratio)
    return ccs_select(aum, ratio, hard_cut=hard_cut, generator=g)
