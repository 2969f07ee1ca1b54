"""Segment Anyword: the parsers, the prompt and point logic, the refiners (the random walker and a tiny SAM), the
pipeline over the toy model and over a tiny Stable-Diffusion-shaped UNet with a CLIP text encoder and tokenizer built
from config files (the real path), bad input, and the reproduction's claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.models.segment_anyword import (
    RandomWalkerRefiner,
    RuleParser,
    SamRefiner,
    SegmentAnyword,
    SegmentAnywordPipeline,
    largest_component,
    sample_points,
)
from zoo.models.segment_anyword.pipeline import tokenizer_word_positions

COLOURS, SHAPES = ("red", "green", "blue", "yellow"), ("circle", "square", "triangle")


def test_rule_parser_finds_each_phrase_with_its_adjective() -> None:
    parse = RuleParser(SHAPES, COLOURS)
    phrases = parse("a red circle and a blue circle")
    assert [(p.noun, p.modifiers) for p in phrases] == [(2, (1,)), (6, (5,))]
    assert [p.text for p in parse("a green triangle")] == ["green triangle"]
    assert parse("a and of") == []


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
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

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


def test_pipeline_names_bad_input() -> None:
    model = SegmentAnyword(block_out_channels=[8, 16], tuning_steps=1, inversion_steps=2)
    with pytest.raises(ValueError, match=r"expected an image of shape \(C, 16, 16\)"):
        model.segment(torch.rand(3, 20, 20), "a red circle")
    with pytest.raises(ValueError, match="no noun phrase"):
        model.segment(torch.rand(3, 16, 16), "a red")
    pipe = model.pipeline()
    pipe.word_positions = lambda caption: [[1], [], [3]]  # the noun has no token in the prompt
    with pytest.raises(ValueError, match="has a word with no token"):
        pipe.targets("a red circle")


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


def _wordpiece_tokenizer(tmp_path: Path):  # noqa: ANN202 (transformers' class)
    """A tiny BERT WordPiece tokenizer from a vocab file (the paper's CompVis LDM uses a BERT tokenizer): "circle"
    splits into "ci" + "##rcle", so a word spans two tokens."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "red", "ci", "##rcle", "and", "blue", "square"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizerFast.from_pretrained(str(tmp_path))  # a folder with vocab.txt, as a user's download


def test_real_path_stable_diffusion_shaped_unet_with_clip(tmp_path: Path) -> None:
    """The real path on a tiny instance: a UNet2DConditionModel with two cross-attention levels (SD's layout), a
    transformers CLIPTextModel built from its config and a Hugging Face tokenizer from a vocab file (word -> sub-word
    token positions from its offsets), through the whole pipeline with textual inversion, inversion and the refiner."""
    from diffusers import DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from zoo.models.segment_anyword.parser import RuleParser as Rule

    tokenizer = _wordpiece_tokenizer(tmp_path)
    caption = "a red circle and a blue square"
    positions = tokenizer_word_positions(tokenizer, caption)
    ids = tokenizer(caption)["input_ids"]
    # every word maps to its own consecutive sub-word pieces, after <|startoftext|> and before <|endoftext|>
    flat = [t for word in positions for t in word]
    assert flat == list(range(1, len(ids) - 1)) and all(len(w) >= 1 for w in positions)
    assert [tokenizer.decode([ids[t] for t in w]).replace(" ", "") for w in positions] == caption.split()
    assert positions[2] == [3, 4]  # "circle" = "ci" + "##rcle"
    torch.manual_seed(0)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16))  # fmt: skip
    unet = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D",) * 2,
                                up_block_types=("CrossAttnUpBlock2D",) * 2, cross_attention_dim=32,
                                attention_head_dim=4, norm_num_groups=8)  # fmt: skip
    pipe = SegmentAnywordPipeline(
        unet=unet, encode_text=lambda ids: text(ids).last_hidden_state, embedding=text.get_input_embeddings(),
        scheduler=DDPMScheduler(beta_schedule="scaled_linear"), word_positions=lambda c: tokenizer_word_positions(
            tokenizer, c), parser=Rule(["circle", "square"], ["red", "blue"]), refiner=RandomWalkerRefiner(),
        tuning_steps=2, tuning_draws=2, inversion_steps=3,
    )  # fmt: skip
    ids = torch.tensor(ids)
    latents = torch.randn(4, 16, 16)  # an SD latent (a VAE's output) stands in for the image here
    image = latents[:3].clamp(-1, 1)  # the refiner reads an RGB image: take one in [-1, 1] of the same size
    table = text.get_input_embeddings().weight.clone()
    phrases, tokens = pipe.targets(caption)
    flat = pipe.flat_positions(tokens)
    maps = pipe.attention_maps(latents, ids, flat, torch.Generator().manual_seed(0))
    masks = pipe.masks_from_maps(image, maps, phrases, tokens, torch.Generator().manual_seed(0))
    assert maps.shape == (len(flat), 16, 16) and len(masks) == 2 and masks[0].shape == (16, 16)
    torch.testing.assert_close(text.get_input_embeddings().weight, table)  # the table is restored (no leakage)


def test_reproduction_claims_reject_their_stand_ins() -> None:
    from zoo.claims import evaluate
    from zoo.models.segment_anyword.reproduce import CLAIMS

    assert CLAIMS, "the reproduction asserts or reports claims"
    rows = {arm: 0.3 for arm in ("raw", "m1", "random_map", "no_tuning", "no_inversion", "no_r1", "no_r2",
                                 "no_refiner")}  # fmt: skip
    r = {f"{arm}/{k}": v for arm, v in rows.items() for k in ("hard_miou", "miou", "hard_ciou", "ciou", "giou",
                                                             "hard_giou")}  # fmt: skip
    r |= {f"full/{k}": 0.9 for k in ("hard_miou", "miou", "hard_ciou", "ciou", "giou", "hard_giou")}
    out = evaluate(r, CLAIMS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0, claim.name
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins), claim.name
    r |= {f"full/{k}": 0.3 for k in ("hard_miou", "miou", "hard_ciou", "ciou", "giou", "hard_giou")}
    out = evaluate(r, CLAIMS)
    assert all(out[f"claims/{c.name}"] == 0.0 for c in CLAIMS if c.asserted)
