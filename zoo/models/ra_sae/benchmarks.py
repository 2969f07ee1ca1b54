"""The RA-SAE paper's two benchmarks (Fel et al., ICML 2025, §5.2-5.3), on a small backbone of its own kind.

* **Plausibility** (§5.2): do atoms point along the backbone's own classification directions? The model's final
  layer weights v_1 … v_c are the "true" directions; ``plausibility = (1/c) Σ_i max_j cos(v_i, D_j)``, the best
  atom per class averaged over classes. The SAE reads what the head reads (the pooled features), element-wise
  standardised as the paper does; the head's rows are carried into that space (``v ⊙ σ``: the logits are the same
  linear map of the standardised features).
* **Soft identifiability** (§5.3): collages of 4 distinct objects; the SAE (as many atoms as objects) is trained on
  their activations, and per object j the score is the best atom i and threshold λ at telling whether the object is
  present, ``max_{i, λ} P(1[z_i > λ] = y_j)``, λ over the 1st-100th percentiles of atom i's codes; averaged over
  objects. With 4 of 10 objects present, always answering "absent" scores 0.6.

The embedded backbone (``digits_backbone``) is a small fully convolutional CNN with global average pooling trained
on scikit-learn's 8 × 8 digits, so, like the paper's ImageNet models, it was trained on single objects; it gives the
plausibility task its head and features. Its pooled features of four-digit collages (``digits_collages``, 16 × 16)
are the paper's identifiability construction, but they carry the digits too weakly for any dictionary (a supervised
probe reaches 0.82, every dictionary about 0.68: ``zoo reproduce ra-sae --diagnose``), so the reproduction's
identifiability task builds its collages in activation space instead (``experiment.identifiability_task``). On real
data, a timm / open_clip backbone's activations through ``datamodules.activation_cache`` take its place.

Example:
    >>> presence = torch.tensor([[1, 0], [1, 1], [0, 1], [0, 0]]).bool()
    >>> codes = torch.tensor([[2.0, 0.0], [1.5, 0.1], [0.0, 0.2], [0.0, 0.0]])
    >>> identifiability_accuracy(codes, presence).tolist()   # atom 0 finds object 0, atom 1 object 1 (above 0)
    [1.0, 1.0]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["digits_backbone", "digits_collages", "identifiability_accuracy", "plausibility", "standardise"]


def identifiability_accuracy(codes: Tensor, presence: Tensor, percentiles: int = 100) -> Tensor:
    """Per object, ``max_{atom i, λ} P(1[z_i > λ] = y_j)`` (the paper's soft identifiability), λ over the
    ``1 … percentiles``-th percentiles of each atom's codes, all (atom, threshold, object) triples in two matrix
    products.

    Args:
        codes: ``(n, num_atoms)`` activations of the SAE.
        presence: ``(n, num_objects)`` bool, which objects each sample holds.

    Returns:
        ``(num_objects,)`` float64 accuracies.
    """
    if codes.ndim != 2 or presence.ndim != 2 or len(codes) != len(presence):
        raise ValueError(
            f"codes (n, k) and presence (n, objects) must share n, got {tuple(codes.shape)}, {tuple(presence.shape)}"
        )
    z = codes.detach().double().cpu()
    y = presence.double().cpu()
    q = torch.arange(1, percentiles + 1, dtype=torch.float64) / percentiles
    thresholds = torch.quantile(z, q, dim=0)  # (percentiles, k)
    fired = (z[:, None, :] > thresholds[None]).double().flatten(1)  # (n, percentiles * k)
    n = len(z)
    both = fired.T @ y  # (percentiles * k, objects): fired and present
    neither = n - fired.sum(0)[:, None] - y.sum(0)[None] + both  # not fired and absent
    return ((both + neither) / n).max(0).values


def plausibility(dictionary: Tensor, directions: Tensor) -> float:
    """Mean over classes of the best cosine between the class direction and any atom (in ``[-1, 1]``)."""
    if dictionary.ndim != 2 or directions.ndim != 2 or dictionary.shape[1] != directions.shape[1]:
        raise ValueError(
            f"dictionary (k, d) and directions (classes, d) must share d, got {tuple(dictionary.shape)}, "
            f"{tuple(directions.shape)}"
        )
    atoms = torch.nn.functional.normalize(dictionary.detach().float(), dim=1)
    return float((torch.nn.functional.normalize(directions.float(), dim=1) @ atoms.T).max(1).values.mean())


def standardise(x: Tensor, reference: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Element-wise standardisation (the paper's preprocessing): ``((x − μ) / σ, μ, σ)`` with μ, σ per channel of
    ``reference`` (default ``x``); a constant channel keeps σ = 1."""
    ref = x if reference is None else reference
    mu, sigma = ref.mean(0), ref.std(0)
    sigma = torch.where(sigma > 0, sigma, torch.ones_like(sigma))
    return (x - mu) / sigma, mu, sigma


def digits_backbone(seed: int = 0, epochs: int = 30, width: int = 32) -> tuple[nn.Module, nn.Linear, float]:
    """A small fully convolutional CNN (3 conv layers, ReLU, global average pooling to ``width`` channels) and its
    linear head, trained on scikit-learn's digits (the embedded split of ``datamodules.images.ImageDataModule``) with
    a plain Adam loop (a few seconds).

    Returns:
        ``(body, head, test_accuracy)``: ``body`` maps ``(n, 1, H, W)`` images of any size to ``(n, width)``
        pooled features (the head's input, as a ResNet's pooled features are).
    """
    from zoo.datamodules.images import ImageDataModule

    dm = ImageDataModule(dataset="digits", seed=0)
    dm.setup("fit")
    x, y = dm.train_set.x, dm.train_set.y
    torch.manual_seed(seed)
    body = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )  # fmt: skip
    head = nn.Linear(width, 10)
    opt = torch.optim.Adam([*body.parameters(), *head.parameters()], lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=g).split(64):
            loss = nn.functional.cross_entropy(head(body(x[batch])), y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    body.eval()
    with torch.no_grad():
        accuracy = float((head(body(dm.test_set.x)).argmax(1) == dm.test_set.y).float().mean())
    return body, head, accuracy


def digits_collages(n: int, objects: int = 4, seed: int = 0, split: str = "train") -> tuple[Tensor, Tensor]:
    """``n`` 16 × 16 collages of ``objects`` digits of distinct classes in a 2 × 2 grid (random images of the
    split, random places), and which of the 10 classes each holds.

    Returns:
        ``(images (n, 1, 16, 16), presence (n, 10) bool)``.
    """
    from zoo.datamodules.images import ImageDataModule

    if not 1 <= objects <= 4:
        raise ValueError(f"Expected 1 <= objects <= 4 (a 2 x 2 grid), got {objects}.")
    dm = ImageDataModule(dataset="digits", seed=0)
    dm.setup("fit")
    data = dm.train_set if split == "train" else dm.test_set
    x, y = data.x, data.y
    g = torch.Generator().manual_seed(seed)
    classes = torch.rand(n, 10, generator=g).argsort(1)[:, :objects]  # distinct classes per collage
    by_class = [torch.nonzero(y == c).flatten() for c in range(10)]
    picks = torch.stack(
        [by_class[c][torch.randint(len(by_class[c]), (n,), generator=g)] for c in range(10)], 1
    )  # (n, 10): one random image of every class per collage
    cells = torch.rand(n, 4, generator=g).argsort(1)[:, :objects]  # which grid cells they fill
    images = torch.zeros(n, 1, 16, 16)
    rows = torch.arange(n)
    for k in range(objects):  # `objects` vectorised placements, not a loop over samples
        img = x[picks[rows, classes[:, k]]]
        for cell in range(4):
            at = cells[:, k] == cell
            r, c = divmod(cell, 2)
            images[at, :, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8] = img[at]
    presence = torch.zeros(n, 10, dtype=torch.bool).scatter_(1, classes, True)
    return images, presence
