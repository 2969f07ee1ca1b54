"""Tests of CLUDI's bad or partial inputs: feature rows that are not finite or all zeros are refused on every path,
label −1 (unlabelled) is clustered but left out of ACC / NMI / ARI, labels beyond ``num_classes`` are refused, and
``FeatureClusteringDataModule`` refuses all-zero feature rows and labels below −1 as it reads them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning import Trainer
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.models.cludi import CLUDIModule

SMALL = {"num_clusters": 3, "feat_dim": 8, "emb_dim": 4, "eval_samples": 2, "eval_steps": 10}


def small_module(**kwargs) -> CLUDIModule:
    torch.manual_seed(0)
    return CLUDIModule(**{**SMALL, **kwargs})


def spread_module() -> CLUDIModule:
    """The small model with its features' say in ẑ0 amplified, so that the untrained net uses two clusters on
    :func:`three_blobs` (a net fresh from init puts every row in one cluster)."""
    model = small_module()
    with torch.no_grad():
        model.net.features[4].weight.mul_(30.0)
        model.net.head.weight.mul_(10.0)
    return model.eval()


def three_blobs() -> tuple[Tensor, Tensor]:
    """24 rows, 8 around each of 3 random centres, with their class 0, 1, 2."""
    g = torch.Generator().manual_seed(0)
    centres = 3 * torch.randn(3, 8, generator=g)
    return centres.repeat_interleave(8, 0) + 0.3 * torch.randn(24, 8, generator=g), torch.arange(3).repeat_interleave(8)


def trainer() -> Trainer:
    return Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )


def hungarian_accuracy(pred: np.ndarray, target: np.ndarray) -> float:
    """Accuracy of the best one-to-one matching of clusters to classes."""
    k = max(pred.max(), target.max()) + 1
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (pred, target), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return counts[rows, cols].sum() / len(pred)


# Every path a feature batch takes into the model: each must refuse the bad row the same way.
PATHS: dict[str, Callable[[CLUDIModule, Tensor], object]] = {
    "forward": lambda model, x: model.eval()(x),
    "cluster": lambda model, x: model.eval().cluster(x),
    "training_step": lambda model, x: model.train().training_step((x, torch.zeros(len(x), dtype=torch.long)), 0),
    "validation_step": lambda model, x: model.eval().validation_step((x, torch.zeros(len(x), dtype=torch.long)), 0),
    "test_step": lambda model, x: model.eval().test_step((x, torch.zeros(len(x), dtype=torch.long)), 0),
    "predict_step": lambda model, x: model.eval().predict_step(x, 0),
}


# ------------------------------------------------------------------------------------------------ feature rows
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_module_refuses_a_non_finite_feature_row_on_every_path(path: str, value: float) -> None:
    """Check that a NaN, inf or −inf entry (rows 3 and 5 of 6) raises one ValueError naming row 3 and the count,
    instead of labelling the rows 0 with NaN probabilities."""
    x = torch.randn(6, 8)
    x[3, 2] = x[5, 0] = value
    with pytest.raises(ValueError, match=r"^features row 3 is not finite \(NaN or inf\); 2 of 6 rows are\. Drop"):
        PATHS[path](small_module(), x)


@pytest.mark.parametrize("path", PATHS)
def test_module_refuses_an_all_zero_feature_row_on_every_path(path: str) -> None:
    """Check that a row of zeros (row 4 of 6, with −0.0 entries) raises ValueError naming it: L2 normalisation would
    leave it zero, without a direction."""
    x = torch.randn(6, 8)
    x[4] = -0.0
    with pytest.raises(ValueError, match=r"^features row 4 is all zeros; 1 of 6 rows are\. L2 normalisation"):
        PATHS[path](small_module(), x)


def test_module_names_non_finite_rows_first_and_float64_overflow() -> None:
    """Check that with an all-zero row 1 and a NaN row 4 the NaN row is named, that a float64 value beyond float32's
    range is refused as inf (it is cast first), and that a row with one non-zero entry is accepted."""
    model = small_module().eval()
    x = torch.randn(6, 8)
    x[1], x[4, 7] = 0.0, float("nan")
    with pytest.raises(ValueError, match=r"features row 4 is not finite"):
        model(x)
    big = torch.randn(6, 8, dtype=torch.float64)
    big[2, 0] = 1e300
    with pytest.raises(ValueError, match=r"features row 2 is not finite"):
        model(big)
    sparse = torch.zeros(6, 8)
    sparse[torch.arange(6), torch.arange(6)] = 1.0
    assert torch.isfinite(model(sparse)).all()


# ------------------------------------------------------------------------------------------------ labels
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_unlabelled_rows_are_clustered_but_left_out_of_the_scores(stage: str) -> None:
    """Check that with label −1 on every other row of a first batch and on all of a second batch, the logged ACC,
    NMI and ARI equal scipy/sklearn on the labelled rows only (not with −1 as a class), while clusters_used counts
    every row of both batches."""
    model = spread_module()
    x, y = three_blobs()
    y_half = torch.where(torch.arange(24) % 2 == 0, -1, y)
    x_unlabelled = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(torch.cat([x, x_unlabelled]), torch.cat([y_half, -torch.ones(8).long()])), 24)
    result = getattr(trainer(), stage)(model, loader, verbose=False)[0]
    # the references: batch b is sampled with the generator seeded seed + b, as cluster(x) does for b = 0
    pred = model.cluster(x)[0].numpy()
    pred_unlabelled = model(x_unlabelled, generator=torch.Generator().manual_seed(1)).argmax(-1).numpy()
    labelled = y_half.numpy() >= 0
    p, t = pred[labelled], y_half.numpy()[labelled]
    assert len(np.unique(p)) >= 2  # not a degenerate single-cluster check
    key = "val" if stage == "validate" else "test"
    assert result[f"{key}/accuracy"] == pytest.approx(hungarian_accuracy(p, t), abs=1e-6)
    assert result[f"{key}/nmi"] == pytest.approx(normalized_mutual_info_score(t, p), abs=1e-5)
    assert result[f"{key}/ari"] == pytest.approx(adjusted_rand_score(t, p), abs=1e-5)
    assert result[f"{key}/nmi"] != pytest.approx(normalized_mutual_info_score(y_half.numpy(), pred), abs=1e-3)
    shares = np.bincount(np.concatenate([pred, pred_unlabelled]), minlength=3) / 32
    assert result[f"{key}/clusters_used"] == pytest.approx(float((shares >= 0.02).mean()), abs=1e-6)


def test_a_stage_without_labels_logs_only_clusters_used(recwarn: pytest.WarningsRecorder) -> None:
    """Check that a test set labelled −1 throughout logs clusters_used (every row counted) and no ACC / NMI / ARI,
    without torchmetrics' compute-before-update warning, and that the next labelled run scores normally."""
    model = spread_module()
    x, y = three_blobs()
    result = trainer().test(model, DataLoader(TensorDataset(x, -torch.ones(24).long()), 24), verbose=False)[0]
    shares = np.bincount(model.cluster(x)[0].numpy(), minlength=3) / 24
    assert set(result) == {"test/clusters_used"}
    assert result["test/clusters_used"] == pytest.approx(float((shares >= 0.02).mean()), abs=1e-6)
    assert not [w for w in recwarn if "compute" in str(w.message)]
    result = trainer().test(model, DataLoader(TensorDataset(x, y), 24), verbose=False)[0]
    pred = model.cluster(x)[0].numpy()
    assert result["test/nmi"] == pytest.approx(normalized_mutual_info_score(y.numpy(), pred), abs=1e-5)


