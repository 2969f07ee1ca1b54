"""RefCOCO / RefCOCO+ / RefCOCOg / gRefCOCO for open-set referring segmentation (Segment Anyword's real-data path).

Reads the refer toolkit's files as they are distributed, under one ``root``:

- a COCO ``instances.json``: ``images`` [{id, file_name, height, width}], ``annotations`` [{id, image_id,
  category_id, segmentation, ...}] and ``categories`` [{id, name}]; ``segmentation`` is a polygon list, an
  uncompressed RLE ({"counts": [ints], "size": [h, w]}) or a compressed RLE ({"counts": "str", "size": [h, w]}),
  all decoded with ``pycocotools.mask``;
- a refs file in JSON, gRefCOCO's ``grefs(unc).json`` layout: a list of {ref_id, image_id, ann_id (an int, or a
  list of ints, gRefCOCO's ``[-1]`` or ``[]`` meaning no target), split, sentences [{sent, sent_id}, ...]}.
  RefCOCO's own ``refs(unc).p`` is a pickle, which the zoo never loads (unpickling runs code from the file);
- the images, COCO ``train2014/``, read with PIL.

RefCOCO/+/g come from COCO train2014 images plus the refer toolkit's annotations (https://github.com/lichengunc/refer),
gRefCOCO from https://github.com/henghuiding/gRefCOCO. Segment Anyword is training-free: this DataModule serves only
evaluation splits.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning import LightningDataModule
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = ["ReferringDataset", "ReferringSegmentationDataModule", "collate_referring", "decode_segmentation"]

_SOURCES = ("RefCOCO/+/g need the COCO train2014 images and the refer toolkit's annotations "
            "(https://github.com/lichengunc/refer); gRefCOCO's grefs(unc).json and instances.json come from "
            "https://github.com/henghuiding/gRefCOCO")  # fmt: skip
_PICKLE_SUFFIXES = {".p", ".pkl", ".pickle"}


def _mask_api() -> Any:
    """``pycocotools.mask``, imported only when masks are decoded (the zoo does not need it otherwise)."""
    try:
        import pycocotools.mask as mask_api
    except ImportError as err:
        raise ImportError("ReferringSegmentationDataModule decodes COCO polygons and RLE masks with pycocotools: "
                          "pip install pycocotools") from err  # fmt: skip
    return mask_api


def decode_segmentation(segmentation: list | dict, height: int, width: int) -> np.ndarray:
    """A COCO ``segmentation`` (polygons, uncompressed or compressed RLE) as a bool mask ``(height, width)``.

    Polygons with fewer than three points are dropped: they cover no pixel, and pycocotools would read a
    four-number polygon as a box. Pixel (y, x) covers [x, x + 1) × [y, y + 1), COCO's convention.

    Example:
        >>> decode_segmentation([[1, 1, 4, 1, 4, 3, 1, 3]], 4, 5).astype(int)
        array([[0, 0, 0, 0, 0],
               [0, 1, 1, 1, 0],
               [0, 1, 1, 1, 0],
               [0, 0, 0, 0, 0]])
    """
    mask_api = _mask_api()
    if isinstance(segmentation, list):
        polygons = [p for p in segmentation if len(p) >= 6]
        if not polygons:
            return np.zeros((height, width), dtype=bool)
        rle = mask_api.merge(mask_api.frPyObjects(polygons, height, width))
    elif isinstance(segmentation.get("counts"), list):  # uncompressed RLE: compress it first
        rle = mask_api.frPyObjects(segmentation, *segmentation["size"])
    else:  # compressed RLE as stored in JSON (a str); pycocotools wants the bytes
        counts = segmentation["counts"]
        rle = {"size": segmentation["size"], "counts": counts.encode() if isinstance(counts, str) else counts}
    return mask_api.decode(rle).astype(bool)


def _ann_ids(ref: dict) -> list[int]:
    """The annotation ids a ref names; ``[]`` for gRefCOCO's no-target expressions (``[-1]`` or ``[]``)."""
    ids = ref["ann_id"] if isinstance(ref["ann_id"], list) else [ref["ann_id"]]
    return [int(i) for i in ids if int(i) != -1]


