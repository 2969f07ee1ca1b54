"""Tests of the e2e-wm reproduction's pieces (the quick run itself is the contract test's): every claim names arms
the run has, KGW's envelope, and the sampler's distortion measure."""

from __future__ import annotations

import torch

from zoo.models.e2e_wm.generation import sample
from zoo.models.e2e_wm.lm import GRULM
from zoo.models.e2e_wm.reproduce import CHECKS, CLAIMS, SETTINGS, _arms, envelope
from zoo.models.e2e_wm.watermarks import KGWWatermark


def test_every_claim_names_arms_of_both_runs() -> None:
    """Check that each claim's method and stand-ins are arms of the full and of the quick run; names are unique."""
    for settings in SETTINGS.values():
        arms = _arms(settings)
        for claim in CLAIMS:
            assert claim.method in arms and claim.all_stand_ins and set(claim.all_stand_ins) <= set(arms), claim.name
    names = [c.name for c in CLAIMS] + [c.name for c in CHECKS]
    assert len(names) == len(set(names)) and CLAIMS


def test_envelope_anchor_interpolation_and_clamping() -> None:
    """Check the δ = 0 anchor, piecewise-linear interpolation, the upper envelope and clamping at both ends."""
    pts = [(0.2, 0.9), (0.4, 0.8), (0.1, 0.7)]
    assert envelope(pts, 0.0) == 0.5 and envelope(pts, -1.0) == 0.5
    assert abs(envelope(pts, 0.05) - 0.6) < 1e-12
    assert abs(envelope(pts, 0.3) - 0.9) < 1e-12  # the envelope: more distortion never hurts KGW
    assert envelope(pts, 5.0) == 0.9


def test_sampler_kl_is_zero_without_a_watermark_and_grows_with_delta() -> None:
    """Check that the distortion is 0 for plain sampling and increases with KGW's δ."""
    torch.manual_seed(0)
    lm = GRULM(30, 8, 16).eval()
    prompts = torch.randint(0, 30, (64, 3))
    kls = [float(sample(lm, prompts, 10, [KGWWatermark(30, delta=d)] if d else [], 1.0,
                        torch.Generator().manual_seed(0), return_kl=True)[1].mean()) for d in (0, 1, 3)]  # fmt: skip
    assert abs(kls[0]) < 1e-6 and 0 < kls[1] < kls[2]


def test_sampler_never_emits_suppressed_tokens() -> None:
    """Check that suppressed ids (SynLang's PAD and BOS) are never sampled, even when the LM all but insists on them,
    and that the distortion of plain sampling stays 0 (p is the LM's distribution over the other tokens)."""
    lm = GRULM(10, 8, 16).eval()
    with torch.no_grad():
        lm.head.bias[:2] += 20.0  # PAD and BOS then hold all but e^-20 of the mass
    prompts = torch.full((50, 2), 3)
    ids, kl = sample(lm, prompts, 20, [], 1.0, torch.Generator().manual_seed(0), return_kl=True, suppress=(0, 1))
    assert bool((ids[:, 2:] >= 2).all()) and float(kl.abs().max()) < 1e-6
    assert bool((sample(lm, prompts, 20, [], 1.0, torch.Generator().manual_seed(0))[:, 2:] < 2).any())  # unsuppressed
