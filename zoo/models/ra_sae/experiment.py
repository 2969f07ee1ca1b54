"""The arms of ``zoo reproduce ra-sae`` and the plain training loop that runs them (no Trainer per cell).

Every arm is a sparse autoencoder with the same encoder budget (64 atoms, 3 codes per sample where the encoder caps
them, 3,000 Adam steps at lr 1e-3, grad-norm clip 1.0, MSE, batch 256, the official ``train_sae`` loop) on the
same data; they differ in their dictionary:

* the method, RA-SAE (δ = 1, C = 64 k-means centroids of the run's own subset, equal-norm start);
* baselines, the paper's SAEs: TopK (random init), BatchTopK, JumpReLU and ReLU + L1, each with a free unit-norm
  dictionary; the two penalised ones tuned to about 3 active codes per sample on held-out seeds;
* ablations, RA-SAE with a part removed: the archetypal mixing frozen (a decoder frozen at the normalised k-means
  centroids, only the encoder trains), W alone frozen at the identity (Λ, m and the encoder train), δ = 0 (A-SAE),
  the constraint removed but the start kept (a TopK SAE started at the normalised centroids, the critique's control),
  and nothing trained (the RA-SAE at initialisation);
* alternatives, the classical dictionaries a practitioner computes first, frozen, with the same trained TopK
  encoder: NMF components and PCA directions (± each of the top 32); k-means is the frozen-centroids ablation.

``ra-raw`` is RA-SAE with overcomplete's dictionary start (C as given, m = 0; the encoder still tied): the row that
shows what the equal-norm start changed (``zoo.models.ra_sae.sae.equal_norm_candidates``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.metrics.dictionary_stability import dictionary_stability
from zoo.models.ra_sae.sae import SparseAutoencoder, sae_loss
from zoo.nn.kmeans import kmeans_centroids

__all__ = ["ABLATIONS", "ALTERNATIVES", "ARMS", "BASELINES", "Arm", "evaluate", "frozen_dictionary", "train_arm"]


@dataclass(frozen=True)
class Arm:
    """One arm: its label and how its SAE is built and trained."""

    label: str
    dictionary: str = "free"  # "ra", "a" or "free"
    encoder: str = "topk"
    free_init: bool = False  # a free dictionary started at the normalised k-means centroids
    frozen: str | None = None  # a free dictionary frozen at "kmeans", "nmf" or "pca" atoms
    train: bool = True
    freeze_w: bool = False
    candidate_scale: str = "equal"


# The penalised baselines' sparsity weights, tuned on held-out runs 10 and 11 (k* = 256, 3,000 steps) towards the
# TopK budget of 3 active codes per sample; their measured L0 is in the run's table. ReLU + L1 (no decoder bias, as
# the official SAEs): L1 0.03 / 0.05 / 0.1 / 0.15 gave raw L0 18 / - / 6.8 / 2.5 at R² 0.60 / - / -0.09 / -0.65,
# centred L0 6.4 / 4.5 / 1.6 at R² 0.59 / 0.43 / 0.17: the shrinkage costs R² before L0 reaches 3. JumpReLU: L0
# 0.003 / 0.01 / 0.03 / 0.1 / 0.3 gave raw L0 12 / 7.2 / 6.0 / 6.3 / 6.3 (θ stops moving), centred 8.6 / 3.9 / 3.0.
L1_PENALTY = {"raw": 0.1, "centred": 0.05}
L0_PENALTY = {"raw": 0.1, "centred": 0.03}

ARMS: dict[str, Arm] = {
    "ra": Arm("RA-SAE (δ = 1)", dictionary="ra"),
    "topk": Arm("TopK, random init"),
    "batchtopk": Arm("BatchTopK", encoder="batchtopk"),
    "jumprelu": Arm("JumpReLU (L0 penalty)", encoder="jumprelu"),
    "relu": Arm("ReLU + L1", encoder="relu"),
    "kmeans-frozen": Arm("decoder frozen at k-means centroids", frozen="kmeans"),
    "ra-frozen-w": Arm("RA-SAE, W frozen at the identity", dictionary="ra", freeze_w=True),
    "a": Arm("A-SAE (δ = 0)", dictionary="a"),
    "topk-kmeans": Arm("TopK started at k-means centroids (control)", free_init=True),
    "ra-init": Arm("RA-SAE at initialisation (untrained)", dictionary="ra", train=False),
    "nmf-frozen": Arm("decoder frozen at NMF components (of the data's positive part)", frozen="nmf"),
    "pca-frozen": Arm("decoder frozen at ± PCA directions", frozen="pca"),
    "ra-raw": Arm(
        "RA-SAE, raw centroids and m = 0 (overcomplete's; encoder tied)", dictionary="ra", candidate_scale="raw"
    ),
}
BASELINES = ("topk", "batchtopk", "jumprelu", "relu")
PREPS = ("raw", "centred")  # the grid's two preprocessings of the same activations
IDENTIFIABILITY_HEURISTICS = {
    "points": "random training points as atoms (non-learned), codes the top projections",
    "channels": "single input coordinates as the atoms (non-learned)",
}
ABLATIONS = ("kmeans-frozen", "ra-frozen-w", "a", "topk-kmeans", "ra-init")
ALTERNATIVES = ("nmf-frozen", "pca-frozen")


def frozen_dictionary(x: Tensor, kind: str, num_atoms: int, seed: int) -> Tensor:
    """Unit-norm atoms ``(num_atoms, d)`` of a classical dictionary of ``x``: ``"kmeans"`` centroids, ``"nmf"``
    components (scikit-learn's NMF of the positive part of ``x``) or ``"pca"`` (± each of the top ``num_atoms // 2``
    principal directions, of the data as given: the free SAEs have no bias to centre with; past 2d atoms they repeat)."""
    if kind == "kmeans":
        atoms = kmeans_centroids(x, num_atoms, seed=seed)
    elif kind == "nmf":
        from sklearn.decomposition import NMF

        init = "nndsvda" if num_atoms <= min(x.shape) else "random"  # NNDSVD needs k <= min(n, d)
        nmf = NMF(num_atoms, init=init, max_iter=300, random_state=seed)
        nmf.fit(x.clamp(min=0).double().numpy())
        atoms = torch.from_numpy(np.asarray(nmf.components_, dtype=np.float32))
    elif kind == "pca":
        # Uncentred: SVD of x itself, so a raw cone's axis is the first direction, as for an SAE without bias.
        _, _, vh = torch.linalg.svd(x.double(), full_matrices=False)
        signed = torch.cat([vh[: (num_atoms + 1) // 2], -vh[: (num_atoms + 1) // 2]]).float()
        atoms = signed.repeat(-(-num_atoms // len(signed)), 1)[:num_atoms]  # past 2d atoms the directions repeat
    else:
        raise ValueError(f"Expected a frozen dictionary 'kmeans', 'nmf' or 'pca', got {kind!r}.")
    return torch.nn.functional.normalize(atoms, dim=1)


def train_arm(
    x: Tensor,
    arm: str,
    seed: int,
    steps: int,
    num_atoms: int = 64,
    top_k: int = 3,
    delta: float = 1.0,
    batch_size: int = 256,
    lr: float = 1e-3,
    l1_penalty: float = L1_PENALTY["centred"],
    l0_penalty: float = L0_PENALTY["centred"],
) -> tuple[SparseAutoencoder, Tensor, float]:
    """Train one arm on ``x`` ``(n, d)`` with the official loop (Adam, grad-norm clip 1.0, MSE + the encoder's own
    sparsity penalty).

    ``"ra-init"`` ignores ``steps`` and returns the RA-SAE as initialised (W = I, so D ∝ C); ``"ra-frozen-w"``
    leaves W out of the optimiser; the frozen arms leave their atoms out.

    Returns ``(sae, initial_dictionary, first_batch_r2)`` (``first_batch_r2`` is NaN when nothing was trained).
    """
    spec = ARMS[arm]
    torch.manual_seed(seed)
    sae = SparseAutoencoder(
        x.shape[1],
        num_atoms,
        top_k,
        spec.dictionary,  # type: ignore[arg-type]
        delta=delta,
        num_candidates=num_atoms,
        encoder=spec.encoder,  # type: ignore[arg-type]
        l0_penalty=l0_penalty,
        l1_penalty=l1_penalty,
        candidate_scale=spec.candidate_scale,  # type: ignore[arg-type]
    )
    if spec.frozen is not None:
        sae.set_candidates(frozen_dictionary(x, spec.frozen, num_atoms, seed), free_init=True)
        sae.dictionary.V.requires_grad_(False)
    elif spec.dictionary != "free" or spec.free_init:
        sae.set_candidates(kmeans_centroids(x, num_atoms, seed=seed), free_init=spec.free_init)
    D0 = sae.dictionary.get_dictionary().detach().clone()
    if spec.freeze_w:
        sae.dictionary.W.requires_grad_(False)
    steps = steps if spec.train else 0
    params = [p for p in sae.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    per_epoch = len(x) // batch_size
    first_r2 = float("nan")
    for step in range(steps):
        if step and step % per_epoch == 0:
            order = torch.randperm(len(x), generator=g)
        batch = x[order[(step % per_epoch) * batch_size : (step % per_epoch + 1) * batch_size]]
        pre, codes, x_hat = sae(batch)
        mse = sae_loss(batch, x_hat, pre, codes, None)
        if step == 0:
            first_r2 = float(1 - mse.detach() / (batch - batch.mean()).square().mean())
        loss = mse + sae.sparsity_loss(pre)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    sae.dictionary.project_()
    return sae.eval(), D0, first_r2


@torch.no_grad()
def evaluate(sae: SparseAutoencoder, x: Tensor) -> dict[str, Any]:
    """Test R² (the official scalar-mean form), the atoms that fire, the codes and L0 of ``sae`` on ``x``."""
    _, codes, x_hat = sae(x)
    return {
        "r2": r2_score(x, x_hat),
        "alive": (codes > 0).any(0),
        "codes": codes,
        "l0": float((codes > 0).sum(1).float().mean()),
    }


def r2_score(x: Tensor, x_hat: Tensor) -> float:
    """The official ``r2_score``: ``1 − mean((x − x̂)²) / (mean((x − x̄)²) + 1e-6)``, x̄ the scalar mean of all entries."""
    return float(1 - (x - x_hat).square().mean() / ((x - x.mean()).square().mean() + 1e-6))


def w_off_identity(sae: SparseAutoencoder) -> float | None:
    """Share of each atom's mixing weight that left its own candidate, 1 − mean_i W_ii (W rows sum to 1).

    0 for the identity W = I the archetypal dictionaries start at; ``None`` for a free dictionary (no W).
    """
    if sae.kind == "free":
        return None
    return float(1 - sae.dictionary.W.detach().diagonal().mean())


def constraint_violation(sae: SparseAutoencoder) -> float | None:
    """Largest violation of the archetypal constraints after training: W ≥ 0, W·1 = 1, ‖Λ_i‖ ≤ δ (0 = feasible)."""
    if sae.kind == "free":
        return None
    d = sae.dictionary
    W, lam_norms = d.W.detach(), d.Lambda.detach().norm(dim=1)
    violations = ((-W).clamp(min=0).max(), (W.sum(1) - 1).abs().max(), (lam_norms - d.delta).max())
    return max(0.0, *(float(v) for v in violations))


def run_cache(
    train_pool: Tensor,
    test: Tensor,
    subsets: list[Tensor],
    centred: bool,
    steps: int,
    true_atoms: Tensor,
) -> Callable[[str, int], dict[str, Any]]:
    """``one_run(arm, r)``: train arm ``arm`` on run ``r``'s subset once (cached: each run is in two seed pairs)."""
    cache: dict[tuple[str, int], dict[str, Any]] = {}
    prep = "centred" if centred else "raw"

    def one_run(arm: str, r: int) -> dict[str, Any]:
        if (arm, r) not in cache:
            x = train_pool[subsets[r]]
            mu = x.mean(0) if centred else torch.zeros(x.shape[1])  # each run centres with its own subset
            sae, D0, _ = train_arm(
                x - mu, arm, seed=r, steps=steps, l1_penalty=L1_PENALTY[prep], l0_penalty=L0_PENALTY[prep]
            )
            out = evaluate(sae, test - mu)
            D = sae.dictionary.get_dictionary()
            cache[(arm, r)] = {
                "truth_cosine": float(dictionary_stability(D, true_atoms)),  # each atom's best true concept, matched
                "D": D,
                "alive": out["alive"],
                "r2": out["r2"],
                "l0": out["l0"],
                "moved": float(1 - torch.nn.functional.cosine_similarity(D, D0, dim=1).mean()),
                "w_off_identity": w_off_identity(sae),
                "constraint_violation": constraint_violation(sae),
            }
        return cache[(arm, r)]

    return one_run


