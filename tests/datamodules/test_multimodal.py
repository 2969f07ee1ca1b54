"""MultiModalDataModule: the C³R shortcut generator, test conditions and noise, the feature-file path, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from zoo.datamodules.multimodal import MultiModalDataModule, spurious_modalities, write_features


def _small(**kwargs) -> MultiModalDataModule:
    dm = MultiModalDataModule(**{"n_train": 300, "n_val": 50, "n_test": 200, "batch_size": 32, **kwargs})
    dm.setup()
    return dm


def _residual(x: torch.Tensor, basis: torch.Tensor) -> float:
    """Relative residual of the rows of x projected on the row space of basis (rank cut at float32 precision)."""
    _, S, Vh = torch.linalg.svd(basis.double(), full_matrices=False)
    V = Vh[: int((S > 1e-4 * S[0]).sum())]
    x = x.double()
    return float((x - x @ V.T @ V).norm() / x.norm())


def _write_split(root, split, n, rng, dims=(("a", 4), ("b", 3)), num_classes=3):
    features = {m: rng.normal(size=(n, d)).astype(np.float32) for m, d in dims}
    labels = rng.integers(0, num_classes, n)
    write_features(root, split, features, labels)
    return features, labels


def _write_cache(folder, rows: np.ndarray, shard: int, tokens: str = "cls", images: int | None = None) -> None:
    folder.mkdir(parents=True)
    names = []
    for i, start in enumerate(range(0, len(rows), shard)):
        names.append(f"acts_{i:05d}.npy")
        np.save(folder / names[-1], rows[start : start + shard].astype(np.float16))
    meta = {"backbone": "toy", "library": "open_clip", "pretrained": False, "tokens": tokens, "dim": rows.shape[1],
            "count": len(rows), "dtype": "float16", "shards": names, "images": images or len(rows)}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta))


# ------------------------------------------------------------------------------------------------ the generator
def test_spurious_modalities_shapes_and_dtypes():
    """Check that the generator returns float32 modalities (n, 32) and int64 labels in 0..C-1."""
    data = spurious_modalities(50, rho=0.9, seed=0, num_classes=3)
    assert {k: tuple(v.shape) for k, v in data.items()} == {"a": (50, 32), "b": (50, 32), "label": (50,),
                                                            "spurious": (50,)}  # fmt: skip
    assert data["a"].dtype == data["b"].dtype == torch.float32
    assert data["label"].dtype == data["spurious"].dtype == torch.int64
    assert 0 <= int(data["label"].min()) and int(data["label"].max()) <= 2 and int(data["spurious"].max()) <= 2


def test_spurious_modalities_is_deterministic():
    """Check that a seed gives the same samples every time and another seed other samples."""
    first, again, other = (spurious_modalities(100, 0.9, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["a"], other["a"])


def test_spurious_modalities_share_mixing_across_sample_seeds():
    """Check that M_a and M_b depend on mixing_seed only: noiseless samples of any seed span the same subspaces."""
    one, two = spurious_modalities(200, 0.9, seed=0, noise_std=0.0), spurious_modalities(200, 0.0, seed=1, noise_std=0.0)
    moved = spurious_modalities(200, 0.9, seed=1, noise_std=0.0, mixing_seed=1)
    for m in ("a", "b"):  # rank 12 and 5 inside 32 dims
        assert _residual(two[m], one[m]) < 1e-4
        assert _residual(moved[m], one[m]) > 0.3


def test_spurious_modalities_rejects_bad_arguments():
    """Check that an out-of-range rho, class count or noise raises a ValueError naming the value."""
    with pytest.raises(ValueError, match="expected \\[0, 1\\], got 1.5"):
        spurious_modalities(10, rho=1.5, seed=0)
    with pytest.raises(ValueError, match="num_classes must be at least 2, got 1"):
        spurious_modalities(10, rho=0.5, seed=0, num_classes=1)
    with pytest.raises(ValueError, match="expected >= 0, got -0.1"):
        spurious_modalities(10, rho=0.5, seed=0, noise_std=-0.1)


# ------------------------------------------------------------------------------------------------ synthetic DataModule
def test_multimodal_batches_are_dicts_of_modalities_and_labels():
    """Check the batch keys, shapes and dtypes and the attributes a model reads."""
    dm = _small()
    batch = next(iter(dm.train_dataloader()))
    assert {k: tuple(v.shape) for k, v in batch.items()} == {"a": (32, 32), "b": (32, 32), "label": (32,)}
    assert batch["a"].dtype == torch.float32 and batch["label"].dtype == torch.int64
    assert dm.modalities == ["a", "b"] and dm.dims == {"a": 32, "b": 32} and dm.num_classes == 3
    assert (len(dm.train_set), len(dm.val_set)) == (300, 50)
    assert all(len(dm.test_sets[name]) == 200 for name in dm.test_names)
    assert "synthetic" in dm.describe() and "\n" not in dm.describe()


def test_multimodal_is_deterministic_and_regenerates_each_split():
    """Check that the same seed gives the same splits, another seed others, and no split reuses another's samples."""
    one, two, other = _small(), _small(), _small(seed=1)
    assert torch.equal(one.train_set.data["a"], two.train_set.data["a"])
    assert torch.equal(one.test_sets["anti"].data["b"], two.test_sets["anti"].data["b"])
    assert not torch.equal(one.train_set.data["a"], other.train_set.data["a"])
    sets = [one.train_set, one.val_set, *(one.test_sets[name] for name in ("id", "uninformative", "anti"))]
    firsts = {tuple(s.data["a"][0].tolist()) for s in sets}
    assert len(firsts) == len(sets)
    assert one.split_seed("train") == 0 and other.split_seed("anti") == 1004 and other.noise_seed(2) == 1012