@pytest.mark.parametrize(
    "num_classes, label, match",
    [
        (2, 2, r"label 2 \(row 4\) is out of range for a model built with num_classes=2: labels must be in 0\.\.1,"),
        (None, 3, r"label 3 \(row 4\) .*num_classes=None, .*num_clusters=3 classes: labels must be in 0\.\.2,"),
    ],
    ids=["num_classes=2", "num_classes=None"],
)
def test_labels_beyond_num_classes_are_refused(num_classes: int | None, label: int, match: str) -> None:
    """Check that a label ≥ num_classes (or ≥ K when num_classes is None) raises ValueError naming the label, its row
    and num_classes, instead of torchmetrics' RuntimeError; validation says 'val'."""
    model = small_module(num_classes=num_classes).eval()
    y = torch.tensor([0, 1, -1, 0, label, label])
    with pytest.raises(ValueError, match=rf"^test batch 0: {match} or -1 for an unlabelled row\. Set num_classes"):
        model.test_step((torch.randn(6, 8), y), 0)
    with pytest.raises(ValueError, match=r"^val batch 3: label"):
        model.validation_step((torch.randn(6, 8), y), 3)


# ------------------------------------------------------------------------------------------------ datamodule
def write_npy(folder: Path, split: str, x: np.ndarray, y: np.ndarray) -> None:
    np.save(folder / f"{split}_features.npy", x)
    np.save(folder / f"{split}_labels.npy", y)


def random_features(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 4, size=n)


@pytest.mark.parametrize("l2_normalize", [True, False])
def test_files_with_an_all_zero_row_are_refused(tmp_path: Path, l2_normalize: bool) -> None:
    """Check that an all-zero row (row 2 of test_features.npy, or row 0 of the official train.pth) stops setup with
    one line naming the file, the row and the count, normalised or not."""
    write_npy(tmp_path, "train", *random_features(12, 0))
    x, y = random_features(10, 1)
    x[2] = 0.0
    write_npy(tmp_path, "test", x, y)
    dm = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path), l2_normalize=l2_normalize)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'test_features.npy'}: row 2 is all zeros; 1 of 10")):
        dm.setup()
    pth = tmp_path / "pth"
    pth.mkdir()
    for split, seed in (("train", 0), ("test", 1)):
        x, y = random_features(6, seed)
        if split == "train":
            x[[0, 4]] = 0.0
        torch.save(torch.from_numpy(x), pth / f"{split}.pth")
        torch.save(torch.from_numpy(y), pth / f"labels_{split}.pth")
    dm = FeatureClusteringDataModule(source="files", data_dir=str(pth), l2_normalize=l2_normalize)
    with pytest.raises(ValueError, match=re.escape(f"{pth / 'train.pth'}: row 0 is all zeros; 2 of 6 rows are")):
        dm.setup()


