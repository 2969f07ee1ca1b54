"""Captioned shapes: the tokenizer, the scenes against their captions, hard scenes, speed and the DataModule."""

from __future__ import annotations

import re
import time

import pytest
import torch

from zoo.datamodules.shapes import (
    COLOURS,
    MAX_TOKENS,
    PALETTE,
    SHAPES,
    VOCAB,
    CaptionedShapesDataModule,
    ShapeTokenizer,
    captioned_shapes,
)

_PHRASE = r"a (\w+) (\w+)"
_GRAMMAR = re.compile(rf"^{_PHRASE}(?: (and|left of) {_PHRASE})?$")


@pytest.fixture(scope="module")
def scenes() -> dict:
    return captioned_shapes(600, seed=7, hard_fraction=0.3)


def _classify(mask: torch.Tensor) -> str:
    """The shape of one object mask, from its rows: a full box is a square, a narrower top row a triangle."""
    ys, xs = mask.nonzero().T
    box = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    if box.all():
        return "square"
    widths = box.sum(1)
    return "triangle" if widths[0] < widths[-1] else "circle"


def _colour(image: torch.Tensor, mask: torch.Tensor) -> str:
    """The palette colour nearest to the mean pixel of ``mask`` in ``image`` (3, S, S)."""
    mean = image[:, mask].mean(1)
    return min(COLOURS, key=lambda c: float((mean - torch.tensor(PALETTE[c])).norm()))


def _parse(caption: str) -> tuple[list[tuple[str, str]], str | None]:
    """The (colour, shape) of each phrase of a grammar caption and its connector (None for one phrase)."""
    match = _GRAMMAR.match(caption)
    assert match, f"caption {caption!r} is not in the grammar"
    c0, s0, connector, c1, s1 = match.groups()
    return ([(c0, s0)] + ([(c1, s1)] if connector else [])), connector


# ------------------------------------------------------------------------------------------------ the tokenizer
def test_shape_tokenizer_round_trips_every_caption_form() -> None:
    """Check that encode then decode gives back each grammar form, with BOS, word ids, EOS, then PAD."""
    tok = ShapeTokenizer()
    assert tok.vocab_size == len(VOCAB) == 14 and VOCAB[:3] == ("<pad>", "<bos>", "<eos>")
    for caption in ("a red circle", "a blue square and a green triangle", "a yellow circle left of a red circle"):
        ids = tok.encode(caption)
        assert ids.shape == (MAX_TOKENS,) and ids.dtype == torch.long
        words = caption.split()
        assert ids[0] == tok.bos_id and ids[len(words) + 1] == tok.eos_id
        assert (ids[len(words) + 2 :] == tok.pad_id).all()
        assert tok.decode(ids) == caption and tok.decode(ids.tolist()) == caption
    assert tok.encode("a red circle", max_length=6).tolist() == [1, 3, 7, 11, 2, 0]


def test_shape_tokenizer_word_positions_point_at_the_words() -> None:
    """Check that word i sits at token i + 1: the ids at word_positions are the words' vocabulary ids."""
    tok = ShapeTokenizer()
    caption = "a green triangle left of a blue triangle"
    positions = tok.word_positions(caption)
    assert positions == list(range(1, 9))
    ids = tok.encode(caption)
    assert [VOCAB[i] for i in ids[positions].tolist()] == caption.split()


def test_shape_tokenizer_rejects_unknown_words_and_long_captions() -> None:
    """Check that an unknown word is named with the vocabulary, and a caption too long for max_length is refused."""
    tok = ShapeTokenizer()
    with pytest.raises(ValueError, match=r"Unknown word 'purple'.*'circle'"):
        tok.encode("a purple circle")
    with pytest.raises(ValueError, match="Unknown word 'Red'"):
        tok.word_positions("a Red circle")
    with pytest.raises(ValueError, match="Unknown word '<pad>'"):
        tok.encode("a <pad> circle")
    with pytest.raises(ValueError, match="needs 10 tokens, more than max_length=9"):
        tok.encode("a red circle left of a blue circle", max_length=9)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([1, 99, 2])


# ------------------------------------------------------------------------------------------------ the scenes
def test_captioned_shapes_returns_documented_shapes_and_dtypes(scenes: dict) -> None:
    """Check every key's shape and dtype, images within [-1, 1], and -1 rows exactly for one-phrase captions."""
    n = 600
    expected = {"image": ((n, 3, 16, 16), torch.float32), "tokens": ((n, 10), torch.int64),
                "masks": ((n, 3, 16, 16), torch.bool), "phrase_tokens": ((n, 2, 2), torch.int64),
                "phrase_object": ((n, 2), torch.int64), "phrase_class": ((n, 2), torch.int64),
                "hard": ((n,), torch.bool)}  # fmt: skip
    for key, (shape, dtype) in expected.items():
        assert tuple(scenes[key].shape) == shape and scenes[key].dtype == dtype, key
    assert len(scenes["caption"]) == n and all(isinstance(c, str) for c in scenes["caption"])
    assert scenes["image"].min() >= -1 and scenes["image"].max() <= 1
    one = scenes["phrase_object"][:, 1] < 0
    assert (scenes["phrase_tokens"][one, 1] == -1).all() and (scenes["phrase_class"][one, 1] == -1).all()
    assert (scenes["phrase_tokens"][~one] >= 0).all() and (scenes["phrase_object"][:, 0] >= 0).all()
    assert 0 < int(one.sum()) < n