def test_multimodal_shortcut_strength_per_condition():
    """Check that y' = y on about 90 % of train rows, about 1/3 of the uninformative rows and none of the anti rows."""
    dm = MultiModalDataModule()
    dm.setup()
    agree = {name: float((dm.spurious[name] == (dm.train_set if name == "train" else dm.test_sets[name]).data["label"])
                         .float().mean()) for name in ("train", "id", "uninformative", "anti")}  # fmt: skip
    assert abs(agree["train"] - 0.9) < 0.03 and abs(agree["id"] - 0.9) < 0.03
    assert abs(agree["uninformative"] - 1 / 3) < 0.04
    assert agree["anti"] == 0.0


def test_multimodal_text_shortcut_breaks_out_of_distribution_while_image_holds():
    """Check that a logistic regression on "b" alone scores > 0.85 ID and < 0.2 anti, one on "a" > 0.6 on both."""
    dm = MultiModalDataModule()  # seed 0 measured: b 0.906 / 0.175, a 0.747 / 0.754 (seeds 0-4: b anti 0.14-0.20)
    dm.setup()
    train = dm.train_set.data
    acc = {}
    for m in ("a", "b"):
        clf = LogisticRegression(max_iter=1000).fit(train[m].numpy(), train["label"].numpy())
        for name in ("id", "anti"):
            data = dm.test_sets[name].data
            acc[m, name] = clf.score(data[m].numpy(), data["label"].numpy())
    assert acc["b", "id"] > 0.85 and acc["b", "anti"] < 0.2
    assert acc["a", "id"] > 0.6 and acc["a", "anti"] > 0.6


def test_multimodal_mixing_is_shared_across_splits():
    """Check that train and every test condition come from the same M_a and M_b (noiseless rows share a subspace)."""
    dm = _small(noise_std=0.0, noise_levels=[0.0])
    other = _small(noise_std=0.0, noise_levels=[0.0], seed=1)
    for m in ("a", "b"):
        for name in dm.test_names:
            assert _residual(dm.test_sets[name].data[m], dm.train_set.data[m]) < 1e-4
        assert _residual(other.train_set.data[m], dm.train_set.data[m]) > 0.3  # the world is per DataModule seed


@pytest.mark.parametrize("modality", ["a", "b"])
def test_multimodal_noise_only_on_chosen_modality_and_grows_with_level(modality):
    """Check that test noise changes only the chosen modality, with the level as its standard deviation."""
    dm = _small(noise_modality=modality)
    clean = dm.test_sets["id"].data
    spreads = []
    for level in (0.5, 1.0, 2.0):
        noisy = dm.test_sets[f"id_noise{level:g}"].data
        for key in clean:
            if key != modality:
                assert torch.equal(noisy[key], clean[key])
        spreads.append(float((noisy[modality] - clean[modality]).std()))
        assert abs(spreads[-1] / level - 1) < 0.05
    assert spreads == sorted(spreads)
    d1, d2 = (dm.test_sets[n].data[modality] - clean[modality] for n in ("id_noise1", "id_noise2"))
    assert abs(float(torch.corrcoef(torch.stack([d1.flatten(), d2.flatten()]))[0, 1])) < 0.05  # independent draws


