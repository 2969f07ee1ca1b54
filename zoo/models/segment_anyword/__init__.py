"""Segment Anyword: training-free open-set grounded segmentation from a frozen text-to-image diffusion model's
cross-attention, with test-time textual inversion, inversion, linguistic prompt regularisation and point-prompt
refinement (Liu et al., ICML 2025; no official code: the card's reconstruction)."""

from zoo.models.segment_anyword.attention import AttentionStore, CrossAttentionRecorder, record_cross_attention
from zoo.models.segment_anyword.inversion import ddim_denoise, ddim_invert, substituted_embeddings, textual_inversion
from zoo.models.segment_anyword.module import SegmentAnyword
from zoo.models.segment_anyword.parser import Phrase, RuleParser, SpacyParser, get_parser
from zoo.models.segment_anyword.pipeline import SegmentAnywordPipeline, largest_component, sample_points
from zoo.models.segment_anyword.refine import RandomWalkerRefiner, SamRefiner
from zoo.models.segment_anyword.text2image import ShapeTextEncoder, TextToImage

__all__ = [
    "AttentionStore",
    "CrossAttentionRecorder",
    "Phrase",
    "RandomWalkerRefiner",
    "RuleParser",
    "SamRefiner",
    "SegmentAnyword",
    "SegmentAnywordPipeline",
    "ShapeTextEncoder",
    "SpacyParser",
    "TextToImage",
    "ddim_denoise",
    "ddim_invert",
    "get_parser",
    "largest_component",
    "record_cross_attention",
    "sample_points",
    "substituted_embeddings",
    "textual_inversion",
]
