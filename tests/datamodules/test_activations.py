"""``ActivationsDataModule``: synthetic concepts, seeded splits, centring, batched reads, npy and cache sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.datamodules.activations import ActivationArray, ActivationsDataModule, make_sparse_concepts


def _rows(dataset: ActivationArray) -> torch.Tensor:
    """Every row of a split, in its stored order, in one batched read."""
    return dataset.__getitems__(np.arange(len(dataset)))


def _write_cache(folder: Path, shards: list[np.ndarray], **meta_overrides: object) -> Path:
    """A cache folder as build_activation_cache writes it: float16 shards plus meta.json."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, shard in enumerate(shards):
        names.append(f"acts_{i:05d}.npy")
        np.save(folder / names[-1], shard.astype(np.float16))
    meta = {
        "backbone": "toy",
        "library": "timm",
        "pretrained": False,
        "tokens": "all",
        "dim": shards[0].shape[1],
        "count": sum(len(s) for s in shards),
        "dtype": "float16",
        "shards": names,
        "images": 5,
    }
    (folder / "meta.json").write_text(json.dumps({**meta, **meta_overrides}))
    return folder


# ------------------------------------------------------------------------------------------------ synthetic data
def test_make_sparse_concepts_gives_shapes_and_is_deterministic() -> None:
    """Check that the synthetic data has shapes (n, dim) and (num_atoms, dim), repeats per seed, changes across."""
    x, atoms = make_sparse_concepts(500, dim=16, num_atoms=40, seed=3)
    assert x.shape == (500, 16) and atoms.shape == (40, 16)
    assert x.dtype == atoms.dtype == torch.float32
    x2, atoms2 = make_sparse_concepts(500, dim=16, num_atoms=40, seed=3)
    assert torch.equal(x, x2) and torch.equal(atoms, atoms2)
    x3, atoms3 = make_sparse_concepts(500, dim=16, num_atoms=40, seed=4)
    assert not torch.allclose(x, x3) and not torch.allclose(atoms, atoms3)


def test_make_sparse_concepts_atoms_are_non_negative_unit_rows() -> None:
    """Check that ground-truth atoms are non-negative unit rows by default and take both signs when signed."""
    _, atoms = make_sparse_concepts(10, dim=16, num_atoms=64, seed=0)
    assert (atoms >= 0).all()
    torch.testing.assert_close(atoms.norm(dim=1), torch.ones(64))
    _, signed = make_sparse_concepts(10, dim=16, num_atoms=64, signed=True, seed=0)
    assert (signed < 0).any()
    torch.testing.assert_close(signed.norm(dim=1), torch.ones(64))


def test_make_sparse_concepts_rows_mix_exactly_active_atoms_when_noise_is_zero() -> None:
    """Check that without noise each row is `active` atoms with weights >= 0.5 (codes recovered exactly: k <= d)."""
    x, atoms = make_sparse_concepts(300, dim=16, num_atoms=8, active=3, noise=0.0, seed=1)
    codes = torch.linalg.lstsq(atoms.T.double(), x.T.double()).solution.T  # atoms independent: unique codes
    torch.testing.assert_close((codes @ atoms.double()).float(), x, atol=1e-5, rtol=0)
    nonzero = codes.abs() > 1e-6
    assert (nonzero.sum(1) == 3).all()
    assert (codes[nonzero] >= 0.5 - 1e-6).all()


def test_make_sparse_concepts_noise_has_requested_std() -> None:
    """Check that `noise` adds zero-mean Gaussian noise of that standard deviation to the same clean rows."""
    clean, _ = make_sparse_concepts(4000, dim=16, num_atoms=32, noise=0.0, seed=2)
    noisy, _ = make_sparse_concepts(4000, dim=16, num_atoms=32, noise=0.05, seed=2)
    diff = noisy - clean
    assert diff.std().item() == pytest.approx(0.05, rel=0.03)
    assert abs(diff.mean().item()) < 0.002


def test_make_sparse_concepts_raises_when_active_exceeds_atoms() -> None:
    """Check that more active concepts than atoms is refused with the bound in the message."""
    with pytest.raises(ValueError, match=r"1 <= active <= num_atoms \(4\), got active=5"):
        make_sparse_concepts(10, num_atoms=4, active=5)


# ------------------------------------------------------------------------------------------------ splits
def test_datamodule_splits_are_disjoint_and_cover_pool() -> None:
    """Check that test, validation and training rows are disjoint, sized by the fractions, and cover the pool."""
    dm = ActivationsDataModule(n_samples=1000, val_fraction=0.1, test_fraction=0.2, seed=0)
    dm.setup("fit")
    train, val, test = (set(s.rows.tolist()) for s in (dm.train_set, dm.val_set, dm.test_set))
    assert (len(train), len(val), len(test)) == (700, 100, 200)
    assert not (train & val or train & test or val & test)
    assert train | val | test == set(range(1000))
    x, atoms = make_sparse_concepts(1000, 32, 256, 3, 0.05, False, 0)
    torch.testing.assert_close(_rows(dm.val_set), x[dm.val_set.rows], rtol=0, atol=0)
    torch.testing.assert_close(dm.true_atoms, atoms)