def test_files_with_labels_below_minus_one_are_refused_and_minus_one_is_kept(tmp_path: Path) -> None:
    """Check that label −2 (row 1 of train_labels.npy) stops setup naming the file, row and label, and that −1 labels
    are read as they are, with num_classes from the real classes."""
    x, y = random_features(12, 0)
    y[1] = -2
    write_npy(tmp_path, "train", x, y)
    write_npy(tmp_path, "test", *random_features(6, 1))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'train_labels.npy'}: row 1 has label -2; labels")):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()
    y[1], y[5] = -1, -1
    write_npy(tmp_path, "train", x, y)
    dm = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path))
    dm.setup()
    assert torch.equal(dm.train_set.tensors[1], torch.from_numpy(y)) and dm.num_classes == int(y.max()) + 1


def test_files_with_unlabelled_rows_score_the_labelled_rows_end_to_end(tmp_path: Path) -> None:
    """Check that test features saved with −1 on every other label run through Trainer.test and log the NMI of the
    labelled rows, as sklearn computes it from model.cluster on the served features."""
    x, y = three_blobs()
    y_half = torch.where(torch.arange(24) % 2 == 0, -1, y)
    write_npy(tmp_path, "train", x.numpy(), y.numpy())
    write_npy(tmp_path, "test", x.numpy(), y_half.numpy())
    model, dm = spread_module(), FeatureClusteringDataModule(source="files", data_dir=str(tmp_path), batch_size=64)
    result = trainer().test(model, dm, verbose=False)[0]
    pred = model.cluster(dm.test_set.tensors[0])[0].numpy()
    labelled = y_half.numpy() >= 0
    expected = normalized_mutual_info_score(y_half.numpy()[labelled], pred[labelled])
    assert result["test/nmi"] == pytest.approx(expected, abs=1e-5)


def test_image_caches_with_an_all_zero_row_are_refused(tmp_path: Path) -> None:
    """Check that source="images" refuses an all-zero row of an existing feature cache (no backbone is built: the
    cache is written here) with one line naming the cache folder and the row."""
    data, cache = tmp_path / "images", tmp_path / "cache"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (data / split / c).mkdir(parents=True)
            for i in range(2):
                (data / split / c / f"{i}.jpg").touch()  # ImageFolder lists the files; the cache is never rebuilt
        acts = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float16)
        acts[1] = 0.0
        (cache / split).mkdir(parents=True)
        np.save(cache / split / "acts_00000.npy", acts)
        meta = {"backbone": "toy", "library": "timm", "pretrained": False, "tokens": "cls", "dim": 6, "count": 4}
        meta |= {"dtype": "float16", "shards": ["acts_00000.npy"], "images": 4}
        (cache / split / "meta.json").write_text(json.dumps(meta))
    dm = FeatureClusteringDataModule(source="images", data_dir=str(data), cache_dir=str(cache))
    with pytest.raises(ValueError, match=re.escape(f"{cache / 'train'}: row 1 is all zeros; 1 of 4 rows are")):
        dm.setup()


def test_training_monitor_scores_only_labelled_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train/nmi_teacher`` is sklearn's NMI of the first teacher sample on the rows with a label ≥ 0 only."""
    model = CLUDIModule(num_clusters=3, feat_dim=8, emb_dim=4, batch_diffusion=2, train_steps=10, eval_steps=10)
    teacher = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    monkeypatch.setattr(model.diffusion, "sample", lambda *a, **k: 10 * torch.eye(3)[teacher].expand(2, -1, -1))
    logged: dict[str, float] = {}
    monkeypatch.setattr(model, "log", lambda name, value, **kwargs: logged.__setitem__(name, float(value)))
    monkeypatch.setattr(model, "log_dict", lambda values, **kwargs: None)
    y = torch.tensor([0, 1, 2, 1, -1, -1, 0, 1, 2, 0, -1, 2])
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    model.training_step((x, y), 0)
    keep = (y >= 0).numpy()
    expected = normalized_mutual_info_score(y.numpy()[keep], teacher.numpy()[keep])
    assert logged["train/nmi_teacher"] == pytest.approx(expected, abs=1e-5)
    assert abs(expected - normalized_mutual_info_score(y.numpy(), teacher.numpy())) > 0.05  # −1 as a class differs
