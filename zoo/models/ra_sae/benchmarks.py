"""The RA-SAE paper's two benchmarks, for any SAE that exposes a dictionary ``(num_atoms, dim)`` and its codes.

* **Identifiability**: on data mixed from known ground-truth concepts, do single atoms recover the concepts? Two
  numbers: the Hungarian-matched cosine between the dictionary and the true one (``dictionary_stability``), and,
  per true concept, the best atom's AUROC at telling from its activation whether a sample contains that concept,
  averaged over concepts.
* **Plausibility**: do atoms point along directions the backbone itself uses? The class directions of a linear
  probe on the backbone's activations (scikit-learn's multinomial logistic regression), and for each class the best
  cosine with any atom, averaged over classes.

The card marks both benchmarks as recollections of the paper; these are their small-scale forms.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> true = torch.nn.functional.normalize(torch.rand(4, 6, generator=g), dim=1)
    >>> presence = torch.rand(200, 4, generator=g) < 0.3
    >>> codes = presence.float() * (1 + torch.rand(200, 4, generator=g))  # atoms that fire with their concept
    >>> out = identifiability(true, codes, true, presence)
    >>> out["matched_cosine"], out["auroc"]
    (1.0, 1.0)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from zoo.metrics.dictionary_stability import dictionary_stability

__all__ = ["best_atom_auroc", "digits_backbone_activations", "identifiability", "probe_directions", "plausibility"]


def _average_ranks(x: Tensor) -> Tensor:
    """Ranks ``1 … n`` down each column of ``x`` ``(n, k)``, ties given their average rank (codes are mostly 0)."""
    from scipy.stats import rankdata

    return torch.from_numpy(rankdata(x.double().cpu().numpy(), axis=0)).to(torch.float64)


def best_atom_auroc(codes: Tensor, presence: Tensor) -> Tensor:
    """Per true concept, the best AUROC over atoms of "atom i's activation tells whether concept j is present".

    AUROC_ij = (Σ_{s: j ∈ s} rank_i(s) − P_j (P_j + 1) / 2) / (P_j N_j), the Mann–Whitney form, for all (i, j) at
    once with one matrix product; ties get average ranks, so an atom constant over the data scores 0.5. Concepts
    that are always or never present give NaN.

    Args:
        codes: ``(n, num_atoms)`` activations of the SAE.
        presence: ``(n, num_concepts)`` bool, which true concepts each sample contains.

    Returns:
        ``(num_concepts,)`` float64.
    """
    if codes.ndim != 2 or presence.ndim != 2 or len(codes) != len(presence):
        raise ValueError(
            f"codes (n, k) and presence (n, k*) must share n, got {tuple(codes.shape)}, {tuple(presence.shape)}"
        )
    ranks = _average_ranks(codes)  # (n, k)
    pos = presence.to(torch.float64).cpu()
    p = pos.sum(0)  # (k*,)
    n = len(codes) - p
    rank_sums = pos.T @ ranks  # (k*, k)
    auroc = (rank_sums - (p * (p + 1) / 2)[:, None]) / (p * n)[:, None]
    return auroc.max(1).values


def identifiability(
    dictionary: Tensor, codes: Tensor, true_atoms: Tensor, presence: Tensor
) -> dict[str, float]:
    """``{"matched_cosine", "auroc"}`` of an SAE against the ground truth (see the module docstring)."""
    auroc = best_atom_auroc(codes, presence)
    return {
        "matched_cosine": float(dictionary_stability(dictionary.detach().float(), true_atoms.float())),
        "auroc": float(auroc[~auroc.isnan()].mean()),
    }


def probe_directions(activations: Tensor, labels: Tensor, C: float = 1.0, seed: int = 0) -> Tensor:
    """Unit class directions ``(num_classes, dim)`` of a multinomial logistic-regression probe on ``activations``."""
    from sklearn.linear_model import LogisticRegression

    probe = LogisticRegression(C=C, max_iter=2000, random_state=seed)
    probe.fit(activations.double().cpu().numpy(), labels.cpu().numpy())
    w = torch.from_numpy(np.asarray(probe.coef_, dtype=np.float32))
    return torch.nn.functional.normalize(w, dim=1)


def plausibility(dictionary: Tensor, directions: Tensor) -> float:
    """Mean over classes of the best cosine between the class direction and any atom (in ``[-1, 1]``)."""
    if dictionary.ndim != 2 or directions.ndim != 2 or dictionary.shape[1] != directions.shape[1]:
        raise ValueError(
            f"dictionary (k, d) and directions (classes, d) must share d, got {tuple(dictionary.shape)}, "
            f"{tuple(directions.shape)}"
        )
    atoms = torch.nn.functional.normalize(dictionary.detach().float(), dim=1)
    return float((torch.nn.functional.normalize(directions.float(), dim=1) @ atoms.T).max(1).values.mean())


def digits_backbone_activations(seed: int = 0, epochs: int = 30) -> dict[str, Tensor]:
    """A real backbone's activations at small scale: a small CNN trained on scikit-learn's digits (the embedded split
    of ``datamodules.images.ImageDataModule``), read at its 64-d penultimate ReLU layer.

    The plausibility benchmark's embedded default; on real data, any timm / open_clip backbone's activations through
    ``datamodules.activation_cache`` take its place. A plain Adam loop (a few seconds), since only the activations
    are kept.

    Returns:
        ``{"train", "train_labels", "test", "test_labels", "test_accuracy"}``: ``(n, 64)`` activations and labels.
    """
    from torch import nn

    from zoo.datamodules.images import ImageDataModule

    dm = ImageDataModule(dataset="digits", seed=0)
    dm.setup("fit")
    x, y = dm.train_set.x, dm.train_set.y
    x_test, y_test = dm.test_set.x, dm.test_set.y
    torch.manual_seed(seed)
    body = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
    )
    head = nn.Linear(64, 10)
    opt = torch.optim.Adam([*body.parameters(), *head.parameters()], lr=2e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=g).split(64):
            loss = nn.functional.cross_entropy(head(body(x[batch])), y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    with torch.no_grad():
        train, test = body(x), body(x_test)
        accuracy = (head(test).argmax(1) == y_test).float().mean()
    return {"train": train, "train_labels": y, "test": test, "test_labels": y_test, "test_accuracy": accuracy}
