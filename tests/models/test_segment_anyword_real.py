"""Segment Anyword's real path on tiny random diffusers pipelines built from configs (no download): Stable Diffusion's
layout (CLIP text encoder, KL autoencoder) and the paper's CompVis LDM (``LDMTextToImagePipeline``: LDMBert, VQ
autoencoder, a BERT WordPiece tokenizer, fast or slow), through ``SegmentAnywordPipeline.from_diffusers``."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import zoo.models.segment_anyword.pipeline as pipeline_module
from zoo.models.segment_anyword import RandomWalkerRefiner, RuleParser, SegmentAnywordPipeline
from zoo.models.segment_anyword.pipeline import tokenizer_word_positions

CAPTION = "a red circle and a blue square"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "red", "ci", "##rcle", "and", "blue", "square"]
# "a red circle and a blue square" -> [CLS] a red ci ##rcle and a blue square [SEP], then [PAD] to 16
IDS = [2, 4, 5, 6, 7, 8, 4, 9, 10, 3] + [0] * 6


def _tokenizer(tmp_path: Path, slow: bool = False):
    """A tiny BERT WordPiece tokenizer from a vocab file (the CompVis LDM's kind): "circle" is "ci" + "##rcle"."""
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    if slow:  # the Python tokenizer, without character offsets (the LDM's BertTokenizer under transformers 4)
        try:
            from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Slow
        except ImportError:  # transformers 4: BertTokenizer is the Python one
            from transformers import BertTokenizer as Slow
        return Slow.from_pretrained(str(tmp_path))
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(tmp_path))


