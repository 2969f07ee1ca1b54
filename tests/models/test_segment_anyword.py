"""Segment Anyword: the parsers, the prompt and point logic, the refiners (the random walker and a tiny SAM), the
pipeline over the toy model and over a tiny Stable-Diffusion-shaped UNet with a CLIP text encoder and tokenizer built
from config files (the real path), bad input, and the reproduction's claims."""

from __future__ import annotations

from pathlib import Path

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
from zoo.models.segment_anyword.pipeline import tokenizer_word_positions

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
    with pytest.raises(OSError, match="spacy download"):
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


def _wordpiece_tokenizer(tmp_path: Path):
    """A tiny BERT WordPiece tokenizer from a vocab file (the paper's CompVis LDM uses a BERT tokenizer): "circle"
    splits into "ci" + "##rcle", so a word spans two tokens."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "red", "ci", "##rcle", "and", "blue", "square"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizerFast.from_pretrained(str(tmp_path))  # a folder with vocab.txt, as a user's download


def test_real_path_stable_diffusion_shaped_unet_with_clip(tmp_path: Path) -> None:
    """The real path on a tiny instance: a UNet2DConditionModel with two cross-attention levels (SD's layout), a
    transformers CLIPTextModel built from its config and a Hugging Face tokenizer from a vocab file (word -> sub-word
    token positions from its offsets), in a StableDiffusionPipeline with a tiny VAE, through ``from_diffusers``: an RGB
    image is encoded, maps come back at the image size, with textual inversion, inversion and the refiner."""
    from diffusers import (
        AutoencoderKL,
        DDPMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
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
    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, max_position_embeddings=16)  # fmt: skip
    text = CLIPTextModel(config)
    unet = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D",) * 2,
                                up_block_types=("CrossAttnUpBlock2D",) * 2, cross_attention_dim=32,
                                attention_head_dim=4, norm_num_groups=8)  # fmt: skip
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, norm_num_groups=4, sample_size=32)  # fmt: skip
    sd = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet,
                                 scheduler=DDPMScheduler(beta_schedule="scaled_linear"), safety_checker=None,
                                 feature_extractor=None, requires_safety_checker=False)  # fmt: skip
    segmenter = SegmentAnywordPipeline.from_diffusers(sd, Rule(["circle", "square"], ["red", "blue"]),
                                                      RandomWalkerRefiner(), tuning_steps=2, tuning_draws=2,
                                                      inversion_steps=3)  # fmt: skip
    assert segmenter.max_length == 16  # the text encoder's positions bound the padded prompt
    table = text.get_input_embeddings().weight.clone()
    image = torch.rand(3, 32, 32) * 2 - 1  # RGB at 2x the latent size (this VAE downsamples once)
    _, tokens = segmenter.targets(caption)
    maps = segmenter.attention_maps(segmenter._encode_image(image), torch.tensor(
        tokenizer(caption, padding="max_length", max_length=16)["input_ids"]), segmenter.flat_positions(tokens))
    assert maps.shape == (5, 16, 16)  # ci, ##rcle, red, square, blue: one map per token, at the latent size
    masks = segmenter(image, caption, generator=torch.Generator().manual_seed(0))
    assert len(masks) == 2 and masks[0].shape == (32, 32) and masks[0].dtype == torch.bool
    torch.testing.assert_close(text.get_input_embeddings().weight, table)  # the table is restored (no leakage)
    with pytest.raises(ValueError, match="multiples of the VAE's 2"):
        segmenter(torch.rand(3, 31, 31), caption)
    with pytest.raises(ValueError, match="no token in the prompt"):
        segmenter(image, "a red circle and a blue square " + "a " * 12 + "red circle")  # truncated away
    with pytest.raises(ValueError, match="has no unet, .*vae: expected a text-to-image"):
        SegmentAnywordPipeline.from_diffusers(object(), Rule(["circle"], ["red"]))


def test_reproduction_claims_reject_their_stand_ins() -> None:
    """On a table where the full pipeline is ahead of every other arm, each asserted claim holds and rejects each of
    its stand-ins; where the full pipeline scores as raw attention does, none holds."""
    from zoo.claims import evaluate
    from zoo.models.segment_anyword.reproduce import ARMS, CLAIMS, METRICS

    asserted = [c for c in CLAIMS if c.asserted]
    assert asserted and any(not c.asserted for c in CLAIMS), "asserted and reported claims"
    assert {arm for c in CLAIMS for arm in (c.method, *c.stand_ins)} <= set(ARMS)
    ahead = {f"{arm}/{k}": 0.4 if arm == "full" else 0.2 for arm in ARMS for k in METRICS}
    out = evaluate(ahead, asserted)
    for claim in asserted:
        assert out[f"claims/{claim.name}"] == 1.0, claim.name
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins), claim.name
    level = ahead | {f"full/{k}": 0.2 for k in METRICS}
    out = evaluate(level, asserted)
    assert all(out[f"claims/{c.name}"] == 0.0 for c in asserted)
