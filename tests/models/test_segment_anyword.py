"""Segment Anyword: the parsers, the prompt and point logic, the refiners (the random walker, a tiny SAM and a fake SAM
predictor), the pipeline over the toy model, bad input, and the reproduction's claims. The real path (tiny Stable
Diffusion and CompVis LDM pipelines) is tested in test_segment_anyword_real.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.models.segment_anyword import (
    RandomWalkerRefiner,
    RuleParser,
    SamRefiner,
    SegmentAnyword,
    SegmentAnywordPipeline,
    SpacyParser,
    largest_component,
    sample_points,
)

COLOURS, SHAPES = ("red", "green", "blue", "yellow"), ("circle", "square", "triangle")


def test_rule_parser_finds_each_phrase_with_its_adjective() -> None:
    parse = RuleParser(SHAPES, COLOURS)
    phrases = parse("a red circle and a blue circle")
    assert [(p.noun, p.modifiers) for p in phrases] == [(2, (1,)), (6, (5,))]
    assert [p.text for p in parse("a green triangle")] == ["green triangle"]
    assert parse("a and of") == []


def test_spacy_parser_maps_noun_chunks_to_whitespace_words() -> None:
    # A parsed spaCy Doc built by hand (no English model can be downloaded here): the real Doc / noun_chunks path.
    spacy = pytest.importorskip("spacy")
    from spacy.tokens import Doc

    vocab = spacy.blank("en").vocab
    words = ["a", "dark", "red", "circle", "left", "of", "a", "blue", "square", ","]
    parsed = Doc(vocab, words=words, spaces=[True] * 8 + [False, False], heads=[3, 3, 3, 3, 3, 4, 8, 8, 5, 3],
                 deps=["det", "amod", "amod", "ROOT", "advmod", "prep", "det", "amod", "pobj", "punct"],
                 pos=["DET", "ADJ", "ADJ", "NOUN", "ADV", "ADP", "DET", "ADJ", "NOUN", "PUNCT"])  # fmt: skip
    phrases = SpacyParser(lambda text: parsed)(parsed.text)
    # "square," is one whitespace word: spaCy's separate "," token must not shift the indices
    assert [(p.noun, p.modifiers, p.text) for p in phrases] == [(3, (1, 2), "a dark red circle"),
                                                               (8, (7,), "a blue square")]  # fmt: skip
    with pytest.raises(OSError, match=r"spacy download .* Offline, use RuleParser\(nouns, adjectives\)"):
        SpacyParser("en_core_web_nonexistent_model")


def test_largest_component_and_farthest_points() -> None:
    m = torch.zeros(8, 8, dtype=torch.bool)
    m[0:2, 0:2] = True  # 4 cells
    m[4:7, 4:7] = True  # 9 cells: the largest
    comp = largest_component(m)
    assert int(comp.sum()) == 9 and bool(comp[5, 5]) and not bool(comp[0, 0])
    pts = sample_points(comp, 3, torch.Generator().manual_seed(0))
    assert pts.shape == (3, 2) and all(bool(comp[r, c]) for r, c in pts.tolist())
    assert len({tuple(p) for p in pts.tolist()}) == 3  # farthest-point sampling spreads them
    assert sample_points(torch.zeros(4, 4, dtype=torch.bool), 3).shape == (0, 2)


def test_random_walker_separates_two_objects_with_a_negative_point() -> None:
    """Check R2's effect in the refiner: a negative point on the second object keeps it out of the first's mask."""
    image = -torch.ones(3, 16, 16)
    image[0, 2:6, 2:6] = 1.0  # red
    image[2, 9:13, 9:13] = 1.0  # blue
    refiner = RandomWalkerRefiner()
    background = torch.zeros(16, 16, dtype=torch.bool)
    background[0, :] = True
    mask = refiner(image, torch.tensor([[3, 3]]), torch.tensor([[10, 10]]), background)
    assert bool(mask[4, 4]) and not bool(mask[10, 10])
    with pytest.raises(ValueError, match="outside"):
        refiner(image, torch.tensor([[30, 3]]), torch.zeros(0, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one positive"):
        refiner(image, torch.zeros(0, 2, dtype=torch.long), torch.tensor([[1, 1]]))


def _tiny_sam() -> torch.nn.Module:
    from segment_anything.modeling import (
        ImageEncoderViT,
        MaskDecoder,
        PromptEncoder,
        Sam,
        TwoWayTransformer,
    )

    torch.manual_seed(0)
    return Sam(
        ImageEncoderViT(img_size=64, patch_size=16, embed_dim=32, depth=1, num_heads=2, out_chans=32),
        PromptEncoder(embed_dim=32, image_embedding_size=(4, 4), input_image_size=(64, 64), mask_in_chans=4),
        MaskDecoder(transformer_dim=32, transformer=TwoWayTransformer(depth=1, embedding_dim=32, mlp_dim=64,
                                                                      num_heads=2), iou_head_hidden_dim=16),
    )  # fmt: skip


def test_sam_refiner_runs_a_segment_anything_model_on_points(tmp_path: Path) -> None:
    """The paper's refiner on a tiny randomly initialised SAM (the real class, built from its parts): a mask of the
    image's size; and the clear error without a checkpoint."""
    pytest.importorskip("segment_anything")
    refiner = SamRefiner(model=_tiny_sam())
    mask = refiner(torch.rand(3, 16, 16) * 2 - 1, torch.tensor([[3, 4]]), torch.tensor([[12, 12]]))
    assert mask.shape == (16, 16) and mask.dtype == torch.bool
    with pytest.raises(FileNotFoundError, match="no SAM checkpoint"):
        SamRefiner(str(tmp_path / "sam_vit_h.pth"))