class ReferringDataset(Dataset):
    """One sample per (ref, sentence); the image is read and the masks decoded when a sample is asked for.

    Items: ``image`` (3, S, S) float32 in [-1, 1], ``mask`` (S, S) bool, ``expression`` str, ``ref_id`` int,
    ``no_target`` bool, ``category`` str (see :class:`ReferringSegmentationDataModule`).
    """

    def __init__(self, samples: list[tuple[dict, str]], images: dict[int, dict], anns: dict[int, dict],
                 categories: dict[int, str], image_dir: Path, size: int) -> None:  # fmt: skip
        self.samples, self.images, self.anns, self.categories = samples, images, anns, categories
        self.image_dir, self.size = image_dir, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        ref, expression = self.samples[index]
        info, size = self.images[int(ref["image_id"])], self.size
        with Image.open(self.image_dir / info["file_name"]) as img:  # COCO has greyscale images: force RGB
            rgb = np.asarray(img.convert("RGB").resize((size, size), Image.BILINEAR), dtype=np.float32)
        union = np.zeros((info["height"], info["width"]), dtype=bool)
        anns = [self.anns[i] for i in _ann_ids(ref)]
        for ann in anns:
            mask = decode_segmentation(ann["segmentation"], info["height"], info["width"])
            if mask.shape != union.shape:
                raise ValueError(f"annotation {ann['id']} has a {mask.shape} mask but image {ref['image_id']} is "
                                 f"{union.shape} in instances.json; the files do not belong together.")  # fmt: skip
            union |= mask
        mask = Image.fromarray(union.astype(np.uint8) * 255).resize((size, size), Image.NEAREST)
        names = dict.fromkeys(self.categories.get(a["category_id"], "") for a in anns)  # unique, in order
        return {
            "image": torch.from_numpy(rgb).permute(2, 0, 1) / 127.5 - 1.0,
            "mask": torch.from_numpy(np.asarray(mask) > 127),
            "expression": expression,
            "ref_id": int(ref["ref_id"]),
            "no_target": not anns,
            "category": ", ".join(names),
        }


