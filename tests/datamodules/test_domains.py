"""Tests of DomainShiftDataModule on digits: the classes of each domain, the inverted target in [−1, 1], the seeded
split and its sizes, and the errors for bad arguments and for CIFAR without data_dir."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from sklearn.datasets import load_digits
from torch import Tensor

from zoo.datamodules.domains import DomainShiftDataModule


def ready(domain: str = "target", **kwargs) -> DomainShiftDataModule:
    dm = DomainShiftDataModule(domain, **kwargs)
    dm.setup("fit")
    return dm


def rows(x: Tensor) -> Counter:
    """The images as a multiset of pixel tuples (order-free comparison of image sets)."""
    return Counter(tuple(row) for row in x.flatten(1).tolist())


def raw_scaled(classes: range) -> Tensor:
    """sklearn's digits of ``classes``, scaled from 0…16 to [−1, 1] (x / 8 − 1), without any inversion."""
    data = load_digits()
    keep = torch.isin(torch.from_numpy(data.target), torch.tensor(list(classes)))
    return torch.from_numpy(data.images).float()[keep, None] / 8.0 - 1.0


@pytest.mark.parametrize(("domain", "classes"), [("source", range(0, 5)), ("target", range(5, 10))])
def test_each_domain_holds_only_its_classes(domain: str, classes: range) -> None:
    """Check that the source domain has exactly the digits 0–4 and the target exactly 5–9, in both splits."""
    dm = ready(domain)
    for split in (dm.train_set, dm.val_set):
        assert set(split.tensors[1].unique().tolist()) == set(classes)
    assert dm.in_shape == [1, 8, 8]


def test_target_images_are_the_negated_raw_digits_in_range() -> None:
    """Check that the target images are −(pixels / 8 − 1) of sklearn's digits 5–9 (and the source ones the raw
    scaled 0–4), all in [−1, 1] with both ends reached."""
    target, source = ready("target"), ready("source")
    everything = torch.cat([target.train_set.tensors[0], target.val_set.tensors[0]])
    assert rows(everything) == rows(-raw_scaled(range(5, 10)))
    assert rows(torch.cat([source.train_set.tensors[0], source.val_set.tensors[0]])) == rows(raw_scaled(range(5)))
    assert float(everything.min()) == -1.0 and float(everything.max()) == 1.0
    plain = ready("target", invert_target=False)
    assert torch.equal(plain.train_set.tensors[0], -target.train_set.tensors[0])
    assert torch.equal(plain.train_set.tensors[1], target.train_set.tensors[1])


@pytest.mark.parametrize(("domain", "total"), [("source", 901), ("target", 896)])
def test_split_sizes_and_disjointness(domain: str, total: int) -> None:
    """Check the 80 / 20 split: round(0.2·n) validation images, the rest for training, together every image once."""
    dm = ready(domain, val_fraction=0.2)
    n_train, n_val = len(dm.train_set), len(dm.val_set)
    assert n_train + n_val == total and n_val == round(0.2 * total)
    expected = raw_scaled(range(5)) if domain == "source" else -raw_scaled(range(5, 10))
    assert rows(dm.train_set.tensors[0]) + rows(dm.val_set.tensors[0]) == rows(expected)  # each image in one split
    assert not set(rows(dm.train_set.tensors[0])) & set(rows(dm.val_set.tensors[0]))  # digits has no duplicate image
    assert len(ready(domain, val_fraction=0.5).val_set) == round(0.5 * total)
    assert dm.val_set is dm.test_set


def test_split_is_deterministic_by_seed() -> None:
    """Check that the same seed gives the same split and another seed another one."""
    first, again, other = ready(seed=0), ready(seed=0), ready(seed=1)
    for a, b in zip(first.val_set.tensors + first.train_set.tensors, again.val_set.tensors + again.train_set.tensors):
        assert torch.equal(a, b)
    assert rows(first.val_set.tensors[0]) != rows(other.val_set.tensors[0])
    x, y = next(iter(first.train_dataloader()))
    assert x.shape == (64, 1, 8, 8) and y.shape == (64,)


@pytest.mark.parametrize("kwargs", [{"domain": "both"}, {"val_fraction": 0.0}, {"val_fraction": 1.0}])
def test_bad_arguments_are_refused(kwargs: dict) -> None:
    """Check that an unknown domain or a val_fraction outside (0, 1) raises a ValueError."""
    with pytest.raises(ValueError, match="domain must be|val_fraction must be"):
        DomainShiftDataModule(**kwargs)


def test_cifar_without_data_dir_says_so() -> None:
    """Check that dataset="cifar10" without data_dir fails at setup with ImageDataModule's clear message."""
    dm = DomainShiftDataModule("target", dataset="cifar10")
    with pytest.raises(ValueError, match="dataset='cifar10' needs data_dir"):
        dm.setup("fit")
