"""Pairs of independent batches (source plate, target plate) for transport models such as EFM.

Every batch is ``(source, target)``: ``batch_size`` samples of P and ``batch_size`` samples of Q, drawn independently
(no coupling). :class:`ToyPairDataModule` serves 2-D distributions made in code (the EFM card's Gaussian → two-mode
mixture, 8 Gaussians, a Swiss roll) or vectors from ``.npy`` files; :class:`ImagePairDataModule` serves images:
Gaussian noise (generation), scikit-learn's bundled 8×8 digits (all, or one class: ``"digits:3"``), or the real
MNIST / CIFAR-10 from torchvision folders and any ``ImageFolder``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from zoo.datamodules.base import BatchedDataModule
from zoo.datamodules.checks import check_finite

__all__ = ["PairDataset", "ToyPairDataModule", "ImagePairDataModule", "toy_distribution", "TOY_DISTRIBUTIONS"]

TOY_DISTRIBUTIONS = ("gaussian", "two_modes", "eight_gaussians", "swiss_roll")


def toy_distribution(name: str, n: int, generator: torch.Generator) -> Tensor:
    """``n`` samples ``(n, 2)`` of a named 2-D distribution.

    * ``"gaussian"``: N(0, I₂), the source of the card's experiment;
    * ``"two_modes"``: ½N((−4, 0), 0.25·I) + ½N((4, 0), 0.25·I), its target;
    * ``"eight_gaussians"``: eight N(μ_k, 0.25·I) with μ_k on the circle of radius 4;
    * ``"swiss_roll"``: scikit-learn's ``make_swiss_roll`` (noise 0.8), coordinates (0, 2) divided by 5
      (the official toy).

    Example:
        >>> x = toy_distribution("two_modes", 1000, torch.Generator().manual_seed(0))
        >>> x.shape, 0.4 < float((x[:, 0] > 0).float().mean()) < 0.6
        (torch.Size([1000, 2]), True)
    """
    if name == "gaussian":
        return torch.randn(n, 2, generator=generator)
    if name == "two_modes":
        sign = torch.randint(0, 2, (n,), generator=generator) * 2.0 - 1.0
        centres = torch.stack([4.0 * sign, torch.zeros(n)], dim=1)
        return centres + 0.5 * torch.randn(n, 2, generator=generator)
    if name == "eight_gaussians":
        angle = torch.randint(0, 8, (n,), generator=generator) * (2 * math.pi / 8)
        centres = 4.0 * torch.stack([angle.cos(), angle.sin()], dim=1)
        return centres + 0.5 * torch.randn(n, 2, generator=generator)
    if name == "swiss_roll":
        from sklearn.datasets import make_swiss_roll

        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        x, _ = make_swiss_roll(n, noise=0.8, random_state=seed)
        return torch.from_numpy(x[:, [0, 2]] / 5.0).float()
    raise ValueError(f"unknown toy distribution {name!r}; choose one of {TOY_DISTRIBUTIONS} or a .npy path")


class PairDataset(Dataset):
    """Independent pairs: item ``i`` is ``(source[i % n_s], target[i % n_t])``; length ``max(n_s, n_t)``.

    Shuffled indices give a random source and an independent random target per row; the shorter pool cycles.
    ``__getitems__`` serves a whole batch with two index operations.
    """

    def __init__(self, source: Tensor, target: Tensor) -> None:
        if source.shape[1:] != target.shape[1:]:
            raise ValueError(
                f"source and target samples must have the same shape to share one space, got "
                f"{tuple(source.shape[1:])} and {tuple(target.shape[1:])}"
            )
        self.source, self.target = source, target

    def __len__(self) -> int:
        return max(len(self.source), len(self.target))

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.source[idx % len(self.source)], self.target[idx % len(self.target)]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.source[index % len(self.source)], self.target[index % len(self.target)]


class _PairDataModule(BatchedDataModule):
    """Shared setup: draw or load each side's train/val/test pools, then wrap them in ``PairDataset``s."""

    def _pools(self, spec: str, side: int) -> tuple[Tensor, Tensor, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        source, target = self._pools(self.hparams.source, 0), self._pools(self.hparams.target, 1)
        if source[0].shape[1:] != target[0].shape[1:]:
            raise ValueError(
                f"source {self.hparams.source!r} has samples of shape {tuple(source[0].shape[1:])} but target "
                f"{self.hparams.target!r} has {tuple(target[0].shape[1:])}: both plates must live in one space"
            )
        self.train_set, self.val_set, self.test_set = (PairDataset(s, t) for s, t in zip(source, target))

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample (``model.shape``)."""
        self.setup("fit")
        return tuple(self.train_set.source.shape[1:])


#: Fewest rows a ``.npy`` plate may have: 2 for validation, 2 for test (the energy distance needs two points per
#: sample) and 6 to train on.
MIN_FILE_ROWS = 10


def _split(x: Tensor, n_val: int, n_test: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """A seeded random ``(train, val, test)`` split with the given sizes; the callers check that they fit."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    return x[perm[n_val + n_test :]], x[perm[:n_val]], x[perm[n_val : n_val + n_test]]


def _file_split_sizes(n: int, n_val: int, n_test: int, file: Path) -> tuple[int, int]:
    """Validation and test rows of a ``.npy`` plate of ``n`` rows: the asked counts, each capped at a quarter of it.

    The cap keeps at least half of a small file for training, so the defaults (2,000 each, sized for the made-in-code
    data) work on a file of any size instead of asking for more rows than it has, and it changes nothing on a file
    of at least 4·max(n_val, n_test) rows. At ``MIN_FILE_ROWS`` the quarter is 2, so val and test keep the energy
    distance's two points each.

    Example:
        >>> [_file_split_sizes(n, 2000, 2000, Path("p.npy")) for n in (10, 50, 500, 20_000)]
        [(2, 2), (12, 12), (125, 125), (2000, 2000)]
    """
    if n < MIN_FILE_ROWS:
        raise ValueError(
            f"{file} has {n} row(s); a .npy source/target needs at least {MIN_FILE_ROWS} to split into train/val/test"
        )
    for name, count in (("n_val", n_val), ("n_test", n_test)):
        if count < 2:
            raise ValueError(
                f"{name} = {count} is too few for {file}: validation and test need at least 2 rows each (the energy "
                "distance compares two samples); set it >= 2"
            )
    cap = n // 4
    return min(n_val, cap), min(n_test, cap)


def _load_npy(path: str) -> Tensor:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"No file at {file}. A vector source/target is one of {TOY_DISTRIBUTIONS} or a .npy file of shape (n, D) "
            "(numpy.save); it is split into train/val/test with the datamodule's seed."
        )
    x = np.load(file, allow_pickle=False)
    if x.ndim != 2:
        raise ValueError(f"{file} holds an array of shape {x.shape}; expected (n, D)")
    check_finite(x, file)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


