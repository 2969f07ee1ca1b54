"""Tests of the RefCOCO / gRefCOCO reader: mask decoding of all three COCO formats, refs handling, loaders, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.datamodules.referring import ReferringSegmentationDataModule, decode_segmentation

mask_api = pytest.importorskip("pycocotools.mask")

H = W = 16  # square images, so size=16 keeps every pixel where it was drawn


def _rect(y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """The mask of rows y0..y1-1 and columns x0..x1-1."""
    m = np.zeros((H, W), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def _uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE: run lengths in column-major order, starting with a (possibly empty) run of zeros."""
    flat, counts, value, run = mask.flatten(order="F"), [], False, 0
    for pixel in flat:
        if pixel != value:
            counts.append(run)
            value, run = pixel, 0
        run += 1
    counts.append(run)
    return {"counts": counts, "size": list(mask.shape)}


def _compressed_rle(mask: np.ndarray) -> dict:
    rle = mask_api.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"counts": rle["counts"].decode("ascii"), "size": list(rle["size"])}


POLYGON = _rect(3, 10, 2, 8)  # the polygon below covers [2, 8) × [3, 10)
UNCOMPRESSED = _rect(1, 5, 9, 15)
COMPRESSED = _rect(11, 14, 0, 16) | _rect(0, 2, 0, 3)

ANNOTATIONS = [
    {"id": 11, "image_id": 1, "category_id": 1, "segmentation": [[2, 3, 8, 3, 8, 10, 2, 10]], "bbox": [2, 3, 6, 7]},
    {"id": 12, "image_id": 1, "category_id": 2, "segmentation": _uncompressed_rle(UNCOMPRESSED), "iscrowd": 1},
    {"id": 13, "image_id": 2, "category_id": 1, "segmentation": _compressed_rle(COMPRESSED), "iscrowd": 1},
]
REFS = [
    {"ref_id": 0, "image_id": 1, "ann_id": 11, "split": "val",
     "sentences": [{"sent": "the left dog", "sent_id": 0}, {"sent": "brown dog", "sent_id": 1}]},
    {"ref_id": 1, "image_id": 1, "ann_id": [12], "split": "val", "sentences": [{"sent": "the cat", "sent_id": 2}]},
    {"ref_id": 2, "image_id": 2, "ann_id": 13, "split": "testA", "sentences": [{"sent": "bottom dog", "sent_id": 3}]},
    {"ref_id": 3, "image_id": 1, "ann_id": [11, 12], "split": "testB",
     "sentences": [{"sent": "dog and cat", "sent_id": 4}]},
    {"ref_id": 4, "image_id": 2, "ann_id": [-1], "split": "testB", "sentences": [{"sent": "the horse", "sent_id": 5}]},
    {"ref_id": 5, "image_id": 1, "ann_id": [], "split": "testB", "sentences": [{"sent": "a zebra", "sent_id": 6}]},
]  # fmt: skip


def _write(root: Path, refs: list | None = None, annotations: list | None = None) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.jpg"):
        Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(root / "images" / name)
    coco = {
        "images": [{"id": 1, "file_name": "a.png", "height": H, "width": W},
                   {"id": 2, "file_name": "b.jpg", "height": H, "width": W}],
        "annotations": ANNOTATIONS if annotations is None else annotations,
        "categories": [{"id": 1, "name": "dog"}, {"id": 2, "name": "cat"}],
    }  # fmt: skip
    (root / "instances.json").write_text(json.dumps(coco))
    (root / "refs.json").write_text(json.dumps(REFS if refs is None else refs))
    return root


def _dm(root: Path, split: str = "val", size: int = H, **kwargs) -> ReferringSegmentationDataModule:
    dm = ReferringSegmentationDataModule(str(root), refs="refs.json", images="images", split=split, size=size, **kwargs)
    dm.setup("test")
    return dm


def _by_ref(dm: ReferringSegmentationDataModule) -> dict[int, dict]:
    return {item["ref_id"]: item for item in (dm.test_set[i] for i in range(len(dm.test_set)))}


def test_decode_all_three_formats_at_native_size():
    for ann, drawn in zip(ANNOTATIONS, (POLYGON, UNCOMPRESSED, COMPRESSED), strict=True):
        assert np.array_equal(decode_segmentation(ann["segmentation"], H, W), drawn)


def test_masks_through_the_datamodule(tmp_path):
    val, test_a = _by_ref(_dm(_write(tmp_path))), _by_ref(_dm(tmp_path, "testA"))
    assert torch.equal(val[0]["mask"], torch.from_numpy(POLYGON)) and val[0]["category"] == "dog"
    assert torch.equal(val[1]["mask"], torch.from_numpy(UNCOMPRESSED)) and val[1]["category"] == "cat"
    assert torch.equal(test_a[2]["mask"], torch.from_numpy(COMPRESSED))
    assert not any(item["no_target"] for item in (*val.values(), *test_a.values()))