def pair_metrics(
    one_run: Callable[[str, int], dict[str, Any]], pairs: list[tuple[int, int]]
) -> Callable[[str, int], dict[str, float]]:
    """``fn(arm, p)`` for ``run_arms``: the stability of seed pair ``p`` and the mean per-run metrics of its runs."""

    def fn(arm: str, p: int) -> dict[str, float]:
        i, j = pairs[p]
        a, b = one_run(arm, i), one_run(arm, j)
        metrics = {
            "stability": float(dictionary_stability(a["D"], b["D"])),
            "stability_alive": float(dictionary_stability(a["D"], b["D"], alive=a["alive"], alive_ref=b["alive"])),
            "dead_fraction": 1 - float((a["alive"].float().mean() + b["alive"].float().mean()) / 2),
            **{k: (a[k] + b[k]) / 2 for k in ("r2", "l0", "moved", "truth_cosine")},
        }
        if a["w_off_identity"] is not None:
            metrics["w_off_identity"] = (a["w_off_identity"] + b["w_off_identity"]) / 2
            metrics["constraint_violation"] = max(a["constraint_violation"], b["constraint_violation"])
        return metrics

    return fn


# --- the paper's two benchmarks, per arm and run ------------------------------------------------------------------


def _points_dictionary(x: Tensor, num_atoms: int, seed: int) -> Tensor:
    """``num_atoms`` random rows of ``x``, unit-normalised: the non-learned dictionary of data points."""
    pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:num_atoms]
    return torch.nn.functional.normalize(x[pick], dim=1)


