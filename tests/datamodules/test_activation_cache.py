"""Tests of ``datamodules.activation_cache``: shard layout, values against a direct forward, errors, atomic writes."""

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import open_clip
import pytest
import timm
import timm.data
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer
from torchvision.datasets import ImageFolder
from torchvision.transforms import ToTensor

from zoo.datamodules.activation_cache import build_activation_cache, read_cache_meta

# timm's own tiny test models (160x160 input) keep the file fast; pretrained=False needs no download.
VIT = "test_vit"  # 64 wide, 1 class token + 10x10 patches
CNN = "test_resnet"  # 96 channels, a 5x5 feature map
NUM_IMAGES = 6


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run this file's tiny models on one thread: on a busy 2-core machine OpenMP's waits cost seconds a build."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six random 40x40 RGB PNGs, three in each of two class folders (shared: no test writes there)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("images")
    for index in range(NUM_IMAGES):
        folder = root / f"class_{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    return root


def _load(out: Path) -> tuple[dict, np.ndarray]:
    meta = read_cache_meta(out)
    return meta, np.concatenate([np.load(out / name, mmap_mode="r") for name in meta["shards"]])


@functools.cache
def _reference(image_dir: Path, backbone: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The same randomly initialised model (seed 0) and its ``forward_features`` on the preprocessed images."""
    torch.manual_seed(0)
    model = timm.create_model(backbone, pretrained=False, num_classes=0).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    dataset = ImageFolder(image_dir, transform=transform)
    x = torch.stack([dataset[i][0] for i in range(len(dataset))])
    with torch.inference_mode():
        return model, model.forward_features(x)


def _build(image_dir: Path, out: Path, backbone: str = VIT, **kwargs) -> Path:
    torch.manual_seed(0)  # the same random weights as _reference
    return build_activation_cache(image_dir, out, backbone, pretrained=False, batch_size=4, **kwargs)


def test_build_activation_cache_writes_shards_that_match_meta(image_dir: Path, tmp_path: Path) -> None:
    """Check that a small shard_size gives several float16 (N_i, dim) shards whose rows add up to meta count."""
    out = _build(image_dir, tmp_path / "cache", shard_size=200)
    model, ref = _reference(image_dir, VIT)
    meta = json.loads((out / "meta.json").read_text())
    assert meta == read_cache_meta(out)
    assert meta["shards"] == [f"acts_{i:05d}.npy" for i in range(len(meta["shards"]))]
    assert len(meta["shards"]) >= 2
    shards = [np.load(out / name, mmap_mode="r") for name in meta["shards"]]
    assert all(shard.dtype == np.float16 and shard.shape[1] == meta["dim"] for shard in shards)
    assert [len(shard) for shard in shards[:-1]] == [200] * (len(shards) - 1)
    assert sum(len(shard) for shard in shards) == meta["count"]
    assert meta["dim"] == model.num_features == 64
    assert meta["count"] == NUM_IMAGES * ref.shape[1] == NUM_IMAGES * (model.num_prefix_tokens + 100)
    assert {k: meta[k] for k in ("backbone", "library", "pretrained", "tokens", "dtype", "images")} == {
        "backbone": VIT,
        "library": "timm",
        "pretrained": False,
        "tokens": "all",
        "dtype": "float16",
        "images": 6,
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the staging folder was renamed away


def test_build_activation_cache_rows_equal_forward_features(image_dir: Path, tmp_path: Path) -> None:
    """Check that the cached rows equal a direct forward_features on the same images, up to float16 rounding."""
    _, acts = _load(_build(image_dir, tmp_path / "cache", shard_size=200))
    _, ref = _reference(image_dir, VIT)
    np.testing.assert_allclose(acts.astype(np.float32), ref.reshape(-1, ref.shape[-1]).numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("tokens", ["cls", "mean"])
def test_build_activation_cache_keeps_one_row_per_image_for_pooled_policies(
    image_dir: Path, tmp_path: Path, tokens: str
) -> None:
    """Check that tokens='cls' keeps the class token and tokens='mean' the mean patch token, one row per image."""
    meta, acts = _load(_build(image_dir, tmp_path / "cache", tokens=tokens))
    _, ref = _reference(image_dir, VIT)
    expected = ref[:, 0] if tokens == "cls" else ref[:, 1:].mean(dim=1)  # test_vit has one prefix token
    assert meta["count"] == NUM_IMAGES and meta["tokens"] == tokens
    np.testing.assert_allclose(acts.astype(np.float32), expected.numpy(), rtol=2e-3, atol=2e-3)


def test_build_activation_cache_turns_cnn_positions_into_tokens(image_dir: Path, tmp_path: Path) -> None:
    """Check that a CNN's (B, C, H, W) feature map becomes H*W rows per image, channels last."""
    meta, acts = _load(_build(image_dir, tmp_path / "cache", backbone=CNN, shard_size=100))
    _, ref = _reference(image_dir, CNN)
    _, C, H, W = ref.shape
    assert (meta["dim"], meta["count"]) == (C, NUM_IMAGES * H * W) == (96, NUM_IMAGES * 5 * 5)
    np.testing.assert_allclose(
        acts.astype(np.float32), ref.permute(0, 2, 3, 1).reshape(-1, C).numpy(), rtol=2e-3, atol=2e-3
    )


def test_build_activation_cache_spreads_max_images_over_the_folder(image_dir: Path, tmp_path: Path) -> None:
    """Check that max_images reads that many images, spread over both classes rather than the first ones."""
    meta, acts = _load(_build(image_dir, tmp_path / "cache", tokens="cls", max_images=4))
    _, ref = _reference(image_dir, VIT)
    assert meta["images"] == 4 and acts.shape == (4, 64)
    np.testing.assert_allclose(acts.astype(np.float32), ref[[0, 1, 3, 4], 0].numpy(), rtol=2e-3, atol=2e-3)


def test_build_activation_cache_raises_when_cls_has_no_class_token(image_dir: Path, tmp_path: Path) -> None:
    """Check that tokens='cls' on a CNN fails before any work, instead of caching the first spatial position."""
    with pytest.raises(ValueError, match=f"needs a class token, but {CNN} has none"):
        _build(image_dir, tmp_path / "cache", backbone=CNN, tokens="cls")
    assert not (tmp_path / "cache").exists()


def test_build_activation_cache_reads_open_clip_tokens(image_dir: Path, tmp_path: Path) -> None:
    """Check that an open_clip ViT gives its patch tokens, tower-wide, one row each."""
    meta, acts = _load(
        build_activation_cache(
            image_dir, tmp_path / "cache", "ViT-S-32", library="open_clip", pretrained=False, batch_size=4
        )
    )
    assert (meta["library"], meta["dim"], meta["count"]) == ("open_clip", 384, NUM_IMAGES * 7 * 7)
    assert acts.shape == (NUM_IMAGES * 49, 384) and np.isfinite(acts).all()


def test_build_activation_cache_falls_back_to_open_clip_pooled_embedding(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check that an open_clip tower without token output (as RN50's) warns and gives one pooled row per image."""
    # A stand-in for RN50 (no `output_tokens`, pooled output only): the real one takes seconds to initialise.
    visual = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())  # (B, 3, H, W) -> (B, 3)

    def create_model_and_transforms(*args: object, **kwargs: object) -> tuple:
        return SimpleNamespace(visual=visual), None, ToTensor()

    monkeypatch.setattr(open_clip, "create_model_and_transforms", create_model_and_transforms)
    with pytest.warns(UserWarning, match="gives no tokens; caching its pooled embedding"):
        out = build_activation_cache(image_dir, tmp_path / "cache", "RN50", library="open_clip", pretrained=False)
    meta, acts = _load(out)
    assert (meta["dim"], meta["count"]) == (3, NUM_IMAGES) and acts.shape == (NUM_IMAGES, 3)


def test_build_activation_cache_raises_when_open_clip_gets_pretrained_true(image_dir: Path, tmp_path: Path) -> None:
    """Check that open_clip with pretrained=True asks for a weight tag and lists the known ones."""
    with pytest.raises(ValueError, match="needs a weight tag.*'openai'"):
        build_activation_cache(image_dir, tmp_path / "cache", "ViT-B-32", library="open_clip", pretrained=True)


@pytest.mark.parametrize("make", ["missing", "empty", "no_class_folder"])
def test_build_activation_cache_raises_when_image_dir_has_no_images(tmp_path: Path, make: str) -> None:
    """Check that a missing, empty or flat image_dir raises FileNotFoundError naming the ImageFolder layout."""
    image_dir = tmp_path / "images"
    if make == "empty":
        (image_dir / "cats").mkdir(parents=True)
    elif make == "no_class_folder":
        image_dir.mkdir()
        Image.new("RGB", (8, 8)).save(image_dir / "flat.png")
    with pytest.raises(FileNotFoundError, match=r"image_dir/<class>/<image>\.jpg.*ImageFolder"):
        build_activation_cache(image_dir, tmp_path / "cache", VIT, pretrained=False)


def test_build_activation_cache_suggests_close_timm_names(image_dir: Path, tmp_path: Path) -> None:
    """Check that an unknown timm name raises ValueError with the close match."""
    match = r"Unknown timm model 'vit_tiny_patch16_22'\. Did you mean 'vit_tiny_patch16_224'"
    with pytest.raises(ValueError, match=match):
        build_activation_cache(image_dir, tmp_path / "cache", "vit_tiny_patch16_22", pretrained=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"library": "hf"}, ValueError, "Unknown library 'hf': expected 'timm' or 'open_clip'"),
        ({"tokens": "patch"}, ValueError, "Unknown tokens policy 'patch'"),
        ({"shard_size": 0}, ValueError, "shard_size must be at least 1, got 0"),
        ({"pretrained": "augreg_in21k"}, TypeError, "timm takes pretrained=True or False"),
    ],
)
def test_build_activation_cache_rejects_bad_arguments(
    image_dir: Path, tmp_path: Path, kwargs: dict, error: type[Exception], match: str
) -> None:
    """Check that bad arguments fail up front with a message that names the value and the alternatives."""
    with pytest.raises(error, match=match):
        build_activation_cache(image_dir, tmp_path / "cache", VIT, **kwargs)