def test_datamodule_is_deterministic_per_seed() -> None:
    """Check that the same seed gives the same split tensors, and another seed other data and splits."""

    def train_rows(seed: int) -> torch.Tensor:
        dm = ActivationsDataModule(n_samples=500, seed=seed)
        dm.setup("fit")
        return _rows(dm.train_set)

    assert torch.equal(train_rows(0), train_rows(0))
    assert not torch.equal(train_rows(0), train_rows(1))


def test_datamodule_subset_halves_train_split_by_subset_seed() -> None:
    """Check that subset=0.5 keeps half the training rows, drawn by subset_seed, and leaves val/test alone."""
    full = ActivationsDataModule(n_samples=1000)
    full.setup("fit")
    halves = []
    for subset_seed in (0, 1):
        dm = ActivationsDataModule(n_samples=1000, subset=0.5, subset_seed=subset_seed)
        dm.setup("fit")
        assert len(dm.train_set) == len(full.train_set) // 2
        assert set(dm.train_set.rows.tolist()) <= set(full.train_set.rows.tolist())
        assert np.array_equal(dm.val_set.rows, full.val_set.rows)
        assert np.array_equal(dm.test_set.rows, full.test_set.rows)
        halves.append(set(dm.train_set.rows.tolist()))
    assert halves[0] != halves[1]


@pytest.mark.parametrize("subset", [0.0, 1.5])
def test_datamodule_raises_when_subset_is_out_of_range(subset: float) -> None:
    """Check that subset outside (0, 1] is refused in __init__."""
    with pytest.raises(ValueError, match=f"Expected 0 < subset <= 1, got {subset}"):
        ActivationsDataModule(subset=subset)


def test_datamodule_center_makes_train_mean_zero() -> None:
    """Check that center=True subtracts the training mean from every split (train mean ~0, offset recorded)."""
    raw = ActivationsDataModule(n_samples=1000)
    raw.setup("fit")
    dm = ActivationsDataModule(n_samples=1000, center=True)
    dm.setup("fit")
    assert _rows(raw.train_set).mean(0).abs().max() > 0.1  # the non-negative atoms give the raw data a clear mean
    torch.testing.assert_close(_rows(dm.train_set).mean(0), torch.zeros(32), atol=1e-5, rtol=0)
    torch.testing.assert_close(dm.offset, _rows(raw.train_set).mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(_rows(dm.val_set), _rows(raw.val_set) - dm.offset, rtol=0, atol=1e-6)
    assert dm.state_dict()["offset"] == pytest.approx(dm.offset.tolist())


# ------------------------------------------------------------------------------------------------ batches
def test_datamodule_serves_whole_batches() -> None:
    """Check that __getitems__ returns a (B, dim) float32 batch equal to single reads; loaders yield batch_size rows."""
    dm = ActivationsDataModule(n_samples=1000, batch_size=64)
    dm.setup("fit")
    idx = [5, 0, 17, 3]
    batch = dm.train_set.__getitems__(idx)
    assert batch.shape == (4, 32) and batch.dtype == torch.float32
    torch.testing.assert_close(batch, torch.stack([dm.train_set[i] for i in idx]), rtol=0, atol=0)
    torch.manual_seed(0)
    sizes = [len(b) for b in dm.train_dataloader()]
    first = next(iter(dm.train_dataloader()))
    assert isinstance(first, torch.Tensor) and first.shape == (64, 32)
    assert sum(sizes) == len(dm.train_set) and set(sizes[:-1]) == {64}
    val_batch = next(iter(dm.val_dataloader()))
    torch.testing.assert_close(val_batch, _rows(dm.val_set)[:64], rtol=0, atol=0)  # not shuffled


def test_datamodule_raises_when_loader_is_asked_before_setup() -> None:
    """Check that asking for a loader before setup() names the call to make."""
    with pytest.raises(RuntimeError, match=r"Call ActivationsDataModule.setup\(\)"):
        ActivationsDataModule(n_samples=100).train_dataloader()


# ------------------------------------------------------------------------------------------------ npy source
def test_datamodule_reads_npy_memory_mapped(tmp_path: Path) -> None:
    """Check that source='npy' memory-maps train.npy/test.npy, serves test.npy as test split, splits val off train."""
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(200, 8)).astype(np.float32), rng.normal(size=(50, 8)).astype(np.float32)
    np.save(tmp_path / "train.npy", train)
    np.save(tmp_path / "test.npy", test)
    dm = ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=8, val_fraction=0.1, batch_size=16)
    dm.setup("fit")
    assert isinstance(dm.train_set.arrays[0], np.memmap) and isinstance(dm.test_set.arrays[0], np.memmap)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (180, 20, 50)
    assert set(dm.train_set.rows.tolist()) | set(dm.val_set.rows.tolist()) == set(range(200))
    np.testing.assert_array_equal(_rows(dm.test_set).numpy(), test)
    np.testing.assert_array_equal(_rows(dm.train_set).numpy(), train[dm.train_set.rows])
    assert next(iter(dm.train_dataloader())).shape == (16, 8)