def _unet(levels: int = 3):
    """Cross-attention at every level, as SD's UNet: maps of 16, 8 (and 4) on a 16 x 16 latent."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(16, 32, 32)[:levels], cross_attention_dim=32,
                                down_block_types=("CrossAttnDownBlock2D",) * levels, attention_head_dim=4,
                                up_block_types=("CrossAttnUpBlock2D",) * levels, norm_num_groups=8)  # fmt: skip


def _sd(tokenizer, levels: int = 3):
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, max_position_embeddings=16, bos_token_id=2, eos_token_id=3,
                            pad_token_id=0)  # fmt: skip
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, norm_num_groups=4, sample_size=32)  # fmt: skip
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=CLIPTextModel(config).eval(),
        tokenizer=tokenizer,
        unet=_unet(levels),
        scheduler=DDPMScheduler(beta_schedule="scaled_linear"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _ldm(tokenizer):
    from diffusers import DDIMScheduler, LDMTextToImagePipeline, VQModel
    from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import LDMBertConfig, LDMBertModel

    torch.manual_seed(0)
    bert = LDMBertModel(
        LDMBertConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=16,
            encoder_layers=1,
            encoder_ffn_dim=32,
            encoder_attention_heads=2,
            head_dim=16,
            d_model=32,
        )
    )
    vqvae = VQModel(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    layers_per_block=1, norm_num_groups=4, sample_size=32, num_vq_embeddings=16)  # fmt: skip
    return LDMTextToImagePipeline(vqvae=vqvae, bert=bert.eval(), tokenizer=tokenizer, unet=_unet(),
                                  scheduler=DDIMScheduler(beta_schedule="scaled_linear"))  # fmt: skip


def _parser() -> RuleParser:
    return RuleParser(["circle", "square"], ["red", "blue"])


def _image() -> torch.Tensor:
    return torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1  # 2x the latent side


def test_real_path_stable_diffusion_shaped_unet_with_clip(tmp_path: Path) -> None:
    """Check the real path on a tiny StableDiffusionPipeline (CLIP text encoder, KL VAE, a WordPiece tokenizer whose
    offsets map words to sub-word tokens): an RGB image is encoded, maps come back at the image size, with textual
    inversion, inversion and the refiner, and the embedding table is restored."""
    tokenizer = _tokenizer(tmp_path)
    positions = tokenizer_word_positions(tokenizer, CAPTION)
    assert positions == [[1], [2], [3, 4], [5], [6], [7], [8]]  # "circle" = "ci" + "##rcle", after [CLS]
    sd = _sd(tokenizer)
    segmenter = SegmentAnywordPipeline.from_diffusers(sd, _parser(), RandomWalkerRefiner(), tuning_steps=2,
                                                      tuning_draws=2, inversion_steps=3)  # fmt: skip
    assert segmenter.max_length == 16  # the text encoder's positions bound the padded prompt
    table = sd.text_encoder.get_input_embeddings().weight.clone()
    _, tokens = segmenter.targets(CAPTION)
    maps = segmenter.attention_maps(segmenter._encode_image(_image()), torch.tensor(IDS),
                                    segmenter.flat_positions(tokens))  # fmt: skip
    assert maps.shape == (5, 16, 16)  # ci, ##rcle, red, square, blue: one map per token, at the latent size
    with torch.no_grad():  # the KL posterior's mean (not a sample), times the VAE's scaling factor
        posterior = sd.vae.encode(_image()[None]).latent_dist
    expected = posterior.mean[0] * sd.vae.config.scaling_factor
    assert sd.vae.config.scaling_factor != 1.0 and not torch.allclose(posterior.sample()[0], posterior.mean[0])
    torch.testing.assert_close(segmenter._encode_image(_image()), expected)
    masks = segmenter(_image(), CAPTION, generator=torch.Generator().manual_seed(0))
    assert len(masks) == 2 and masks[0].shape == (32, 32) and masks[0].dtype == torch.bool
    torch.testing.assert_close(sd.text_encoder.get_input_embeddings().weight, table)  # no leakage
    with pytest.raises(ValueError, match="multiples of the VAE's 2"):
        segmenter(torch.rand(3, 31, 31), CAPTION)
    with pytest.raises(ValueError, match="no token in the prompt"):
        segmenter(_image(), CAPTION + " " + "a " * 12 + "red circle")  # truncated away
    with pytest.raises(ValueError, match=r"has no unet, text_encoder \(or bert\).*LDMTextToImagePipeline"):
        SegmentAnywordPipeline.from_diffusers(object(), _parser())


def test_from_diffusers_averages_side_over_4_maps_renormalised_without_special_tokens(tmp_path: Path,
                                                                                     monkeypatch) -> None:  # fmt: skip
    """Check the card's defaults on the real path against a reference written from the card: only the 4 x 4 maps of
    the 16 x 16 latent are recorded (side / 4), and each pixel's attention is renormalised over the caption's words
    alone (positions 1..8 of ``IDS``: [CLS], [SEP] and the padding dropped)."""
    stores = []
    record = pipeline_module.record_cross_attention

    @contextmanager
    def spy(unet, **kwargs):
        with record(unet, **kwargs) as store:
            stores.append(store)
            yield store

    monkeypatch.setattr(pipeline_module, "record_cross_attention", spy)
    segmenter = SegmentAnywordPipeline.from_diffusers(_sd(_tokenizer(tmp_path)), _parser(), mode="raw",
                                                      tuning_steps=0, raw_timesteps=(100, 500))  # fmt: skip
    assert (segmenter.resolutions, segmenter.exclude_tokens) == ("auto", "special")
    ids, positions = torch.tensor(IDS), torch.tensor([3, 4, 2, 8, 7])
    assert segmenter.excluded_columns(ids).tolist() == [True] + [False] * 8 + [True] * 7
    maps = segmenter.attention_maps(segmenter._encode_image(_image()), ids, positions)
    probe, store = stores[0], stores[-1]
    assert sorted({r.size for r in probe.records}) == [(4, 4), (8, 8), (16, 16)]
    assert {r.size for r in store.records} == {(4, 4)} and len(store) == 2 * 4  # 2 timesteps x (down 1, mid 1, up 2)
    reference = torch.zeros(5, 16, 16)
    for r in store.records:
        p = r.probs[0]  # (16 pixels, 16 tokens)
        q = p[:, positions] / p[:, 1:9].sum(-1, keepdim=True)  # renormalised over the 8 word tokens
        reference += F.interpolate(q.T.reshape(1, 5, 4, 4), size=(16, 16), mode="bilinear", align_corners=False)[0]
    lo, hi = reference.amin((1, 2), keepdim=True), reference.amax((1, 2), keepdim=True)
    torch.testing.assert_close(maps, (reference - lo) / (hi - lo), atol=1e-5, rtol=1e-5)
    segmenter.exclude_tokens = "bos"  # the option kept: only BOS dropped, the padding stays in the renormalisation
    assert segmenter.excluded_columns(ids).tolist() == [True] + [False] * 15
    bos_only = segmenter.attention_maps(segmenter._encode_image(_image()), ids, positions)
    assert not torch.allclose(bos_only, maps, atol=1e-3)


def test_from_diffusers_auto_resolution_refuses_unet_without_side_over_4_maps(tmp_path: Path) -> None:
    """Check that "auto" on a UNet with maps of 16 and 8 only (a 16 x 16 latent wants 4 x 4) names the sizes it has,
    before any textual inversion; and that explicit resolutions or None are accepted."""
    sd = _sd(_tokenizer(tmp_path), levels=2)
    segmenter = SegmentAnywordPipeline.from_diffusers(sd, _parser(), tuning_steps=1, tuning_draws=1,
                                                      inversion_steps=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"resolutions='auto' .* this UNet's maps are \[\(8, 8\), \(16, 16\)\]"):
        segmenter(_image(), CAPTION)
    for resolutions in ([8], None):
        ok = SegmentAnywordPipeline.from_diffusers(sd, _parser(), tuning_steps=0, inversion_steps=1,
                                                   resolutions=resolutions)  # fmt: skip
        assert len(ok(_image(), CAPTION)) == 2


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_from_diffusers_runs_under_no_grad_and_inference_mode(tmp_path: Path, context) -> None:
    """Check that the real path (with textual inversion, which needs autograd) runs the way inference is called, and
    gives what it gives outside the context."""
    segmenter = SegmentAnywordPipeline.from_diffusers(_sd(_tokenizer(tmp_path)), _parser(), tuning_steps=2,
                                                      tuning_draws=1, inversion_steps=2)  # fmt: skip
    ids, positions = torch.tensor(IDS), torch.tensor([3, 4, 2])
    outside = segmenter.attention_maps(
        segmenter._encode_image(_image()), ids, positions, torch.Generator().manual_seed(0)
    )
    with context():
        image = _image()  # an inference tensor under inference_mode
        masks = segmenter(image, CAPTION, generator=torch.Generator().manual_seed(0))
        inside = segmenter.attention_maps(segmenter._encode_image(image), torch.tensor(IDS), torch.tensor([3, 4, 2]),
                                          torch.Generator().manual_seed(0))  # fmt: skip
    assert len(masks) == 2 and masks[0].shape == (32, 32)
    torch.testing.assert_close(inside, outside)


@pytest.mark.parametrize("slow", [False, True], ids=["fast_tokenizer", "slow_tokenizer"])
def test_from_diffusers_reads_ldm_text_to_image_pipeline(tmp_path: Path, slow: bool) -> None:
    """Check that the paper's CompVis LDM layout (bert, vqvae) is read: LDMBert's hidden states and token table, the VQ
    latents times the scaling factor, and the word positions from a fast or a slow (no offsets) BERT tokenizer."""
    ldm = _ldm(_tokenizer(tmp_path, slow=slow))
    segmenter = SegmentAnywordPipeline.from_diffusers(ldm, _parser(), RandomWalkerRefiner(), tuning_steps=1,
                                                      tuning_draws=1, inversion_steps=2)  # fmt: skip
    assert segmenter.embedding is ldm.bert.model.embed_tokens and segmenter.vae is ldm.vqvae
    assert segmenter.max_length == 16 and segmenter.word_positions(CAPTION) == [[1], [2], [3, 4], [5], [6], [7], [8]]
    ids = torch.tensor([IDS])
    torch.testing.assert_close(segmenter.encode_text(ids), ldm.bert(ids).last_hidden_state)
    with torch.no_grad():
        latents = ldm.vqvae.encode(_image()[None]).latents[0]
    torch.testing.assert_close(segmenter._encode_image(_image()), latents * ldm.vqvae.config.scaling_factor)
    table = ldm.bert.get_input_embeddings().weight.clone()
    masks = segmenter(_image(), CAPTION, generator=torch.Generator().manual_seed(0))
    assert len(masks) == 2 and masks[1].shape == (32, 32)
    torch.testing.assert_close(ldm.bert.get_input_embeddings().weight, table)


def test_tokenizer_word_positions_counts_pieces_without_offsets(tmp_path: Path) -> None:
    """Check the slow-tokenizer fallback against positions read off the vocabulary by hand, with truncation."""
    slow = _tokenizer(tmp_path, slow=True)
    assert not getattr(slow, "is_fast", False)
    assert tokenizer_word_positions(slow, "blue circle and square") == [[1], [2, 3], [4], [5]]
    # max_length 6 keeps [CLS] + 4 tokens + [SEP]: "and" (position 4) stays, "square" (5) is cut
    assert tokenizer_word_positions(slow, "blue circle and square", max_length=5) == [[1], [2, 3], [], []]
    assert tokenizer_word_positions(slow, "blue circle and square", max_length=6) == [[1], [2, 3], [4], []]


def test_pipeline_refuses_ids_of_another_caption(tmp_path: Path) -> None:
    """Check that ids the tokenizer does not make for the caption are refused, padded or not."""
    segmenter = SegmentAnywordPipeline.from_diffusers(_sd(_tokenizer(tmp_path)), _parser(), tuning_steps=0,
                                                      inversion_steps=1)  # fmt: skip
    other = torch.tensor([2, 4, 9, 10, 8, 4, 5, 6, 7, 3] + [0] * 6)  # "a blue square and a red circle"
    with pytest.raises(ValueError, match="are not the ids of 'a red circle and a blue square'"):
        segmenter(_image(), CAPTION, ids=other)
    assert len(segmenter(_image(), CAPTION, ids=torch.tensor(IDS[:10]))) == 2  # unpadded ids are the caption's too