def pursuit_codes(x: Tensor, atoms: Tensor, top_k: int) -> Tensor:
    """Non-learned sparse codes by greedy pursuit (OMP with non-negative codes): ``top_k`` times, pick the atom most
    positively correlated with the residual, refit least squares on the atoms picked so far and clip negative codes
    to 0; batched over rows. Codes ``(n, num_atoms)`` for unit ``atoms`` ``(num_atoms, d)``."""
    n = len(x)
    codes = torch.zeros(n, len(atoms), dtype=x.dtype)
    picked = torch.zeros(n, len(atoms), dtype=torch.bool)
    residual, chosen = x, []
    rows = torch.arange(n)
    for _ in range(top_k):
        score = (residual @ atoms.T).masked_fill(picked, float("-inf"))
        best = score.argmax(1)
        picked[rows, best] = True
        chosen.append(best)
        basis = atoms[torch.stack(chosen, 1)]  # (n, t, d)
        coef = torch.linalg.lstsq(basis.transpose(1, 2), x.unsqueeze(-1)).solution.squeeze(-1).clamp(min=0)
        codes.zero_().scatter_(1, torch.stack(chosen, 1), coef)
        residual = x - torch.einsum("nt,ntd->nd", coef, basis)
    return codes


def _top_k_codes(x: Tensor, atoms: Tensor, top_k: int) -> Tensor:
    """Non-learned codes: the ``top_k`` largest ReLU projections of each row on the unit ``atoms``."""
    pre = torch.relu(x @ atoms.T)
    values, index = pre.topk(top_k, dim=1)
    return torch.zeros_like(pre).scatter(1, index, values)