def test_datamodule_raises_when_npy_files_are_missing(tmp_path: Path) -> None:
    """Check that a data_dir without test.npy raises FileNotFoundError saying what to put there."""
    np.save(tmp_path / "train.npy", np.zeros((10, 8), np.float32))
    dm = ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=8)
    with pytest.raises(FileNotFoundError, match="expects data_dir to hold train.npy and test.npy") as info:
        dm.setup("fit")
    assert str(tmp_path / "test.npy") in str(info.value)


@pytest.mark.parametrize("array", [np.zeros((0, 8), np.float32), np.zeros((0,), np.float32), np.zeros(8, np.float32)])
def test_datamodule_refuses_empty_or_one_dimensional_npy_files(tmp_path: Path, array: np.ndarray) -> None:
    """Check that an empty or 1-D train.npy is refused at setup with one line naming the file and the shape expected,
    not a sampler traceback later."""
    np.save(tmp_path / "train.npy", array)
    np.save(tmp_path / "test.npy", np.zeros((10, 8), np.float32))
    dm = ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=8)
    with pytest.raises(
        ValueError, match=r"train\.npy holds an array of shape .*: expected float activations of shape \(n, 8\)"
    ):
        dm.setup("fit")


def test_datamodule_raises_when_data_dir_is_missing_for_files() -> None:
    """Check that a file source without data_dir is refused in __init__."""
    with pytest.raises(ValueError, match=r"source='npy'\) needs data_dir"):
        ActivationsDataModule(source="npy")


def test_datamodule_raises_when_npy_width_differs(tmp_path: Path) -> None:
    """Check that files of another width raise ValueError naming both widths."""
    for name in ("train.npy", "test.npy"):
        np.save(tmp_path / name, np.zeros((20, 8), np.float32))
    dm = ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=32)
    with pytest.raises(ValueError, match="have width 8, but data.dim is 32"):
        dm.setup("fit")


# ------------------------------------------------------------------------------------------------ cache source
def test_datamodule_reads_every_cache_row_across_shards(tmp_path: Path) -> None:
    """Check that source='cache' serves every row of all float16 shards, with their values, split disjointly."""
    rng = np.random.default_rng(1)
    shards = [rng.normal(size=(30, 8)).astype(np.float16), rng.normal(size=(20, 8)).astype(np.float16)]
    folder = _write_cache(tmp_path / "cache", shards)
    dm = ActivationsDataModule(source="cache", data_dir=str(folder), dim=8, val_fraction=0.2, test_fraction=0.2)
    dm.setup("fit")
    full = np.concatenate(shards).astype(np.float32)
    splits = (dm.train_set, dm.val_set, dm.test_set)
    assert [len(s) for s in splits] == [30, 10, 10]
    assert sorted(np.concatenate([s.rows for s in splits]).tolist()) == list(range(50))
    for split in splits:
        assert all(isinstance(a, np.memmap) for a in split.arrays)
        np.testing.assert_array_equal(_rows(split).numpy(), full[split.rows])
    train_rows = set(dm.train_set.rows.tolist())
    assert train_rows & set(range(30)) and train_rows & set(range(30, 50))  # both shards feed training


def test_datamodule_raises_when_cache_width_differs(tmp_path: Path) -> None:
    """Check that a cache of another width raises ValueError naming both widths."""
    folder = _write_cache(tmp_path / "cache", [np.zeros((12, 8)), np.zeros((4, 8))])
    dm = ActivationsDataModule(source="cache", data_dir=str(folder), dim=16)
    with pytest.raises(ValueError, match="have width 8, but data.dim is 16"):
        dm.setup("fit")


def test_datamodule_raises_when_cache_meta_is_missing(tmp_path: Path) -> None:
    """Check that a cache folder without meta.json raises FileNotFoundError naming the file."""
    dm = ActivationsDataModule(source="cache", data_dir=str(tmp_path), dim=8)
    with pytest.raises(FileNotFoundError, match="meta.json is missing"):
        dm.setup("fit")


# ------------------------------------------------------------------------------------------------ candidates
def test_candidate_points_are_seeded_centroids() -> None:
    """Check that candidate_points returns (n, dim) centroids, the same for a seed and different across seeds."""
    dm = ActivationsDataModule(n_samples=600, center=True)
    first = dm.candidate_points(8, seed=0)
    assert first.shape == (8, 32) and first.dtype == torch.float32
    torch.testing.assert_close(dm.candidate_points(8, seed=0), first, rtol=0, atol=0)
    assert not torch.allclose(dm.candidate_points(8, seed=1), first)
    train = _rows(dm.train_set)
    lo, hi = train.min(0).values, train.max(0).values
    assert ((first >= lo - 1e-5) & (first <= hi + 1e-5)).all()  # centroids are means of training rows