class _FakePredictor:
    """Stands in for ``SamPredictor``: records what ``predict`` receives; the second of three masks scores best."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def set_image(self, rgb) -> None:
        self.shape = rgb.shape

    def predict(self, point_coords, point_labels, multimask_output):
        self.calls.append({"coords": point_coords.tolist(), "labels": point_labels.tolist()})
        masks = np.zeros((3, *self.shape[:2]), dtype=bool)
        masks[1, 0, 0] = True
        return masks, np.array([0.1, 0.9, 0.5]), None


def _fake_sam(**kwargs) -> tuple[SamRefiner, _FakePredictor]:
    pytest.importorskip("segment_anything")
    refiner = SamRefiner(model=_tiny_sam(), **kwargs)
    refiner.predictor = _FakePredictor()
    return refiner, refiner.predictor


def test_sam_refiner_passes_points_to_sam_as_x_y() -> None:
    """Check the card's pitfall: a point at (row=2, col=9) reaches SAM as (x=9, y=2), labels 1 then 0, and the mask
    of the highest predicted IoU comes back."""
    refiner, fake = _fake_sam()
    mask = refiner(torch.zeros(3, 12, 16), torch.tensor([[2, 9]]), torch.tensor([[7, 1]]))
    assert fake.calls == [{"coords": [[9.0, 2.0], [1.0, 7.0]], "labels": [1, 0]}]
    assert mask.shape == (12, 16) and bool(mask[0, 0]) and int(mask.sum()) == 1  # the 0.9-scored mask


def test_sam_refiner_adds_background_negatives_deterministically() -> None:
    """Check card §2.5 with SAM: up to ``background_points`` negatives come from the background region (here its two
    cells, at (row=0, col=15) and (row=11, col=0), as (x, y)), the same ones on every call; 0 turns it off."""
    refiner, fake = _fake_sam()
    background = torch.zeros(12, 16, dtype=torch.bool)
    background[0, 15] = background[11, 0] = True
    for _ in range(2):
        refiner(torch.zeros(3, 12, 16), torch.tensor([[2, 9]]), torch.zeros(0, 2, dtype=torch.long), background)
    first, second = fake.calls
    assert first["coords"][0] == [9.0, 2.0] and sorted(first["coords"][1:]) == [[0.0, 11.0], [15.0, 0.0]]
    assert first["labels"] == [1, 0, 0] and second == first
    large = torch.ones(12, 16, dtype=torch.bool)
    large[:4, :4] = False
    refiner(torch.zeros(3, 12, 16), torch.tensor([[2, 2]]), torch.zeros(0, 2, dtype=torch.long), large)
    refiner(torch.zeros(3, 12, 16), torch.tensor([[2, 2]]), torch.zeros(0, 2, dtype=torch.long), large)
    assert len(fake.calls[2]["coords"]) == 1 + 3 and fake.calls[2] == fake.calls[3]
    assert all(bool(large[int(y), int(x)]) for x, y in fake.calls[2]["coords"][1:])
    off, fake_off = _fake_sam(background_points=0)
    off(torch.zeros(3, 12, 16), torch.tensor([[2, 9]]), torch.zeros(0, 2, dtype=torch.long), background)
    assert fake_off.calls[0]["labels"] == [1]
    with pytest.raises(ValueError, match="background_points must be an int >= 0"):
        SamRefiner(model=_tiny_sam(), background_points=-1)


def _toy(**overrides) -> tuple[SegmentAnyword, SegmentAnywordPipeline]:
    torch.manual_seed(0)
    model = SegmentAnyword(block_out_channels=[8, 16], tuning_steps=1, inversion_steps=2)
    return model, model.pipeline(**overrides)


def test_pipeline_names_bad_input() -> None:
    """Check that a wrong image shape and a word without a token are refused with messages naming them."""
    model, pipe = _toy()
    with pytest.raises(ValueError, match=r"expected an image of shape \(C, 16, 16\)"):
        model.segment(torch.rand(3, 20, 20), "a red circle")
    pipe.word_positions = lambda caption: [[1], [], [3]]  # the noun has no token in the prompt
    with pytest.raises(ValueError, match="has a word with no token"):
        pipe.targets("a red circle")


def test_pipeline_warns_and_returns_no_mask_when_caption_has_no_noun_phrase() -> None:
    """Check that an expression without a noun phrase gives [] and a warning naming it (an evaluation goes on), while
    ``targets(strict=True)`` still raises."""
    model, pipe = _toy()
    with pytest.warns(UserWarning, match="no noun phrase in 'a red'"):
        assert model.segment(torch.rand(3, 16, 16), "a red") == []
    assert pipe.targets("a red", strict=False) == ([], [])
    with pytest.raises(ValueError, match="no noun phrase in 'a red'"):
        pipe.targets("a red")


@pytest.mark.parametrize(
    "image, seen",
    [
        (torch.full((3, 16, 16), 128, dtype=torch.uint8), "torch.uint8"),
        (torch.linspace(0, 255, 768).reshape(3, 16, 16), r"values in \[0, 255\]"),
        (torch.full((3, 16, 16), -1.5), r"values in \[-1.5, -1.5\]"),
    ],
    ids=["uint8", "0_255", "below_-1"],
)
def test_pipeline_refuses_images_that_are_not_float_in_minus_one_one(image, seen) -> None:
    """Check that uint8 images and float images outside [-1, 1] are refused in one line naming the expected range."""
    model, pipe = _toy()
    ids = model.tokenizer.encode("a red circle")
    with pytest.raises(ValueError, match=rf"expects float images in \[-1, 1\], got {seen}"):
        pipe(image, "a red circle", ids)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"mode": "Raw"}, "mode='Raw' is not accepted; expected 'inversion' or 'raw'"),
        ({"threshold": 1.5}, r"threshold=1.5 is not accepted; expected a value in \[0, 1\]"),
        ({"background_threshold": -0.1}, "background_threshold=-0.1"),
        ({"points": 0}, "points=0 is not accepted; expected an int >= 1"),
        ({"tuning_steps": -1}, "tuning_steps=-1 is not accepted; expected an int >= 0"),
        ({"inversion_steps": 0}, "inversion_steps=0 is not accepted; expected an int >= 1"),
        ({"tuning_draws": 0}, "tuning_draws=0"),
        ({"raw_timesteps": ()}, r"raw_timesteps=\(\) is not accepted"),
        ({"resolutions": "16"}, "resolutions='16' is not accepted; expected None"),
        ({"exclude_tokens": "eos"}, "exclude_tokens='eos' is not accepted; expected 'bos' or 'special'"),
        (
            {"exclude_tokens": "special", "special_ids": ()},
            "exclude_tokens='special' is not accepted; expected 'bos' where the pipeline has neither a tokenizer nor",
        ),
    ],
)
def test_pipeline_refuses_impossible_settings_at_construction(setting, message) -> None:
    """Check that each impossible setting fails when the pipeline is built, naming the setting and what it accepts."""
    with pytest.raises(ValueError, match=message):
        _toy(**setting)


def test_pipeline_refuses_ids_of_another_caption_without_tokenizer() -> None:
    """Check that without a tokenizer, ids too short for the caption's words, or with padding where its words are,
    are refused (ids of another caption of the same length cannot be told apart: documented)."""
    model, pipe = _toy()
    image, caption = torch.rand(3, 16, 16) * 2 - 1, "a red circle and a blue circle"
    with pytest.raises(ValueError, match="ids of length 4 do not hold the words of"):
        pipe(image, caption, model.tokenizer.encode("a red circle")[:4])
    with pytest.raises(ValueError, match=r"positions \[3, 2, 7, 6\] hold special or padding ids"):
        pipe(image, caption, model.tokenizer.encode("a red circle"))  # padding where "circle", "blue" should be


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_pipeline_runs_under_no_grad_and_inference_mode(context) -> None:
    """Check that the toy pipeline (textual inversion needs autograd) runs under the contexts inference is called in,
    and returns what it returns outside them."""
    model, pipe = _toy(tuning_steps=2)
    caption = "a red circle and a blue circle"
    image, ids = torch.rand(3, 16, 16) * 2 - 1, model.tokenizer.encode(caption)
    outside = pipe.attention_maps(image, ids, torch.tensor([3, 2]), torch.Generator().manual_seed(0))
    with context():
        inside_image, inside_ids = image.clone(), ids.clone()  # inference tensors under inference_mode
        masks = pipe(inside_image, caption, inside_ids, torch.Generator().manual_seed(0))
        inside = pipe.attention_maps(inside_image, inside_ids, torch.tensor([3, 2]), torch.Generator().manual_seed(0))
    assert len(masks) == 2 and masks[0].shape == (16, 16)
    torch.testing.assert_close(inside, outside)


def test_pipeline_arms_share_maps_and_differ_in_post_processing() -> None:
    """Check that the thresholded arm returns the largest component of the (R1) map and the refined arm a mask."""
    torch.manual_seed(0)
    model = SegmentAnyword(block_out_channels=[8, 16], tuning_steps=2, inversion_steps=2)
    image, caption = torch.rand(3, 16, 16) * 2 - 1, "a red circle and a blue circle"
    pipe = model.pipeline()
    phrases, tokens = pipe.targets(caption)
    assert tokens == [[[3], [2]], [[7], [6]]]  # per phrase: [noun, adjective] token positions (BOS at 0)
    ids = model.tokenizer.encode(caption)
    maps = pipe.attention_maps(image, ids, torch.tensor([3, 2, 7, 6]), torch.Generator().manual_seed(0))
    assert maps.shape == (4, 16, 16) and float(maps.min()) >= 0 and float(maps.max()) <= 1
    thresholded = model.pipeline(refiner=None).masks_from_maps(image, maps, phrases, tokens)
    assert all(int(largest_component(m).sum()) == int(m.sum()) for m in thresholded)
    refined = pipe.masks_from_maps(image, maps, phrases, tokens, torch.Generator().manual_seed(0))
    assert len(refined) == 2 and refined[0].dtype == torch.bool


def test_reproduction_claims_reject_their_stand_ins() -> None:
    """On a table where the full pipeline is ahead of every other arm by 0.3, each claim holds and rejects each
    stand-in; where the full pipeline scores as raw attention does, none holds."""
    from zoo.claims import evaluate
    from zoo.models.segment_anyword.experiment import ARMS, METRICS
    from zoo.models.segment_anyword.reproduce import CHECKS, CLAIMS

    assert {arm for c in CLAIMS for arm in (c.method, *c.all_stand_ins)} <= set(ARMS)
    assert all(c.classified for c in CLAIMS), "every claim names its stand-ins by kind"
    ahead = {f"{arm}/{k}": 0.7 if arm == "full" else 0.4 for arm in ARMS for k in METRICS}
    out = evaluate(ahead, CLAIMS, CHECKS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0, claim.name
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.all_stand_ins), claim.name
    level = ahead | {f"full/{k}": 0.4 for k in METRICS}
    out = evaluate(level, CLAIMS, CHECKS)
    assert all(out[f"{c.prefix}/{c.name}"] == 0.0 for c in CLAIMS)