def heuristic_r2(train: Tensor, test: Tensor, kind: str, seed: int, num_atoms: int = 64, top_k: int = 3) -> float:
    """Test R² of a non-learned reconstruction with the SAEs' budget of ``top_k`` codes per sample: ``"pca"``
    projects onto the top ``top_k`` right singular directions of ``train`` (the best fixed ``top_k``-dimensional
    linear code), ``"points"`` codes each row by greedy pursuit (:func:`pursuit_codes`) over ``num_atoms`` random
    training points."""
    if kind == "pca":
        _, _, vh = torch.linalg.svd(train.double(), full_matrices=False)
        basis = vh[:top_k].float()
        return r2_score(test, (test @ basis.T) @ basis)
    if kind == "points":
        atoms = _points_dictionary(train, num_atoms, seed)
        return r2_score(test, pursuit_codes(test, atoms, top_k) @ atoms)
    raise ValueError(f"Expected a heuristic 'pca' or 'points', got {kind!r}.")


def plausibility_task(seed: int = 0, width: int = 32) -> dict[str, Any]:
    """The plausibility benchmark's data: the digits backbone's pooled features (train / test), standardised with
    the train split's statistics, and its head's class directions carried into the standardised space: the logits
    are ``(v ⊙ σ)·z + const``, so a channel that never fires (σ = 0) takes no part in a direction (its head weights
    only add a constant)."""
    from zoo.datamodules.images import ImageDataModule
    from zoo.models.ra_sae.benchmarks import digits_backbone, standardise

    body, head, accuracy = digits_backbone(seed=seed, width=width)
    dm = ImageDataModule(dataset="digits", seed=0)
    dm.setup("fit")
    with torch.no_grad():
        features = body(dm.train_set.x)
        train, mu, sigma = standardise(features)
        test = (body(dm.test_set.x) - mu) / sigma
        head_weight = head.weight * features.std(0)  # the head's map of z: logits = z @ head_weight.T + const
        logits = head(body(dm.test_set.x))
    return {
        "train": train,
        "test": test,
        "directions": torch.nn.functional.normalize(head_weight, dim=1),
        "head_weight": head_weight,
        "test_logits": logits,
        "backbone_accuracy": accuracy,
    }


