"""Tests of the EFM reproduction's claim set (the run itself is the contract test's): every arm a claim names is run,
and the restated mode claim separates a transport onto Q from the identity map, which the mode balance does not."""

from __future__ import annotations

import torch

from zoo.datamodules.pairs import toy_distribution
from zoo.models.efm.reproduce import ARMS, CHECKS, CLAIMS, MODES, _score


def test_every_claim_names_arms_the_reproduction_runs() -> None:
    """Check that each claim's method and stand-ins are two-mode arms (run in --quick too), and names are unique."""
    for claim in CLAIMS:
        assert claim.method in ARMS, claim.name
        assert claim.stand_ins and set(claim.stand_ins) <= set(ARMS), claim.name
    names = [c.name for c in CLAIMS] + [c.name for c in CHECKS]
    assert len(names) == len(set(names))


def test_mode_cover_fails_the_identity_map_that_mode_balance_passes() -> None:
    """Check that P itself is balanced (x₁ > 0 for about half) yet covers neither mode, while samples of Q cover both."""
    g = torch.Generator().manual_seed(0)
    p, q, q_other = (toy_distribution(name, 2000, g) for name in ("gaussian", "two_modes", "two_modes"))
    identity, target = _score(p, q, MODES["two_modes"]), _score(q_other, q, MODES["two_modes"])
    assert 0.45 < identity["balance"] < 0.55 and identity["mode_min"] < 0.01
    assert target["mode_min"] > 0.45 and target["off_modes"] < 0.03 and target["ed"] < 0.02
    collapsed = _score(q_other[q_other[:, 0] > 0], q, MODES["two_modes"])  # every sample on one mode
    assert collapsed["mode_min"] == 0.0