def test_multimodal_test_loaders_follow_test_names():
    """Check that test_dataloader gives one loader per test name, in the documented order."""
    dm = _small()
    assert dm.test_names == ["id", "uninformative", "anti", "id_noise0.5", "id_noise1", "id_noise2"]
    loaders = dm.test_dataloader()
    assert len(loaders) == len(dm.test_names)
    assert [loader.dataset for loader in loaders] == [dm.test_sets[name] for name in dm.test_names]
    custom = _small(noise_levels=[2.0, 0.0, 0.25])
    assert custom.test_names == ["id", "uninformative", "anti", "id_noise2", "id_noise0.25"]
    assert len(custom.test_dataloader()) == 5 and set(next(iter(custom.test_dataloader()[3]))) == {"a", "b", "label"}


def test_multimodal_rejects_bad_arguments():
    """Check that bad arguments fail in __init__ with the value and what was expected."""
    with pytest.raises(ValueError, match="source must be 'synthetic' or 'features', got 'npy'"):
        MultiModalDataModule(source="npy")
    with pytest.raises(ValueError, match="source='features' needs data_dir"):
        MultiModalDataModule(source="features")
    with pytest.raises(ValueError, match="expected \\[0, 1\\], got 1.2"):
        MultiModalDataModule(rho_train=1.2)
    with pytest.raises(ValueError, match="finite values >= 0, got \\[0.0, -1.0\\]"):
        MultiModalDataModule(noise_levels=[0.0, -1.0])
    with pytest.raises(ValueError, match="must be distinct"):
        MultiModalDataModule(noise_levels=[1.0, 1.0])
    with pytest.raises(ValueError, match="noise_modality 'image' is not a synthetic modality"):
        MultiModalDataModule(noise_modality="image")
    with pytest.raises(ValueError, match="n_train=0"):
        MultiModalDataModule(n_train=0)


# ------------------------------------------------------------------------------------------------ the feature path
def test_multimodal_reads_written_features(tmp_path):
    """Check that the layout written by write_features is served as dict batches, with test noise on one modality."""
    rng = np.random.default_rng(0)
    written = {split: _write_split(tmp_path, split, n, rng) for split, n in (("train", 20), ("val", 6), ("test", 8))}
    dm = MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_levels=[0.0, 1.0], batch_size=4)
    assert dm.test_names == ["test", "test_noise1"]
    dm.setup()
    assert dm.modalities == ["a", "b"] and dm.dims == {"a": 4, "b": 3}
    for split, data in (("train", dm.train_set.data), ("val", dm.val_set.data), ("test", dm.test_sets["test"].data)):
        features, labels = written[split]
        assert torch.equal(data["a"], torch.from_numpy(features["a"])) and data["label"].tolist() == labels.tolist()
    batch = next(iter(dm.train_dataloader()))
    assert {k: tuple(v.shape) for k, v in batch.items()} == {"a": (4, 4), "b": (4, 3), "label": (4,)}
    noisy, clean = dm.test_sets["test_noise1"].data, dm.test_sets["test"].data
    assert not torch.equal(noisy["a"], clean["a"]) and torch.equal(noisy["b"], clean["b"])
    assert len(dm.test_dataloader()) == 2 and "features from" in dm.describe()


def test_multimodal_splits_val_from_train_and_takes_three_modalities(tmp_path):
    """Check that without val/ a seeded 10 % of train is held out, and that a third modality is served too."""
    rng = np.random.default_rng(1)
    dims = (("audio", 2), ("image", 5), ("text", 3))
    features, _ = _write_split(tmp_path, "train", 30, rng, dims)
    _write_split(tmp_path, "test", 5, rng, dims)
    dm = MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_modality="image")
    dm.setup()
    assert dm.modalities == ["audio", "image", "text"] and (len(dm.train_set), len(dm.val_set)) == (27, 3)
    rows = torch.cat([dm.train_set.data["image"], dm.val_set.data["image"]])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, features["image"].tolist()))
    again = MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_modality="image")
    again.setup()
    assert torch.equal(again.val_set.data["text"], dm.val_set.data["text"])