def plausibility_run(task: dict[str, Any], arm: str, seed: int, steps: int, num_atoms: int) -> dict[str, float]:
    """One arm's plausibility (and test R²) on ``task``; ``"points"`` is the non-learned dictionary of random
    training points."""
    from zoo.models.ra_sae.benchmarks import plausibility

    if arm == "points":
        return {"plausibility": plausibility(_points_dictionary(task["train"], num_atoms, seed), task["directions"])}
    sae, _, _ = train_arm(task["train"], arm, seed=seed, steps=steps, num_atoms=num_atoms)
    out = evaluate(sae, task["test"])
    return {
        "plausibility": plausibility(sae.dictionary.get_dictionary(), task["directions"]),
        "r2": out["r2"],
        "l0": out["l0"],
        "dead_fraction": 1 - float(out["alive"].float().mean()),
    }


def identifiability_task(objects: int = 10, present: int = 4, seed: int = 1) -> dict[str, Tensor]:
    """The identifiability benchmark's data: activation-space "collages", each the sum of ``present`` of
    ``objects`` non-negative concept vectors (weights Exp(1) + 0.5, noise 0.05; d = 32), 4,000 to train the
    dictionaries and 4,000 to score them, and which objects each test sample holds."""
    from zoo.datamodules.activations import make_sparse_concepts

    x, _, codes = make_sparse_concepts(8000, 32, objects, present, 0.05, seed=seed, return_codes=True)
    return {"train": x[:4000], "test": x[4000:], "presence": codes[4000:] > 0, "present": present}


def identifiability_run(task: dict[str, Any], arm: str, seed: int, steps: int) -> dict[str, float]:
    """One arm's identifiability accuracy (the paper's, as many atoms as objects) and test R²; ``"channels"`` reads
    the objects off single input coordinates, ``"points"`` off random training points (both non-learned)."""
    from zoo.models.ra_sae.benchmarks import identifiability_accuracy

    objects, k = task["presence"].shape[1], task["present"]
    if arm == "channels":
        codes = task["test"]
    elif arm == "points":
        codes = _top_k_codes(task["test"], _points_dictionary(task["train"], objects, seed), k)
    else:
        sae, _, _ = train_arm(task["train"], arm, seed=seed, steps=steps, num_atoms=objects, top_k=k)
        out = evaluate(sae, task["test"])
        accuracy = float(identifiability_accuracy(out["codes"], task["presence"]).mean())
        return {"accuracy": accuracy, "r2": out["r2"], "l0": out["l0"]}
    return {"accuracy": float(identifiability_accuracy(codes, task["presence"]).mean())}