def collate_referring(items: list[dict[str, Any]]) -> dict[str, Tensor | list[str]]:
    """Stack ``image``, ``mask``, ``ref_id`` (int64) and ``no_target`` (bool); list ``expression`` and ``category``."""
    return {
        "image": torch.stack([it["image"] for it in items]),
        "mask": torch.stack([it["mask"] for it in items]),
        "expression": [it["expression"] for it in items],
        "ref_id": torch.tensor([it["ref_id"] for it in items], dtype=torch.long),
        "no_target": torch.tensor([it["no_target"] for it in items], dtype=torch.bool),
        "category": [it["category"] for it in items],
    }


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"No {what} at {path}. {_SOURCES}.")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class ReferringSegmentationDataModule(LightningDataModule):
    """Referring expressions with their target masks, for evaluating open-set referring segmentation.

    ``setup`` keeps the refs of ``split`` and makes one sample per (ref, sentence), in file order; val, test and
    predict loaders all serve it (Segment Anyword is training-free, so there is no training loader). Images are
    resized to ``size`` × ``size`` with PIL bilinear, *not keeping the aspect ratio*, and mapped to [-1, 1]; the
    target mask is the union of the ref's annotation masks (all False for a gRefCOCO no-target ref), resized with
    nearest. Score at native resolution by resizing predictions back if the benchmark asks for it. Batches:
    ``image`` (B, 3, S, S) float32, ``mask`` (B, S, S) bool, ``ref_id`` (B,) int64, ``no_target`` (B,) bool,
    ``expression`` and ``category`` lists of B str (category: the names of the ref's annotations' categories joined
    by ", ", "" for no target).

    Args:
        root: the dataset folder; ``refs``, ``instances`` and ``images`` are relative to it unless absolute.
        refs: the refs file in JSON (``refs(unc).json``, ``grefs(unc).json``); pickles are refused.
        instances: the COCO ``instances.json`` of the refer toolkit's release.
        images: the image folder (COCO ``train2014/``).
        split: the refs' ``split`` to serve (``val``, ``testA``, ``testB``, ``test``, ...).
        size: output image side S in pixels, ``>= 8``.
        max_samples: keep the first this many samples (None: all).
        batch_size: samples per batch.
        num_workers: DataLoader workers.

    Example:
        >>> import json, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     Image.new("RGB", (30, 20), (255, 0, 0)).save(f"{tmp}/a.png")  # 20 rows × 30 columns
        ...     _ = Path(tmp, "instances.json").write_text(json.dumps({
        ...         "images": [{"id": 1, "file_name": "a.png", "height": 20, "width": 30}],
        ...         "annotations": [{"id": 5, "image_id": 1, "category_id": 3, "bbox": [2, 2, 10, 8],
        ...                          "segmentation": [[2, 2, 12, 2, 12, 10, 2, 10]]}],
        ...         "categories": [{"id": 3, "name": "cat"}]}))
        ...     _ = Path(tmp, "refs.json").write_text(json.dumps([{"ref_id": 0, "image_id": 1, "ann_id": 5,
        ...         "split": "val", "sentences": [{"sent": "the cat", "sent_id": 0}, {"sent": "red", "sent_id": 1}]}]))
        ...     dm = ReferringSegmentationDataModule(tmp, refs="refs.json", images=".", size=16)
        ...     dm.setup("test")
        ...     item = dm.test_set[1]
        >>> len(dm.test_set), item["image"].shape, item["mask"].shape, item["expression"], item["category"]
        (2, torch.Size([3, 16, 16]), torch.Size([16, 16]), 'red', 'cat')
    """

    def __init__(self, root: str, refs: str = "refs(unc).json", instances: str = "instances.json",
                 images: str = "images/train2014", split: str = "val", size: int = 512,
                 max_samples: int | None = None, batch_size: int = 1, num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        if Path(refs).suffix.lower() in _PICKLE_SUFFIXES:
            raise ValueError(
                f"refs={refs!r} is a pickle; the zoo never unpickles data files (loading one runs any code it holds). "
                'Convert it to JSON yourself, at your own risk, e.g. python -c "import pickle, json; '
                "json.dump(pickle.load(open('refs(unc).p','rb')), open('refs(unc).json','w'))\", then pass "
                "refs='refs(unc).json'."
            )
        if Path(refs).suffix.lower() != ".json":
            raise ValueError(f"refs={refs!r}: expected a .json refs file (e.g. grefs(unc).json).")
        if size < 8:
            raise ValueError(f"size must be >= 8 pixels, got {size}.")
        if (max_samples is not None and max_samples < 1) or batch_size < 1 or num_workers < 0:
            raise ValueError(f"need max_samples >= 1 (or None), batch_size >= 1 and num_workers >= 0, got "
                             f"{max_samples}, {batch_size}, {num_workers}.")  # fmt: skip
        self.save_hyperparameters()
        self.val_set: ReferringDataset | None = None
        self.test_set: ReferringDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.test_set is not None:
            return
        hp = self.hparams
        root = Path(hp.root)
        if not root.is_dir():
            raise FileNotFoundError(f"No dataset folder at {root}. {_SOURCES}.")
        _mask_api()  # fail now, not at the first batch
        coco = _read_json(root / hp.instances, "COCO instances file")
        refs = _read_json(root / hp.refs, "refs file")
        if not isinstance(refs, list):
            raise TypeError(f"{root / hp.refs} should hold a JSON list of refs (the grefs(unc).json layout).")
        present = sorted({str(r["split"]) for r in refs})
        chosen = [r for r in refs if r["split"] == hp.split]
        if not chosen:
            close = difflib.get_close_matches(hp.split, present, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"no refs of split {hp.split!r} in {root / hp.refs}.{hint} Splits present: {present}.")
        images = {int(im["id"]): im for im in coco["images"]}
        anns = {int(a["id"]): a for a in coco["annotations"]}
        categories = {int(c["id"]): str(c["name"]) for c in coco["categories"]}
        for ref in chosen:  # check every id now: a wrong file pairing should not surface mid-evaluation
            missing = [i for i in _ann_ids(ref) if i not in anns]
            if missing:
                raise KeyError(f"ref_id {ref['ref_id']} names ann_id {missing[0]}, which is not in "
                               f"{root / hp.instances}; the refs and instances files do not match.")  # fmt: skip
            if int(ref["image_id"]) not in images:
                raise KeyError(f"ref_id {ref['ref_id']} names image_id {ref['image_id']}, which is not in "
                               f"{root / hp.instances}.")  # fmt: skip
        samples = [(ref, str(s.get("sent", s.get("raw", "")))) for ref in chosen for s in ref["sentences"]]
        samples = samples[: hp.max_samples]
        image_dir = root / hp.images
        for image_id in dict.fromkeys(int(ref["image_id"]) for ref, _ in samples):
            path = image_dir / images[image_id]["file_name"]
            if not path.is_file():
                raise FileNotFoundError(f"No image at {path} (image_id {image_id}). {_SOURCES}.")
        self.val_set = self.test_set = ReferringDataset(samples, images, anns, categories, image_dir, hp.size)

    def _loader(self, dataset: ReferringDataset | None) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for a dataloader.")
        hp = self.hparams
        return DataLoader(dataset, batch_size=hp.batch_size, shuffle=False, collate_fn=collate_referring,
                          num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        raise RuntimeError("ReferringSegmentationDataModule has no training split: Segment Anyword is training-free "
                           "(a pretrained diffusion model). Use trainer.validate or trainer.test.")  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def describe(self) -> str:
        """One line for model cards."""
        hp, n = self.hparams, len(self.test_set) if self.test_set is not None else "?"
        return (f"referring segmentation from {Path(hp.root) / hp.refs}, split {hp.split!r}: {n} (ref, sentence) "
                f"samples, images resized to {hp.size}×{hp.size} (aspect not kept)")  # fmt: skip
