"""Paired multi-modal data with a spurious shortcut (C³R): a synthetic two-modality task, or feature files.

The embedded default is the C³R card's §5 toy, :func:`spurious_modalities`: modality ``"a"`` (the "image") carries
the causal latent of the label plus nuisance, modality ``"b"`` (the "text") carries a little of it plus a strong
*spurious* copy of the label that agrees with it only with probability ρ. Training and validation use ρ = 0.9;
the test conditions are regenerated (never resampled from train) at ρ = 0.9 (``"id"``), 1/3 (``"uninformative"``)
and 0 (``"anti"``), and the ID condition is repeated with Gaussian noise on one modality (QMF-style corruption).

The real path (``source="features"``) reads paired per-modality features, e.g. image and text embeddings::

    data_dir/
      train/
        labels.npy        # int, (n,), classes 0..C-1
        image.npy         # float, (n, d_image): one file per modality, named after it
        text/             # ... or an activation cache folder (datamodules.activation_cache): meta.json +
          meta.json       #     acts_*.npy shards, one row per sample (built with tokens="cls" or "mean")
          acts_00000.npy
      val/                # optional: without it, a seeded 10 % of train
      test/

The train split's files name the modalities (the batch keys, sorted); val and test must hold them too, row i of
every file being sample i. Write the layout with
:func:`write_features`; for example with open_clip embeddings (PIL ``images``, ``captions`` and ``labels`` given)::

    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained="openai")
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    with torch.no_grad():
        img = model.encode_image(torch.stack([preprocess(im) for im in images])).numpy()
        txt = model.encode_text(tokenizer(captions)).numpy()
    write_features("clip_food101", "train", {"image": img, "text": txt}, labels)
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from zoo.datamodules.activation_cache import read_cache_meta
from zoo.datamodules.base import BatchedDataModule, DictBatches
from zoo.datamodules.checks import check_finite

__all__ = ["CONDITIONS", "MultiModalDataModule", "spurious_modalities", "write_features"]

DIM = 32  # width of each synthetic modality
NUISANCE = 8  # width of the nuisance n_a of modality "a"
# The mixing matrices are drawn from a generator seeded with mixing_seed + _MIXING_OFFSET: a stream apart from every
# sample seed the DataModule uses, so the "physics" and the samples never share random numbers.
_MIXING_OFFSET = 2**40
# The synthetic test conditions: name -> ρ (None: the training ρ). Their order is the order of test_names.
CONDITIONS: dict[str, float | None] = {"id": None, "uninformative": 1 / 3, "anti": 0.0}
_SEED_STRIDE = 1000  # split seeds are seed * 1000 + offset, so no two DataModule seeds share a split's samples
_SEED_OFFSETS = {"train": 0, "val": 1, "id": 2, "uninformative": 3, "anti": 4}
_NOISE_OFFSET = 10  # noise level i (its index in noise_levels) is drawn with seed * 1000 + 10 + i
_MAX_LEVELS = _SEED_STRIDE - _NOISE_OFFSET
LABELS = "labels.npy"


def _mixing(num_classes: int, mixing_seed: int) -> tuple[Tensor, Tensor]:
    """The fixed matrices ``M_a (32, d_c + 8)`` and ``M_b (32, 2 + C)``, entries N(0, 1/fan_in) (unit-scale rows)."""
    g = torch.Generator().manual_seed(mixing_seed + _MIXING_OFFSET)
    d_a, d_b = max(4, num_classes) + NUISANCE, 2 + num_classes
    return torch.randn(DIM, d_a, generator=g) / math.sqrt(d_a), torch.randn(DIM, d_b, generator=g) / math.sqrt(d_b)


def spurious_modalities(
    n: int, rho: float, seed: int, num_classes: int = 3, noise_std: float = 0.3, mixing_seed: int = 0
) -> dict[str, Tensor]:
    """Draw ``n`` samples of the C³R card's two-modality task with a spurious shortcut in modality ``"b"`` (§5).

    With y uniform over C classes and the causal latent c ~ N(μ_y, I), μ_y = 1.5·onehot(y) (c has 4 dims, or C when
    C > 4):

    - ``"a"`` (the "image"): x_a = M_a [c ; n_a] + noise_std·ε, nuisance n_a ~ N(0, I_8);
    - ``"b"`` (the "text"): x_b = M_b [0.5·c_{1:2} ; 2·onehot(y')] + noise_std·ε, where y' = y with probability
      ``rho`` and otherwise a uniformly drawn *different* class (the shortcut; ``rho=0`` makes it always wrong).

    M_a (32 × (4 + 8)) and M_b (32 × (2 + C)) have i.i.d. N(0, 1/fan_in) entries drawn from ``mixing_seed`` alone, so
    every split and every sample ``seed`` share them; the samples come from ``seed``.

    Args:
        n: number of samples, ``n >= 0``.
        rho: P(y' = y), in [0, 1].
        seed: seed of the samples (labels, latents, nuisance, shortcut, noise).
        num_classes: C, at least 2.
        noise_std: standard deviation of the additive noise ε on both modalities, ``>= 0``.
        mixing_seed: seed of the mixing matrices M_a and M_b.

    Returns:
        ``"a"`` (n, 32) and ``"b"`` (n, 32) float32, ``"label"`` y (n,) and ``"spurious"`` y' (n,) int64.

    Raises:
        ValueError: ``n < 0``, ``rho`` outside [0, 1], ``num_classes < 2`` or ``noise_std < 0``.

    Example:
        >>> data = spurious_modalities(1000, rho=0.9, seed=0)
        >>> data["a"].shape, data["b"].dtype, data["label"].dtype
        (torch.Size([1000, 32]), torch.float32, torch.int64)
        >>> round((data["spurious"] == data["label"]).float().mean().item(), 1)
        0.9
    """
    if n < 0:
        raise ValueError(f"n must be >= 0 samples, got {n}.")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho is the probability that the spurious label equals y; expected [0, 1], got {rho}.")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
    if noise_std < 0:
        raise ValueError(f"noise_std is a standard deviation; expected >= 0, got {noise_std}.")
    M_a, M_b = _mixing(num_classes, mixing_seed)
    C, d_c = num_classes, max(4, num_classes)
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    c = 1.5 * torch.nn.functional.one_hot(y, d_c).float() + torch.randn(n, d_c, generator=g)
    n_a = torch.randn(n, NUISANCE, generator=g)
    x_a = torch.cat([c, n_a], 1) @ M_a.T + noise_std * torch.randn(n, DIM, generator=g)
    keep = torch.rand(n, generator=g) < rho
    # A uniformly drawn different class: shift y by 1..C-1 (mod C).
    other = (y + torch.randint(1, C, (n,), generator=g)) % C
    y_spurious = torch.where(keep, y, other)
    code = torch.cat([0.5 * c[:, :2], 2.0 * torch.nn.functional.one_hot(y_spurious, C).float()], 1)
    x_b = code @ M_b.T + noise_std * torch.randn(n, DIM, generator=g)
    return {"a": x_a, "b": x_b, "label": y, "spurious": y_spurious}


def write_features(
    data_dir: str | os.PathLike, split: str, features: dict[str, np.ndarray], labels: np.ndarray
) -> Path:
    """Write one split of paired features in the layout ``MultiModalDataModule(source="features")`` reads.

    Writes ``data_dir/<split>/<modality>.npy`` (float32, (n, d_m)) per modality and ``data_dir/<split>/labels.npy``
    (int64, (n,)). Each file goes to a temporary name first and is renamed into place, so an interrupted write
    leaves no half-written file under the name the DataModule reads; other files in the folder are left alone.

    Args:
        data_dir: the dataset folder (created if needed).
        split: ``"train"``, ``"val"`` or ``"test"``.
        features: modality name -> array (n, d_m), the same n for every modality, row i being sample i.
        labels: integer classes (n,).

    Returns:
        The split folder ``data_dir/<split>``.

    Raises:
        ValueError: an unknown split, no modality, a modality named ``label``/``labels``, an array that is not 2-D,
            labels that are not 1-D integers, or row counts that disagree.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> folder = write_features(tmp.name, "train", {"image": np.ones((4, 3)), "text": np.ones((4, 2))},
        ...                         np.array([0, 1, 2, 0]))
        >>> sorted(p.name for p in folder.iterdir())
        ['image.npy', 'labels.npy', 'text.npy']
        >>> tmp.cleanup()
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}.")
    if not features:
        raise ValueError("features is empty; pass {modality name: (n, d) array}, e.g. {'image': ..., 'text': ...}.")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array (n,), got {labels.dtype} of shape {labels.shape}.")
    arrays = {}
    for name, x in features.items():
        _check_modality_name(name, "write_features")
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"Modality {name!r} has shape {x.shape}; expected (n, d). Pool tokens to one row each.")
        arrays[name] = x.astype(np.float32)
    rows = {name: len(x) for name, x in arrays.items()}
    if set(rows.values()) != {len(labels)}:
        raise ValueError(f"The modalities and labels have different numbers of rows ({_counts(rows, len(labels))}); "
                         "every array needs one row per sample, in the same order.")  # fmt: skip
    folder = Path(data_dir) / split
    folder.mkdir(parents=True, exist_ok=True)
    for name, x in [*arrays.items(), (LABELS[: -len(".npy")], labels.astype(np.int64))]:
        tmp = folder / f".{name}.tmp.npy"
        np.save(tmp, x)
        os.replace(tmp, folder / f"{name}.npy")
    return folder


def _check_modality_name(name: str, who: str) -> None:
    if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ValueError(f"{who}: modality name {name!r} is not a plain file name; use e.g. 'image' or 'text'.")
    if name in ("label", "labels"):
        raise ValueError(f"{who}: a modality cannot be named {name!r}: 'label' is the batch key of the classes and "
                         "labels.npy their file. Rename the modality, e.g. to 'text'.")  # fmt: skip


def _counts(rows: dict[str, int], labels: int) -> str:
    return ", ".join([f"{name}: {n}" for name, n in rows.items()] + [f"{LABELS}: {labels}"])


def _noise_name(base: str, level: float) -> str:
    return f"{base}_noise{level:g}"


class MultiModalDataModule(BatchedDataModule):
    """Paired modalities and labels as dict batches ``{"a": (B, d_a), "b": (B, d_b), "label": (B,)}`` (C³R).

    Every key but ``"label"`` is a modality (float32); ``"label"`` is int64. Splits:

    - ``train`` and ``val``: the training distribution (synthetic: ρ = ``rho_train``);
    - test: one loader per condition, in the order of ``test_names``. Synthetic: ``"id"`` (ρ = ``rho_train``),
      ``"uninformative"`` (ρ = 1/3), ``"anti"`` (ρ = 0), then ``"id_noise<σ>"`` for each non-zero level of
      ``noise_levels`` in the given order: the ID condition with N(0, σ²) noise added to ``noise_modality``.
      Features: ``"test"``, then ``"test_noise<σ>"``. Noise is applied to the clean ID/test condition only, and a
      level of 0 is that clean condition itself (no separate loader), so e.g. the worst accuracy over noise levels
      is the minimum over ``"id"`` and the ``"id_noise*"`` loaders.

    Synthetic seeds: every split is regenerated with its own sample seed ``1000·seed + k``, k = 0 (train), 1 (val),
    2 (id), 3 (uninformative), 4 (anti); the noise of level i (its index in ``noise_levels``) is drawn with seed
    ``1000·seed + 10 + i``, independently per level. The mixing matrices use ``mixing_seed=seed`` for all splits, so
    train and test share the modalities' "physics". Features: a missing val split is a random 10 % of train
    (``torch.randperm`` seeded with ``seed``); noise seeds as above.

    Attributes (synthetic: from ``__init__``; features: after ``setup``): ``modalities`` (batch keys, sorted for
    features), ``dims`` (modality -> width), ``num_classes``, ``test_names`` (from ``__init__``) and, synthetic
    only, ``spurious`` (split or condition name -> y' (n,), the shortcut label, not served in batches).

    Args:
        source: ``"synthetic"`` (:func:`spurious_modalities`) or ``"features"`` (files in ``data_dir``; see the
            module docstring).
        data_dir: the features folder (``source="features"`` only).
        n_train: synthetic training samples.
        n_val: synthetic validation samples.
        n_test: synthetic samples per test condition.
        rho_train: synthetic P(y' = y) of train, val and the ID test condition, in [0, 1].
        num_classes: C; feature labels must lie in 0..C-1.
        noise_std: synthetic noise of both modalities (σ of ε in :func:`spurious_modalities`).
        noise_levels: standard deviations of the Gaussian test noise, ``>= 0``, distinct; absolute, in feature units
            (scale them to the spread of real features).
        noise_modality: the modality that gets the test noise (synthetic: ``"a"`` or ``"b"``).
        batch_size: rows per batch.
        seed: the seed every split derives from (above).
        num_workers: DataLoader workers.

    Raises:
        ValueError: an argument out of range (in ``__init__``); in ``setup``, features whose row counts disagree,
            NaN or inf, labels outside 0..C-1, or a ``noise_modality`` not among the modalities.
        FileNotFoundError: in ``setup``, a missing split folder, labels file or modality file.

    Example:
        >>> dm = MultiModalDataModule(n_train=64, n_val=16, n_test=32, batch_size=16)
        >>> dm.setup()
        >>> batch = next(iter(dm.train_dataloader()))
        >>> {key: tuple(value.shape) for key, value in batch.items()}
        {'a': (16, 32), 'b': (16, 32), 'label': (16,)}
        >>> dm.test_names, len(dm.test_dataloader())
        (['id', 'uninformative', 'anti', 'id_noise0.5', 'id_noise1', 'id_noise2'], 6)
    """

    def __init__(
        self,
        source: Literal["synthetic", "features"] = "synthetic",
        data_dir: str | None = None,
        n_train: int = 3000,
        n_val: int = 500,
        n_test: int = 2000,
        rho_train: float = 0.9,
        num_classes: int = 3,
        noise_std: float = 0.3,
        noise_levels: list[float] = [0.0, 0.5, 1.0, 2.0],  # noqa: B006 - jsonargparse and the hub config need a plain list
        noise_modality: str = "a",
        batch_size: int = 128,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if source not in ("synthetic", "features"):
            raise ValueError(f"source must be 'synthetic' or 'features', got {source!r}.")
        if source == "features" and not data_dir:
            raise ValueError("source='features' needs data_dir, the folder holding train/, test/ (and optionally "
                             "val/) with <modality>.npy and labels.npy; see datamodules.multimodal.")  # fmt: skip
        if source == "synthetic" and data_dir is not None:
            raise ValueError(f"data_dir={data_dir!r} is read only by source='features'; pass that, or drop data_dir.")
        if min(n_train, n_val, n_test, batch_size) < 1 or num_workers < 0 or seed < 0:
            raise ValueError(f"need n_train, n_val, n_test, batch_size >= 1 and num_workers, seed >= 0, got "
                             f"n_train={n_train}, n_val={n_val}, n_test={n_test}, batch_size={batch_size}, "
                             f"num_workers={num_workers}, seed={seed}.")  # fmt: skip
        if not 0.0 <= rho_train <= 1.0:
            raise ValueError(f"rho_train is P(spurious label = label); expected [0, 1], got {rho_train}.")
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
        if noise_std < 0:
            raise ValueError(f"noise_std is a standard deviation; expected >= 0, got {noise_std}.")
        noise_levels = [float(level) for level in noise_levels]
        if any(not math.isfinite(level) or level < 0 for level in noise_levels):
            raise ValueError(f"noise_levels are standard deviations; expected finite values >= 0, got {noise_levels}.")
        if len(set(noise_levels)) != len(noise_levels) or len(noise_levels) > _MAX_LEVELS:
            raise ValueError(f"noise_levels must be distinct (at most {_MAX_LEVELS}), got {noise_levels}; "
                             "drop the repeats.")  # fmt: skip
        if source == "synthetic" and noise_modality not in ("a", "b"):
            raise ValueError(f"noise_modality {noise_modality!r} is not a synthetic modality; expected 'a' (the "
                             "causal 'image') or 'b' (the 'text' with the shortcut).")  # fmt: skip
        self.save_hyperparameters()
        base = "id" if source == "synthetic" else "test"
        extra = list(CONDITIONS)[1:] if source == "synthetic" else []
        self.test_names: list[str] = [base, *extra, *(_noise_name(base, s) for s in noise_levels if s > 0)]
        self.num_classes = num_classes
        synthetic = source == "synthetic"
        self.modalities: list[str] = ["a", "b"] if synthetic else []
        self.dims: dict[str, int] = {"a": DIM, "b": DIM} if synthetic else {}
        self.spurious: dict[str, Tensor] = {}
        self.test_sets: dict[str, DictBatches] = {}

    def split_seed(self, name: str) -> int:
        """The sample seed of a synthetic split or condition (``"train"``, ``"val"``, ``"id"``, ...)."""
        return _SEED_STRIDE * self.hparams.seed + _SEED_OFFSETS[name]

    def noise_seed(self, index: int) -> int:
        """The seed of the test noise of ``noise_levels[index]``."""
        return _SEED_STRIDE * self.hparams.seed + _NOISE_OFFSET + index

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = self._synthetic() if self.hparams.source == "synthetic" else self._features()
        clean = self.test_names[0]
        if self.hparams.noise_modality not in self.modalities:
            raise ValueError(f"noise_modality {self.hparams.noise_modality!r} is not one of the modalities "
                             f"{self.modalities} found in {self.hparams.data_dir}; set it to one of them.")  # fmt: skip
        for i, level in enumerate(self.hparams.noise_levels):
            if level > 0:
                splits[_noise_name(clean, level)] = self._noisy(splits[clean], level, self.noise_seed(i))
        self.train_set, self.val_set = DictBatches(splits["train"]), DictBatches(splits["val"])
        self.test_sets = {name: DictBatches(splits[name]) for name in self.test_names}
        self.test_set = self.test_sets[clean]  # predict_dataloader: the clean test condition

    def _noisy(self, data: dict[str, Tensor], level: float, seed: int) -> dict[str, Tensor]:
        m = self.hparams.noise_modality
        g = torch.Generator().manual_seed(seed)
        return {**data, m: data[m] + level * torch.randn(data[m].shape, generator=g)}

    def _synthetic(self) -> dict[str, dict[str, Tensor]]:
        hp = self.hparams
        sizes = {"train": hp.n_train, "val": hp.n_val, **{name: hp.n_test for name in CONDITIONS}}
        splits = {}
        for name, n in sizes.items():
            rho = hp.rho_train if CONDITIONS.get(name) is None else CONDITIONS[name]
            data = spurious_modalities(n, rho, self.split_seed(name), hp.num_classes, hp.noise_std, mixing_seed=hp.seed)
            self.spurious[name] = data.pop("spurious")
            splits[name] = data
        return splits

    def _features(self) -> dict[str, dict[str, Tensor]]:
        root = Path(self.hparams.data_dir).expanduser()
        train_dir = root / "train"
        self.modalities = _find_modalities(train_dir, root)
        splits = {"train": self._read_split(root, "train")}
        if (root / "val").is_dir():
            splits["val"] = self._read_split(root, "val")
        else:  # a seeded 10 % of train
            n = len(splits["train"]["label"])
            if n < 2:
                raise ValueError(f"{train_dir} holds {n} sample; need at least 2 to split off a validation set, or "
                                 f"add {root / 'val'}.")  # fmt: skip
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.hparams.seed))
            n_val = max(1, round(0.1 * n))
            train = splits["train"]
            splits["val"] = {k: v[order[:n_val]] for k, v in train.items()}
            splits["train"] = {k: v[order[n_val:]] for k, v in train.items()}
        splits["test"] = self._read_split(root, "test")
        for name, data in splits.items():
            for m in self.modalities:
                if data[m].shape[1] != self.dims[m]:
                    raise ValueError(f"Modality {m!r} is {data[m].shape[1]} wide in {name} but {self.dims[m]} in "
                                     "train; every split needs the same features.")  # fmt: skip
        return splits

    def _read_split(self, root: Path, split: str) -> dict[str, Tensor]:
        folder = root / split
        layout = (f"MultiModalDataModule(source='features') expects {root}/<split>/labels.npy (int, (n,)) and, per "
                  "modality, <modality>.npy (float, (n, d)) or an activation-cache folder <modality>/ (meta.json + "
                  "acts_*.npy), for the splits train and test (val optional). Write them with "
                  "zoo.datamodules.multimodal.write_features.")  # fmt: skip
        if not folder.is_dir():
            raise FileNotFoundError(f"No {split} folder at {folder}. {layout}")
        if not (folder / LABELS).is_file():
            raise FileNotFoundError(f"No labels at {folder / LABELS}. {layout}")
        labels = np.load(folder / LABELS)
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{folder / LABELS} is {labels.dtype} of shape {labels.shape}; expected integer "
                             "classes (n,). Save them with np.save(path, labels.astype(np.int64)).")  # fmt: skip
        C = self.num_classes
        bad = np.flatnonzero((labels < 0) | (labels >= C))
        if len(bad):
            raise ValueError(f"{folder / LABELS}: label {labels[bad[0]]} at row {bad[0]} is not in 0..{C - 1} "
                             f"(num_classes={C}; labels span {labels.min()}..{labels.max()}). Map the classes to "
                             "0..C-1, or set num_classes.")  # fmt: skip
        data = {m: self._read_modality(folder, m, split, len(labels), layout) for m in self.modalities}
        rows = {m: len(x) for m, x in data.items()}
        if set(rows.values()) != {len(labels)}:
            raise ValueError(f"The {split} modalities have different numbers of rows ({_counts(rows, len(labels))}) "
                             f"in {folder}; every file needs one row per sample, in the same order.")  # fmt: skip
        for m, x in data.items():
            check_finite(x, f"modality {m!r} of split {split!r} ({folder / m})")
            self.dims.setdefault(m, int(x.shape[1]))
        return {**data, "label": torch.from_numpy(labels.astype(np.int64))}

    def _read_modality(self, folder: Path, m: str, split: str, n_labels: int, layout: str) -> Tensor:
        file, cache = folder / f"{m}.npy", folder / m
        if file.is_file():
            x = np.load(file)
        elif cache.is_dir():
            meta = read_cache_meta(cache)
            if meta["count"] != n_labels:
                raise ValueError(f"The activation cache {cache} holds {meta['count']} rows (tokens={meta['tokens']!r}, "
                                 f"{meta['images']} images) but {folder / LABELS} has {n_labels} labels: the cache "
                                 "must have one row per image. Build it with tokens='cls' or 'mean'.")  # fmt: skip
            shards = [np.load(cache / name) for name in meta["shards"]]
            x = np.concatenate(shards) if shards else np.zeros((0, meta["dim"]), np.float32)
        else:
            raise FileNotFoundError(f"No modality {m!r} in {folder}: expected {file} or an activation cache "
                                    f"{cache}/ (as in {folder.parent / 'train'}). {layout}")  # fmt: skip
        if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
            raise ValueError(f"Modality {m!r} of split {split!r} is {x.dtype} of shape {x.shape}; expected numbers "
                             "(n, d), one row per sample. Pool token features to one row each.")  # fmt: skip
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    # ------------------------------------------------------------------------------------------------ loaders
    def test_dataloader(self) -> list[DataLoader]:  # type: ignore[override]
        """One ordered loader per test condition, in the order of ``test_names``."""
        if not self.test_sets:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for a dataloader.")
        return [self._loader(self.test_sets[name], shuffle=False) for name in self.test_names]

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        levels = [s for s in hp.noise_levels if s > 0]
        sigmas = ", ".join(f"{s:g}" for s in levels)
        noise = f"; Gaussian noise σ ∈ {{{sigmas}}} on {hp.noise_modality!r}" if levels else ""
        if hp.source == "synthetic":
            return (f"synthetic spurious-shortcut task (C³R card §5), C = {hp.num_classes}: 'a' 32-d causal 'image', "
                    f"'b' 32-d 'text' whose shortcut label agrees with y w.p. ρ = {hp.rho_train:g}; "
                    f"{hp.n_train}/{hp.n_val} train/val, {hp.n_test} per test condition: id (ρ = {hp.rho_train:g}), "
                    f"uninformative (ρ = 1/3), anti (ρ = 0){noise} (id only); seed {hp.seed}")  # fmt: skip
        dims = ", ".join(f"{m} ({d}-d)" for m, d in self.dims.items()) or "modalities read at setup"
        sizes = (f"; {len(self.train_set)}/{len(self.val_set)}/{len(self.test_set)} train/val/test"
                 if self.train_set is not None else "")  # fmt: skip
        return f"features from {hp.data_dir}: {dims}, C = {hp.num_classes}{sizes}{noise} (test only); seed {hp.seed}"


def _find_modalities(train_dir: Path, root: Path) -> list[str]:
    """The modalities of the train split: every ``<name>.npy`` but labels.npy, and every non-hidden sub-folder."""
    if not train_dir.is_dir():
        raise FileNotFoundError(f"No train folder at {train_dir}. MultiModalDataModule(source='features') expects "
                                f"{root}/train/ and {root}/test/ (val/ optional), each holding labels.npy (int, (n,)) "
                                "and one <modality>.npy (float, (n, d)) or activation-cache folder per modality. "
                                "Write them with datamodules.multimodal.write_features.")  # fmt: skip
    names = sorted(p.stem for p in train_dir.glob("*.npy") if p.name != LABELS and not p.name.startswith("."))
    names += sorted(p.name for p in train_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not names:
        raise FileNotFoundError(f"No modality in {train_dir}: expected <modality>.npy files (float, (n, d)) or "
                                "activation-cache folders beside labels.npy, e.g. image.npy and text.npy.")  # fmt: skip
    for name in names:
        _check_modality_name(name, f"{train_dir}")
    return sorted(set(names))