def test_captioned_shapes_captions_parse_back_to_the_scene(scenes: dict) -> None:
    """Check that each named phrase's colour and shape are the colour and shape of its object's pixels."""
    tok = ShapeTokenizer()
    forms = set()
    for i, caption in enumerate(scenes["caption"]):
        phrases, connector = _parse(caption)
        forms.add(connector)
        assert tok.decode(scenes["tokens"][i]) == caption
        for p, (colour, shape) in enumerate(phrases):
            words = [VOCAB[int(t)] for t in scenes["tokens"][i, scenes["phrase_tokens"][i, p]]]
            assert words == [colour, shape], (i, caption)
            mask = scenes["masks"][i, int(scenes["phrase_object"][i, p])]
            assert mask.sum() >= 9, caption
            assert _classify(mask) == shape and _colour(scenes["image"][i], mask) == colour, (i, caption)
            assert SHAPES[int(scenes["phrase_class"][i, p])] == shape
        # every present object is either named or an unnamed distractor that no phrase could mean
        named = set(scenes["phrase_object"][i].tolist()) - {-1}
        for j in range(3):
            mask = scenes["masks"][i, j]
            if j not in named and mask.any():
                assert (_colour(scenes["image"][i], mask), _classify(mask)) not in phrases, (i, caption)
    assert forms == {None, "and", "left of"}


def test_captioned_shapes_objects_do_not_overlap(scenes: dict) -> None:
    """Check that no two object masks overlap or touch (8-neighbourhood) and each scene has 1-3 objects."""
    masks = scenes["masks"].float()
    grown = torch.nn.functional.max_pool2d(masks, 3, stride=1, padding=1).bool()
    for a in range(3):
        for b in range(3):
            if a != b:
                assert not (grown[:, a] & scenes["masks"][:, b]).any()
    counts = scenes["masks"].flatten(2).any(2).sum(1)
    assert counts.min() == 1 and counts.max() == 3
    assert set(counts.tolist()) == {1, 2, 3}


def test_captioned_shapes_hard_scenes_name_two_same_shape_objects_of_different_colours(scenes: dict) -> None:
    """Check that hard scenes name two objects of one shape and two colours, and easy scenes never share a shape."""
    hard = scenes["hard"]
    assert int(hard.sum()) == round(0.3 * 600)
    for i in range(len(hard)):
        phrases, _ = _parse(scenes["caption"][i])
        present = [j for j in range(3) if scenes["masks"][i, j].any()]
        shapes = [_classify(scenes["masks"][i, j]) for j in present]
        if hard[i]:
            assert len(phrases) == 2 and phrases[0][1] == phrases[1][1] and phrases[0][0] != phrases[1][0]
            assert scenes["phrase_class"][i, 0] == scenes["phrase_class"][i, 1]
        else:
            assert len(set(shapes)) == len(shapes), scenes["caption"][i]


def test_captioned_shapes_left_of_is_true_geometrically(scenes: dict) -> None:
    """Check that in every "left of" caption the first phrase's object has its centroid left of the second's."""
    checked = 0
    xs = torch.arange(16.0)
    for i, caption in enumerate(scenes["caption"]):
        if " left of " in caption:
            a, b = (scenes["masks"][i, int(o)].float() for o in scenes["phrase_object"][i])
            assert (a.sum(0) @ xs) / a.sum() < (b.sum(0) @ xs) / b.sum(), caption
            checked += 1
    assert checked > 50
    assert (scenes["phrase_object"][:, 0] == 1).any()  # the left object is named first, whichever slot it has


def test_captioned_shapes_is_deterministic() -> None:
    """Check that a seed gives the same scenes every time and another seed other scenes."""
    first, again, other = (captioned_shapes(50, seed=s, hard_fraction=0.5) for s in (3, 3, 4))
    for key in first:
        assert first[key] == again[key] if key == "caption" else torch.equal(first[key], again[key]), key
    assert not torch.equal(first["image"], other["image"])


def test_captioned_shapes_generates_8000_scenes_in_under_3_seconds() -> None:
    """Check that the training split's 8,000 scenes take less than 3 s (measured about 1 s on one thread)."""
    captioned_shapes(10)  # warm up
    start = time.perf_counter()
    data = captioned_shapes(8000, seed=0, hard_fraction=0.2)
    assert time.perf_counter() - start < 3.0
    assert len(data["caption"]) == 8000