class ToyPairDataModule(_PairDataModule):
    """Vector pairs: 2-D distributions made in code (the EFM card's experiment by default) or ``.npy`` files.

    A ``.npy`` plate is split at random (seeded by ``seed``) into validation, test and training rows. ``n_val`` and
    ``n_test`` are counts of rows, each capped at a quarter of the file's rows, so a small file keeps at least half
    for training (a 500-row file with the defaults splits 125/125/250); training gets the rest, whatever
    ``n_train`` says. A file needs at least ``MIN_FILE_ROWS`` (10) rows, and ``n_val`` and ``n_test`` at least 2.

    Args:
        source: the plate z = 0: a name of ``TOY_DISTRIBUTIONS`` or a ``.npy`` path of shape (n, D).
        target: the plate z = L, likewise.
        n_train: training samples per side of made-in-code data (a large pool stands in for fresh draws); a file's
            training split is the rows left after validation and test.
        n_val: validation samples per side (of a file: rows, capped at a quarter of it).
        n_test: test samples per side (the card evaluates on 2000 held-out samples; of a file: rows, capped at a
            quarter of it).
        batch_size: charges per plate per step (card: 1024).
        num_workers: DataLoader workers.
        seed: seed of the made-in-code samples and of file splits.

    Example:
        >>> dm = ToyPairDataModule(n_train=4096, batch_size=256)
        >>> dm.setup("fit")
        >>> p, q = next(iter(dm.train_dataloader()))
        >>> p.shape, q.shape
        (torch.Size([256, 2]), torch.Size([256, 2]))
    """

    def __init__(
        self,
        source: str = "gaussian",
        target: str = "two_modes",
        n_train: int = 65536,
        n_val: int = 2000,
        n_test: int = 2000,
        batch_size: int = 1024,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for spec in (source, target):
            if spec not in TOY_DISTRIBUTIONS and not spec.endswith(".npy"):
                raise ValueError(f"unknown toy distribution {spec!r}; choose one of {TOY_DISTRIBUTIONS} or a .npy path")
        self.save_hyperparameters()

    def _pools(self, spec: str, side: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hparams
        if spec.endswith(".npy"):
            x = _load_npy(spec)
            n_val, n_test = _file_split_sizes(len(x), hp.n_val, hp.n_test, Path(spec).expanduser())
            return _split(x, n_val, n_test, hp.seed + side)
        # One generator per side and split: the target's samples do not depend on the source's name.
        g = [torch.Generator().manual_seed(hp.seed * 1000 + 10 * side + k) for k in range(3)]
        return tuple(toy_distribution(spec, n, gen) for n, gen in zip((hp.n_train, hp.n_val, hp.n_test), g))

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        return (
            f"2-D pairs made in code: source `{hp.source}` -> target `{hp.target}`, {hp.n_train} training samples per "
            f"side, {hp.n_test} test samples, {hp.batch_size} charges per plate per step, seed {hp.seed}"
        )


_IMAGE_HELP = (
    "An image source/target is 'noise', 'digits' (scikit-learn's bundled 8x8 digits), 'digits:K' (class K only), "
    "'mnist'[:K] or 'cifar10'[:K] (torchvision folders under data_dir; download=true fetches them where a network "
    "exists) or 'folder:PATH' (an ImageFolder tree)."
)


class ImagePairDataModule(_PairDataModule):
    """Image pairs in [−1, 1]: noise → images (generation) or images → images (unpaired translation).

    The embedded default generates 8×8 digits from Gaussian noise. ``"digits:3"`` → ``"digits:2"`` is the small
    version of the paper's Colored-MNIST 3 → 2 translation; ``"mnist"``/``"cifar10"`` and ``"folder:PATH"`` are the
    real-data path (resized to ``image_size``; ``channels`` converts grey ↔ RGB).

    Args:
        source: the plate z = 0 (see above; ``"noise"`` draws N(0, I) images).
        target: the plate z = L.
        image_size: side of the square images (digits are 8×8 natively; other sizes are bilinear resizes).
        channels: 1 (grey) or 3 (RGB).
        data_dir: root of the torchvision datasets (``mnist``/``cifar10``).
        download: let torchvision download them (needs a network).
        n_noise: noise samples in the training pool (val/test noise match the other side's sizes).
        val_fraction: validation fraction of an image pool.
        test_fraction: test fraction of an image pool.
        batch_size: charges per plate per step.
        num_workers: DataLoader workers.
        seed: seed of the noise and of the splits.

    Example:
        >>> dm = ImagePairDataModule(batch_size=32)
        >>> dm.setup("fit")
        >>> noise, digits = next(iter(dm.train_dataloader()))
        >>> noise.shape, digits.shape, float(digits.min()) >= -1.0
        (torch.Size([32, 1, 8, 8]), torch.Size([32, 1, 8, 8]), True)
    """

    def __init__(
        self,
        source: str = "noise",
        target: str = "digits",
        image_size: int = 8,
        channels: int = 1,
        data_dir: str | None = None,
        download: bool = False,
        n_noise: int = 16384,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        for spec in (source, target):
            kind = spec.split(":", 1)[0]
            if kind not in ("noise", "digits", "mnist", "cifar10", "folder"):
                raise ValueError(f"unknown image source {spec!r}. {_IMAGE_HELP}")
        if source == target == "noise":
            raise ValueError("source and target are both 'noise': there is nothing to learn")
        self.save_hyperparameters()

    def _images(self, spec: str) -> Tensor:
        """All images of ``spec`` as float ``(n, C, H, W)`` in [−1, 1] at ``image_size``."""
        hp = self.hparams
        kind, _, arg = spec.partition(":")
        if arg and kind != "folder" and not arg.isdigit():
            raise ValueError(f"{spec!r}: the part after ':' must be a class index such as 'digits:3'. {_IMAGE_HELP}")
        label = int(arg) if arg and kind != "folder" else None
        if kind == "digits":
            from sklearn.datasets import load_digits

            data = load_digits()
            x = torch.from_numpy(data.images).float()[:, None] / 16.0  # values 0..16
            y = torch.from_numpy(data.target)
        elif kind in ("mnist", "cifar10"):
            x, y = self._torchvision(kind)
        else:
            x, y = self._folder(arg)
        if label is not None:
            x = x[y == label]
            if len(x) == 0:
                raise ValueError(f"{spec!r}: no images of class {label}")
        if x.shape[1] != hp.channels:
            x = x.mean(1, keepdim=True) if hp.channels == 1 else x.expand(-1, 3, -1, -1)
        if x.shape[-1] != hp.image_size or x.shape[-2] != hp.image_size:
            x = torch.nn.functional.interpolate(x, size=(hp.image_size, hp.image_size), mode="bilinear")
        return (x * 2 - 1).clamp(-1, 1).contiguous()

    def _torchvision(self, kind: str) -> tuple[Tensor, Tensor]:
        import torchvision

        hp = self.hparams
        if hp.data_dir is None:
            raise ValueError(f"{kind!r} needs data_dir, the folder torchvision keeps {kind.upper()} in. {_IMAGE_HELP}")
        cls = torchvision.datasets.MNIST if kind == "mnist" else torchvision.datasets.CIFAR10
        try:
            ds = cls(hp.data_dir, train=True, download=hp.download)
        except RuntimeError as err:
            raise FileNotFoundError(
                f"{kind.upper()} is not in {hp.data_dir}: {err}. Put the torchvision files there "
                f"(torchvision.datasets.{cls.__name__}(root, download=True) on a machine with a network) "
                "or set data.download=true."
            ) from err
        data = torch.as_tensor(np.asarray(ds.data)).float() / 255.0
        x = data[:, None] if data.ndim == 3 else data.permute(0, 3, 1, 2)
        return x, torch.as_tensor(np.asarray(ds.targets))

    def _folder(self, path: str) -> tuple[Tensor, Tensor]:
        import torchvision
        from torchvision.transforms import functional as TF

        root = Path(path).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"No image folder at {root}. {_IMAGE_HELP}")
        ds = torchvision.datasets.ImageFolder(str(root))
        size = self.hparams.image_size
        images = [TF.to_tensor(TF.resize(img.convert("RGB"), [size, size])) for img, _ in ds]
        return torch.stack(images), torch.as_tensor(ds.targets)

    def _pools(self, spec: str, side: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hparams
        if spec != "noise":
            images = self._images(spec)
            n = len(images)
            n_val, n_test = round(hp.val_fraction * n), round(hp.test_fraction * n)
            if min(n_val, n_test, n - n_val - n_test) < 2:
                raise ValueError(
                    f"{spec!r} has {n} images, too few to split into train/val/test with val_fraction "
                    f"{hp.val_fraction} and test_fraction {hp.test_fraction} (each split needs at least 2)"
                )
            return _split(images, n_val, n_test, hp.seed + side)
        other = self._pools(hp.target if side == 0 else hp.source, 1 - side)
        g = torch.Generator().manual_seed(hp.seed * 1000 + 10 * side)
        shape = (hp.channels, hp.image_size, hp.image_size)
        sizes = (hp.n_noise, len(other[1]), len(other[2]))
        return tuple(torch.randn(n, *shape, generator=g) for n in sizes)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        return (
            f"image pairs in [-1, 1]: source `{hp.source}` -> target `{hp.target}`, {hp.channels}x{hp.image_size}x"
            f"{hp.image_size}, test fraction {hp.test_fraction}, {hp.batch_size} charges per plate per step, "
            f"seed {hp.seed}"
        )