def test_build_activation_cache_leaves_nothing_when_interrupted(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check that a failure after shards were written leaves neither out_dir nor a temporary folder."""
    forward_features = VisionTransformer.forward_features
    calls = []

    def fail_after_first_batch(self: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        if len(calls) > 1:
            raise RuntimeError("interrupted")
        return forward_features(self, x)

    monkeypatch.setattr(VisionTransformer, "forward_features", fail_after_first_batch)
    parent = tmp_path / "caches"
    with pytest.raises(RuntimeError, match="interrupted"):
        _build(image_dir, parent / "vit", shard_size=100)  # the first batch (4 x 101 rows) fills 4 shards
    assert calls == [4, 2]
    assert not (parent / "vit").exists()
    assert list(parent.iterdir()) == []


def test_build_activation_cache_replaces_only_a_cache(image_dir: Path, tmp_path: Path) -> None:
    """Check that an older cache is replaced, but a folder of other files is refused with FileExistsError."""
    out = _build(image_dir, tmp_path / "cache", tokens="cls")
    _build(image_dir, out, tokens="mean")
    assert read_cache_meta(out)["tokens"] == "mean"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an activation cache; refusing to replace it"):
        _build(image_dir, other, tokens="cls")
    assert (other / "todo.txt").read_text() == "keep me"


def test_read_cache_meta_raises_when_meta_missing(tmp_path: Path) -> None:
    """Check that a folder without meta.json raises FileNotFoundError that says how to build a cache."""
    with pytest.raises(FileNotFoundError, match="meta.json is missing. Build one with build_activation_cache"):
        read_cache_meta(tmp_path)


def test_read_cache_meta_raises_when_cache_is_incomplete(image_dir: Path, tmp_path: Path) -> None:
    """Check that a missing shard, a missing key or a wrong count raise ValueError."""
    out = _build(image_dir, tmp_path / "cache", shard_size=2, tokens="cls")
    meta = read_cache_meta(out)
    (out / meta["shards"][-1]).unlink()
    with pytest.raises(ValueError, match=r"lacks the shard files \['acts_00002.npy'\]"):
        read_cache_meta(out)
    (out / "meta.json").write_text(json.dumps({**meta, "shards": meta["shards"][:-1]}))
    with pytest.raises(ValueError, match="hold 4 rows, but meta.json records count=6"):
        read_cache_meta(out)
    (out / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "dim"}))
    with pytest.raises(ValueError, match=r"lacks the keys \['dim'\]"):
        read_cache_meta(out)