def test_captioned_shapes_scales_objects_with_size() -> None:
    """Check that at 32 px the objects are about twice as wide (radius 4-8) and the captions still match."""
    data = captioned_shapes(100, size=32, seed=1, hard_fraction=0.5)
    assert data["image"].shape == (100, 3, 32, 32)
    widths = [int(m.any(0).sum()) for m in data["masks"].flatten(0, 1) if m.any()]
    assert min(widths) >= 9 and max(widths) == 17
    for i in range(100):
        for p, (colour, shape) in enumerate(_parse(data["caption"][i])[0]):
            mask = data["masks"][i, int(data["phrase_object"][i, p])]
            assert _classify(mask) == shape and _colour(data["image"][i], mask) == colour


def test_captioned_shapes_rejects_bad_arguments() -> None:
    """Check the messages for a negative n, a size below 16 and a hard fraction outside [0, 1]; n = 0 is fine."""
    with pytest.raises(ValueError, match="n is a number of scenes"):
        captioned_shapes(-1)
    with pytest.raises(ValueError, match="size must be an int >= 16"):
        captioned_shapes(4, size=8)
    with pytest.raises(ValueError, match=r"hard_fraction .* got 1.5"):
        captioned_shapes(4, hard_fraction=1.5)
    with pytest.raises(ValueError, match=r"shared_colour_fraction .* \[0, 0.4\] with hard_fraction=0.6, got 0.5"):
        captioned_shapes(4, hard_fraction=0.6, shared_colour_fraction=0.5)
    empty = captioned_shapes(0)
    assert empty["tokens"].shape == (0, 10) and empty["caption"] == []


# ------------------------------------------------------------------------------------------------ the DataModule
def test_captioned_shapes_datamodule_batches_have_documented_keys_and_shapes() -> None:
    """Check the batch keys and shapes, captions kept per split in loader order, and the hard counts per split."""
    dm = CaptionedShapesDataModule(n_train=40, n_val=20, n_test=30, batch_size=8, hard_fraction_train=0.25)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    shapes = {"image": (8, 3, 16, 16), "tokens": (8, 10), "masks": (8, 3, 16, 16), "phrase_tokens": (8, 2, 2),
              "phrase_object": (8, 2), "phrase_class": (8, 2), "hard": (8,), "shared_colour": (8,)}  # fmt: skip
    assert {k: tuple(v.shape) for k, v in batch.items()} == shapes
    tok = dm.tokenizer
    test_tokens = torch.cat([b["tokens"] for b in dm.test_dataloader()])
    assert [tok.decode(t) for t in test_tokens] == dm.captions["test"]
    assert {k: len(v) for k, v in dm.captions.items()} == {"train": 40, "val": 20, "test": 30}
    sets = {"train": dm.train_set, "val": dm.val_set, "test": dm.test_set}
    hard = {name: int(s.data["hard"].sum()) for name, s in sets.items()}
    assert hard == {"train": 10, "val": 10, "test": 15}
    assert dm.vocab_size == 14 and dm.max_length == 10 and dm.num_classes == 3


def test_captioned_shapes_datamodule_splits_use_their_own_seeds() -> None:
    """Check that the splits are generated with seeds 1000·seed + 0/1/2 and differ from one another."""
    dm = CaptionedShapesDataModule(n_train=16, n_val=16, n_test=16, seed=2, hard_fraction_train=0.5)
    dm.setup()
    assert [dm.split_seed(s) for s in ("train", "val", "test")] == [2000, 2001, 2002]
    expected = captioned_shapes(16, seed=2002, hard_fraction=0.5)
    assert torch.equal(dm.test_set.data["image"], expected["image"]) and dm.captions["test"] == expected["caption"]
    assert not torch.equal(dm.train_set.data["image"], dm.val_set.data["image"])
    line = dm.describe()
    assert "\n" not in line and "seeds 2000/2001/2002" in line and "16×16" in line


def test_captioned_shapes_datamodule_rejects_bad_arguments() -> None:
    """Check that sizes, counts and fractions out of range fail in __init__ with the value in the message."""
    with pytest.raises(ValueError, match="size must be >= 16"):
        CaptionedShapesDataModule(size=12)
    with pytest.raises(ValueError, match="n_test=0"):
        CaptionedShapesDataModule(n_test=0)
    with pytest.raises(ValueError, match="hard_fraction_train .* got -0.1"):
        CaptionedShapesDataModule(hard_fraction_train=-0.1)
    with pytest.raises(ValueError, match=r"shared_colour_fraction_test must be in .* got 0.8"):
        CaptionedShapesDataModule(hard_fraction_test=0.25, shared_colour_fraction_test=0.8)
