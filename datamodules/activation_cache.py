"""Build and read activation caches: a vision backbone's token activations, stored for sparse autoencoder training.

A cache is a folder::

    out_dir/
      meta.json         # backbone, library, pretrained, tokens, dim, count, dtype, shards, images
      acts_00000.npy    # float16, shape (N_0, dim)
      acts_00001.npy    # float16, shape (N_1, dim); N_0 + N_1 + ... == meta["count"]
      ...

Each row is one token of one image: images in ImageFolder order (classes, then files, sorted), the tokens of an
image in the backbone's order. Shards are plain ``.npy`` files, so a reader memory-maps them with
``np.load(path, mmap_mode="r")`` and never holds the whole cache in memory; ``read_cache_meta`` checks the folder
first. The folder is written through ``zoo.hub.staging`` (a hidden sibling renamed into place at the end), so an
interrupted build leaves nothing that looks like a valid cache.

Which rows an image gives (``tokens=``):

- ``"all"``: every token. timm ViTs: the prefix tokens (class, registers, distillation) then the patch tokens;
  timm CNNs: the ``H*W`` spatial positions of the last feature map, row-major; open_clip ViTs: the patch tokens of
  the visual tower (open_clip leaves the class token out of its token output).
- ``"cls"``: one row, the class token. For open_clip it is the pooled image embedding (for CLIP ViTs the class
  token after ``ln_post`` and the projection), so ``dim`` is the embedding width, not the tower width.
- ``"mean"``: one row, the mean of the patch tokens (prefix tokens left out, as timm's ``global_pool="avg"``).

open_clip towers without token output (``RN50``, timm towers) give their pooled embedding, one row per image.
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from zoo.hub import staging

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn
    from torchvision.datasets import ImageFolder

__all__ = ["build_activation_cache", "read_cache_meta"]

META = "meta.json"
SHARD = "acts_{:05d}.npy"
_META_KEYS = ("backbone", "library", "pretrained", "tokens", "dim", "count", "dtype", "shards", "images")
_LAYOUT = (
    "image_dir/<class>/<image>.jpg (the torchvision ImageFolder layout: one sub-folder per class, "
    "images inside; a single class folder is enough)"
)


def _check_arguments(
    library: str,
    pretrained: bool | str,
    tokens: str,
    batch_size: int,
    shard_size: int,
    max_images: int | None,
    num_workers: int,
) -> None:
    if library not in ("timm", "open_clip"):
        raise ValueError(
            f"Unknown library {library!r}: expected 'timm' or 'open_clip'. Use 'open_clip' for CLIP "
            "names such as 'ViT-B-32', 'timm' for timm names such as 'vit_small_patch16_224'."
        )
    if tokens not in ("all", "cls", "mean"):
        raise ValueError(
            f"Unknown tokens policy {tokens!r}: expected 'all' (every token), 'cls' (the class token) "
            "or 'mean' (the mean patch token)."
        )
    if library == "timm" and not isinstance(pretrained, bool):
        raise TypeError(
            f"timm takes pretrained=True or False, got {pretrained!r}. Put a weight tag in the name "
            "instead, e.g. backbone='vit_small_patch16_224.augreg_in21k'."
        )
    for name, value, low in (
        ("batch_size", batch_size, 1),
        ("shard_size", shard_size, 1),
        ("max_images", max_images, 1),
        ("num_workers", num_workers, 0),
    ):
        if value is not None and value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}.")


def _image_folder(image_dir: Path) -> ImageFolder:
    # Checked before torchvision is imported, so a wrong path fails at once.
    if not image_dir.is_dir():
        raise FileNotFoundError(
            f"No image folder at {image_dir}. build_activation_cache expects {_LAYOUT}. Point "
            "image_dir at the folder that holds the class sub-folders."
        )
    from torchvision.datasets import ImageFolder

    try:
        dataset = ImageFolder(image_dir, allow_empty=True)
    except FileNotFoundError as err:  # no class sub-folder at all
        reason = str(err)
    else:
        if len(dataset):
            return dataset
        reason = "its class folders hold no image files"
    raise FileNotFoundError(f"No images in {image_dir} ({reason}). build_activation_cache expects {_LAYOUT}.")


def _check_out_dir(out_dir: Path) -> None:
    # staging() replaces whatever sits at out_dir; only ever replace an older cache, never unrelated files.
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / META).is_file():
        raise FileExistsError(
            f"{out_dir} holds files but no {META}, so it is not an activation cache; refusing to "
            "replace it. Pick another out_dir, or empty that folder."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} is a file; out_dir must be a folder to create. Pick another out_dir.")


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _timm_backbone(backbone: str, pretrained: bool, tokens: str) -> tuple[nn.Module, Any]:
    import timm
    import timm.data

    if not timm.is_model(backbone):
        raise ValueError(
            f"Unknown timm model {backbone!r}.{_did_you_mean(backbone, timm.list_models())} Search "
            "with timm.list_models('*vit*'), or pass library='open_clip' for an open_clip name."
        )
    model = timm.create_model(backbone, pretrained=pretrained, num_classes=0)
    no_class_token = getattr(model, "has_class_token", True) is False or not getattr(model, "num_prefix_tokens", 0)
    if tokens == "cls" and no_class_token:  # CNNs, Mixers, "gap" ViTs: the first token would be a patch
        raise ValueError(f"tokens='cls' needs a class token, but {backbone} has none. Use tokens='mean' or 'all'.")
    config = timm.data.resolve_data_config({}, model=model)
    return model, timm.data.create_transform(**config)


def _timm_tokens(model: nn.Module, x: Tensor, tokens: str) -> Tensor:
    feats = model.forward_features(x)
    if feats.ndim == 4:  # a feature map: its spatial positions are the tokens
        fmt = getattr(model, "output_fmt", "NCHW")
        if str(getattr(fmt, "value", fmt)) != "NHWC":  # Swin and friends already give (B, H, W, C)
            feats = feats.permute(0, 2, 3, 1)
        feats, prefix = feats.flatten(1, 2), 0
    elif feats.ndim == 3:
        prefix = getattr(model, "num_prefix_tokens", 0) or 0
    else:
        raise ValueError(
            f"{type(model).__name__}.forward_features returned shape {tuple(feats.shape)}; expected "
            "(B, N, C) tokens or a (B, C, H, W) feature map. This backbone cannot be cached."
        )
    return _select(feats, tokens, prefix)


def _select(feats: Tensor, tokens: str, prefix: int) -> Tensor:
    """(B, N, C) tokens -> (B, T, C) rows kept by the ``tokens`` policy."""
    if tokens == "cls":
        return feats[:, :1]
    if tokens == "mean":
        return feats[:, prefix:].mean(dim=1, keepdim=True)
    return feats


def _open_clip_backbone(backbone: str, pretrained: bool | str, tokens: str) -> tuple[nn.Module, Any]:
    import open_clip

    if ":" not in backbone and backbone not in open_clip.list_models():  # "hf-hub:org/repo" names are not listed
        raise ValueError(
            f"Unknown open_clip model {backbone!r}.{_did_you_mean(backbone, open_clip.list_models())} "
            "See open_clip.list_models(), or pass library='timm' for a timm name."
        )
    if pretrained is True:
        tags = open_clip.list_pretrained_tags_by_model(backbone) if ":" not in backbone else []
        raise ValueError(
            f"open_clip needs a weight tag, got pretrained=True. Tags for {backbone}: {tags}. Pass one "
            "of them (e.g. pretrained='openai'), or pretrained=False for random weights."
        )
    model, _, preprocess = open_clip.create_model_and_transforms(backbone, pretrained=pretrained or None)
    visual = model.visual  # only the image tower is needed; the text tower is freed with `model`
    if hasattr(visual, "output_tokens"):
        visual.output_tokens = True
    elif tokens != "cls":
        warnings.warn(
            f"The visual tower of {backbone} ({type(visual).__name__}) gives no tokens; caching its pooled "
            f"embedding, one row per image, instead of tokens={tokens!r}.",
            stacklevel=3,
        )
    return visual, preprocess


def _open_clip_tokens(visual: nn.Module, x: Tensor, tokens: str) -> Tensor:
    out = visual(x)
    pooled, feats = out if isinstance(out, tuple) else (out, None)
    if tokens == "cls" or feats is None or feats.ndim != 3:
        return pooled[:, None]
    return _select(feats, tokens, prefix=0)  # open_clip's token output holds the patch tokens only


class _ShardWriter:
    """Collect float16 rows and write them as ``acts_XXXXX.npy`` files of ``shard_size`` rows (the last: fewer)."""

    def __init__(self, folder: Path, shard_size: int) -> None:
        self.folder, self.shard_size = folder, shard_size
        self.pending: list[np.ndarray] = []
        self.buffered = self.count = 0
        self.shards: list[str] = []
        self.warned = False

    def add(self, rows: np.ndarray) -> None:
        half = rows.astype(np.float16)
        if not self.warned and not np.isfinite(half).all():
            # float16 tops out at 65504: a backbone with huge activations would train an SAE on inf.
            warnings.warn("Some activations overflow float16 (|x| > 65504) and are stored as inf.", stacklevel=3)
            self.warned = True
        self.pending.append(half)
        self.buffered += len(half)
        while self.buffered >= self.shard_size:
            self._write(self.shard_size)

    def close(self) -> None:
        if self.buffered:
            self._write(self.buffered)

    def _write(self, n: int) -> None:
        rows = np.concatenate(self.pending)
        name = SHARD.format(len(self.shards))
        np.save(self.folder / name, rows[:n])
        self.shards.append(name)
        self.pending = [rows[n:]] if len(rows) > n else []
        self.buffered -= n
        self.count += n


def build_activation_cache(
    image_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    backbone: str,
    library: Literal["timm", "open_clip"] = "timm",
    pretrained: bool | str = True,
    tokens: Literal["all", "cls", "mean"] = "all",
    batch_size: int = 32,
    shard_size: int = 65536,
    max_images: int | None = None,
    device: str = "cpu",
    num_workers: int = 0,
) -> Path:
    """Run a vision backbone over a folder of images and store its token activations as a float16 cache.

    The rows are what a sparse autoencoder trains on: one per kept token, ``dim`` channels wide. The format is
    described in the module docstring; the model runs in eval mode under ``torch.inference_mode()``, with the
    library's own evaluation preprocessing.

    Args:
        image_dir: images in the torchvision ImageFolder layout, ``image_dir/<class>/<image>.jpg``.
        out_dir: the cache folder to create. An existing cache there is replaced once the new one is complete.
        backbone: a timm model name (``"vit_small_patch16_224"``, tags allowed) or, with ``library="open_clip"``,
            an open_clip name (``"ViT-B-32"``).
        library: which library builds ``backbone``.
        pretrained: timm: ``True`` for its default weights, ``False`` for random ones. open_clip: a weight tag
            (``"openai"``), or ``False`` for random weights.
        tokens: ``"all"`` tokens, the class token only (``"cls"``), or the mean patch token (``"mean"``).
        batch_size: images per forward pass.
        shard_size: rows per shard file (the last shard holds the rest).
        max_images: read only ``max_images`` images, spread evenly over the ImageFolder order so that every class
            is represented (all images when ``None``).
        device: where the backbone runs (``"cpu"``, ``"cuda"``); the cache is always written from CPU.
        num_workers: DataLoader workers decoding images.

    Returns:
        ``out_dir`` as a ``Path``; read it with ``read_cache_meta``.

    Raises:
        FileNotFoundError: ``image_dir`` is missing or holds no images in the expected layout.
        FileExistsError: ``out_dir`` holds files that are not an activation cache.
        ValueError: unknown ``library``, ``tokens`` or model name (with close matches), ``tokens="cls"`` for a
            model without a class token, ``pretrained=True`` with open_clip, or a size below its minimum.
        TypeError: a weight tag given as ``pretrained`` to timm.

    Example:
        >>> build_activation_cache("no/such/images", "acts", "vit_small_patch16_224")
        Traceback (most recent call last):
            ...
        FileNotFoundError: No image folder at no/such/images. build_activation_cache expects image_dir/<class>/...
        >>> out = build_activation_cache("images", "acts/vit_s16", "vit_small_patch16_224")  # doctest: +SKIP
        >>> meta = read_cache_meta(out)  # doctest: +SKIP
        >>> meta["dim"], meta["tokens"], meta["shards"][:1]  # doctest: +SKIP
        (384, 'all', ['acts_00000.npy'])
    """
    # torch and the backbone libraries load here: reading a cache (read_cache_meta) needs numpy only.
    import torch
    from torch.utils.data import DataLoader, Subset
    from tqdm import tqdm

    _check_arguments(library, pretrained, tokens, batch_size, shard_size, max_images, num_workers)
    dataset = _image_folder(Path(image_dir))
    out = Path(out_dir)
    _check_out_dir(out)
    if library == "timm":
        model, preprocess = _timm_backbone(backbone, pretrained, tokens)
        encode = _timm_tokens
    else:
        model, preprocess = _open_clip_backbone(backbone, pretrained, tokens)
        encode = _open_clip_tokens
    dataset.transform = preprocess
    images = len(dataset) if max_images is None else min(max_images, len(dataset))
    # Every (len / images)-th image rather than the first ones: ImageFolder sorts by class, so a prefix would
    # cover only the first few classes.
    subset = Subset(dataset, [i * len(dataset) // images for i in range(images)])
    loader = DataLoader(subset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    model.eval().to(device)

    with staging(out) as tmp, torch.inference_mode():
        writer = _ShardWriter(tmp, shard_size)
        dim = 0
        for x, _ in tqdm(loader, desc=f"Caching {backbone} activations", unit="batch"):
            acts = encode(model, x.to(device), tokens)  # (B, T, dim)
            dim = acts.shape[-1]
            writer.add(acts.reshape(-1, dim).float().cpu().numpy())
        writer.close()
        meta = {
            "backbone": backbone,
            "library": library,
            "pretrained": pretrained,
            "tokens": tokens,
            "dim": int(dim),
            "count": writer.count,
            "dtype": "float16",
            "shards": writer.shards,
            "images": images,
        }
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def read_cache_meta(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check ``meta.json`` of an activation cache folder.

    Every shard is opened memory-mapped (only its header is read) to check that it is ``(N_i, dim)`` of the
    recorded dtype and that the rows add up to ``count``.

    Args:
        path: the cache folder written by ``build_activation_cache``.

    Returns:
        The metadata: ``backbone``, ``library``, ``pretrained``, ``tokens``, ``dim``, ``count``, ``dtype``,
        ``shards`` (file names, in row order) and ``images``.

    Raises:
        FileNotFoundError: the folder has no ``meta.json``.
        ValueError: ``meta.json`` is corrupt or lacks keys, or the shards are missing or disagree with it.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> folder = Path(tmp.name)
        >>> np.save(folder / "acts_00000.npy", np.zeros((3, 4), dtype=np.float16))
        >>> meta = {"backbone": "toy", "library": "timm", "pretrained": False, "tokens": "cls", "dim": 4,
        ...         "count": 3, "dtype": "float16", "shards": ["acts_00000.npy"], "images": 3}
        >>> _ = (folder / "meta.json").write_text(json.dumps(meta))
        >>> meta = read_cache_meta(folder)
        >>> meta["count"], np.load(folder / meta["shards"][0], mmap_mode="r").shape
        (3, (3, 4))
        >>> tmp.cleanup()
    """
    folder = Path(path)
    file = folder / META
    if not file.is_file():
        raise FileNotFoundError(
            f"No activation cache at {folder}: {META} is missing. Build one with "
            f"build_activation_cache(image_dir, out_dir='{folder}', backbone=...)."
        )
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is corrupt ({err}). Delete {folder} and build the cache again.") from None
    missing = [key for key in _META_KEYS if key not in meta] if isinstance(meta, dict) else list(_META_KEYS)
    if missing:
        raise ValueError(
            f"{file} lacks the keys {missing} (expected {list(_META_KEYS)}). It was not written by "
            "build_activation_cache; build the cache again."
        )
    if not isinstance(meta["shards"], list) or not all(isinstance(name, str) for name in meta["shards"]):
        raise ValueError(
            f"{file} records shards={meta['shards']!r}; expected a list of file names. Build the cache again."
        )
    absent = [name for name in meta["shards"] if not (folder / name).is_file()]
    if absent:
        raise ValueError(
            f"{folder} lacks the shard files {absent} listed in {META}: the cache is incomplete. Build it again."
        )
    rows = 0
    for name in meta["shards"]:
        shard = np.load(folder / name, mmap_mode="r")
        if shard.ndim != 2 or shard.shape[1] != meta["dim"] or shard.dtype != np.dtype(meta["dtype"]):
            raise ValueError(
                f"{folder / name} is {shard.dtype} of shape {shard.shape}, but {META} records "
                f"{meta['dtype']} rows of width {meta['dim']}. Build the cache again."
            )
        rows += shard.shape[0]
    if rows != meta["count"]:
        raise ValueError(
            f"The shards of {folder} hold {rows} rows, but {META} records count={meta['count']}. Build the cache again."
        )
    return meta