def test_multi_target_union_and_no_target(tmp_path):
    items = _by_ref(_dm(_write(tmp_path), "testB"))
    assert torch.equal(items[3]["mask"], torch.from_numpy(POLYGON | UNCOMPRESSED))
    assert not items[3]["no_target"] and items[3]["category"] == "dog, cat"
    for ref_id in (4, 5):  # gRefCOCO writes no target as [-1] or []
        assert items[ref_id]["no_target"] and not items[ref_id]["mask"].any() and items[ref_id]["category"] == ""


def test_one_sample_per_sentence_and_split_filtering(tmp_path):
    dm = _dm(_write(tmp_path))
    samples = [dm.test_set[i] for i in range(len(dm.test_set))]
    assert [(s["ref_id"], s["expression"]) for s in samples] == [(0, "the left dog"), (0, "brown dog"), (1, "the cat")]
    assert sorted(_by_ref(_dm(tmp_path, "testB"))) == [3, 4, 5] and list(_by_ref(_dm(tmp_path, "testA"))) == [2]
    assert len(_dm(tmp_path, max_samples=2).test_set) == 2


def test_test_dataloader_batch(tmp_path):
    dm = _dm(_write(tmp_path), "testB", batch_size=3)
    dm_small = _dm(tmp_path, "testB", batch_size=3, size=8)
    for module, size in ((dm, H), (dm_small, 8)):
        for loader in (module.test_dataloader(), module.val_dataloader(), module.predict_dataloader()):
            batch = next(iter(loader))
            assert set(batch) == {"image", "mask", "expression", "ref_id", "no_target", "category"}
            assert batch["image"].shape == (3, 3, size, size) and batch["image"].dtype == torch.float32
            assert -1.0 <= batch["image"].min() and batch["image"].max() <= 1.0
            assert batch["mask"].shape == (3, size, size) and batch["mask"].dtype == torch.bool
            assert batch["ref_id"].tolist() == [3, 4, 5] and batch["ref_id"].dtype == torch.int64
            assert batch["no_target"].tolist() == [False, True, True] and batch["no_target"].dtype == torch.bool
            assert batch["expression"] == ["dog and cat", "the horse", "a zebra"]
            assert batch["category"] == ["dog, cat", "", ""]
    pixels = np.asarray(Image.open(tmp_path / "images" / "a.png"), dtype=np.float32) / 127.5 - 1
    assert torch.allclose(_by_ref(dm)[3]["image"], torch.from_numpy(pixels).permute(2, 0, 1))  # [-1, 1] mapping
    assert 0 < dm_small.test_set[0]["mask"].sum() < 64  # resized with nearest, still a strict part of the image


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No dataset folder at .*nowhere.*lichengunc/refer"):
        _dm(tmp_path / "nowhere")
    _write(tmp_path)
    (tmp_path / "instances.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"No COCO instances file at .*instances\.json.*henghuiding/gRefCOCO"):
        _dm(tmp_path)
    _write(tmp_path)
    (tmp_path / "refs.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"No refs file at .*refs\.json"):
        _dm(tmp_path)
    _write(tmp_path)
    (tmp_path / "images" / "a.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"No image at .*a\.png \(image_id 1\).*train2014"):
        _dm(tmp_path)


def test_bad_split_unknown_ann_and_size(tmp_path):
    _write(tmp_path)
    with pytest.raises(ValueError, match=r"split 'testa'.*Did you mean .*'testA'.*\['testA', 'testB', 'val'\]"):
        _dm(tmp_path, "testa")
    _write(tmp_path, refs=[{**REFS[3], "ann_id": [11, 99]}])
    with pytest.raises(KeyError, match=r"ref_id 3 names ann_id 99"):
        _dm(tmp_path, "testB")
    with pytest.raises(ValueError, match=r"size must be >= 8"):
        ReferringSegmentationDataModule(str(tmp_path), size=7)


def test_refuses_pickles_and_other_formats(tmp_path):
    for name in ("refs(unc).p", "refs.pkl"):
        with pytest.raises(ValueError, match=r"never unpickles.*pickle\.load\(open\('refs\(unc\)\.p','rb'\)\)"):
            ReferringSegmentationDataModule(str(tmp_path), refs=name)
    with pytest.raises(ValueError, match=r"expected a \.json refs file"):
        ReferringSegmentationDataModule(str(tmp_path), refs="refs.txt")


def test_training_free_and_setup_first(tmp_path):
    dm = ReferringSegmentationDataModule(str(tmp_path))
    with pytest.raises(RuntimeError, match="setup"):
        dm.test_dataloader()
    with pytest.raises(RuntimeError, match="training-free"):
        dm.train_dataloader()


def test_missing_pycocotools_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    monkeypatch.setitem(sys.modules, "pycocotools.mask", None)
    with pytest.raises(ImportError, match="pip install pycocotools"):
        _dm(_write(tmp_path))