def test_multimodal_reads_an_activation_cache_modality(tmp_path):
    """Check that a modality stored as an activation-cache folder (sharded, float16) is read in row order."""
    rng = np.random.default_rng(2)
    caches = {}
    for split, n in (("train", 12), ("test", 7)):
        _write_split(tmp_path, split, n, rng, dims=(("text", 3),))
        caches[split] = rng.normal(size=(n, 6)).astype(np.float16)
        _write_cache(tmp_path / split / "image", caches[split], shard=5)
    dm = MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_modality="image")
    dm.setup()
    assert dm.modalities == ["image", "text"] and dm.dims == {"image": 6, "text": 3}
    assert torch.equal(dm.test_sets["test"].data["image"], torch.from_numpy(caches["test"].astype(np.float32)))


def test_multimodal_rejects_a_token_cache(tmp_path):
    """Check that a cache with several rows per image raises a ValueError asking for one row per image."""
    rng = np.random.default_rng(3)
    _write_split(tmp_path, "train", 4, rng, dims=(("text", 3),))
    _write_cache(tmp_path / "train" / "image", rng.normal(size=(16, 6)), shard=8, tokens="all", images=4)
    dm = MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_modality="text")
    with pytest.raises(ValueError, match="holds 16 rows \\(tokens='all'.*must have one row per image"):
        dm.setup()


def test_multimodal_raises_on_missing_files(tmp_path):
    """Check that a missing folder, labels file or modality file raises a FileNotFoundError saying what goes where."""
    with pytest.raises(FileNotFoundError, match="No train folder at .*expects .*train/ and .*test/"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path / "none")).setup()
    rng = np.random.default_rng(4)
    _write_split(tmp_path, "train", 10, rng)
    with pytest.raises(FileNotFoundError, match="No test folder at .*test.*labels.npy"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()
    write_features(tmp_path, "test", {"a": np.ones((3, 4))}, np.zeros(3, dtype=int))
    with pytest.raises(FileNotFoundError, match="No modality 'b' in .*test: expected .*b.npy"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()
    (tmp_path / "test" / "labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match="No labels at .*labels.npy"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()


def test_multimodal_raises_on_bad_feature_values(tmp_path):
    """Check the ValueErrors for unequal row counts, NaN, labels out of range and an unknown noise modality."""
    rng = np.random.default_rng(5)
    _write_split(tmp_path, "train", 10, rng)
    _write_split(tmp_path, "test", 10, rng)
    test = tmp_path / "test"
    np.save(test / "b.npy", np.ones((9, 3), np.float32))
    with pytest.raises(ValueError, match="different numbers of rows \\(a: 10, b: 9, labels.npy: 10\\)"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()
    bad = np.ones((10, 3), np.float32)
    bad[3, 1] = np.nan
    np.save(test / "b.npy", bad)
    with pytest.raises(ValueError, match="modality 'b' of split 'test'.*row 3 has NaN"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()
    np.save(test / "b.npy", np.ones((10, 3), np.float32))
    np.save(test / "labels.npy", np.array([0, 1, 2, 5, 0, 1, 2, 0, 1, 2]))
    with pytest.raises(ValueError, match="label 5 at row 3 is not in 0..2"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path)).setup()
    np.save(test / "labels.npy", np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="noise_modality 'image' is not one of the modalities \\['a', 'b'\\]"):
        MultiModalDataModule(source="features", data_dir=str(tmp_path), noise_modality="image").setup()


def test_write_features_rejects_mismatched_arrays(tmp_path):
    """Check that write_features refuses unequal row counts and a modality named like the labels."""
    with pytest.raises(ValueError, match="different numbers of rows \\(image: 3, labels.npy: 4\\)"):
        write_features(tmp_path, "train", {"image": np.ones((3, 2))}, np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="cannot be named 'label'"):
        write_features(tmp_path, "train", {"label": np.ones((4, 2))}, np.zeros(4, dtype=int))
    assert not (tmp_path / "train").exists()
