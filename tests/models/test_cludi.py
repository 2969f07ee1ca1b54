"""Tests of CLUDI's parts (clustering via self-supervised diffusion): the sqrt schedule, the rescaled forward process
and min-SNR weights, the η = 1 DDIM sampler against a hand-written reference, the row/column-normalised loss against
the official ``extended_new_loss_newnew``, the student's feature views and the denoiser. The Lightning module's tests
(training loss, timesteps, teachers, ablation, clipping, metrics) are in ``test_cludi_training.py``."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from zoo.models.cludi import (
    AssignmentDenoiser,
    ClusterDiffusion,
    perturb_features,
    row_column_ce,
    sqrt_schedule_betas,
)

T, R_SCALE = 1000, 49.0


def official_alpha_bar(steps: int = T) -> Tensor:
    """ᾱ_t in float64, computed independently: ᾱ(s) = 1 − √(s + 1e-4) on the grid s = i/T, β capped at 0.999."""
    s = torch.arange(steps + 1, dtype=torch.float64) / steps
    continuous = 1 - torch.sqrt(s + 1e-4)
    betas = (1 - continuous[1:] / continuous[:-1]).clamp(max=0.999)
    return torch.cumprod(1 - betas, 0)


def official_grid(steps: int) -> list[int]:
    """The official time grid: reversed(linspace(−1, T−1, R+1).int()), without the final −1."""
    return list(reversed(torch.linspace(-1, T - 1, steps + 1).int().tolist()))[:-1]


class FakeNet(nn.Module):
    """A stand-in denoiser ``fn(z, x, t, z_sc)`` with a linear head, recording every call's inputs."""

    def __init__(self, fn: Callable[..., Tensor], emb_dim: int = 4, num_clusters: int = 3) -> None:
        super().__init__()
        self.fn, self.emb_dim = fn, emb_dim
        self.head = nn.Linear(emb_dim, num_clusters)
        self.calls: list[tuple[Tensor, Tensor, Tensor]] = []

    def forward(self, z: Tensor, x: Tensor, t: Tensor, z_sc: Tensor) -> Tensor:
        self.calls.append((z.detach().clone(), t.clone(), z_sc.detach().clone()))
        return self.fn(z, x, t, z_sc)


def smooth_fn(z: Tensor, x: Tensor, t: Tensor, z_sc: Tensor) -> Tensor:
    """A deterministic ẑ_0 that depends on z, x, t and z_sc and often leaves [−1, 1] (so the clamp matters)."""
    return 1.6 * torch.tanh(0.03 * z + 0.5 * z_sc + x[..., : z.shape[-1]]) + t.view(-1, 1, 1) / 2000


# ------------------------------------------------------------------------------------------------ schedule
def test_sqrt_schedule_matches_the_official_discretisation() -> None:
    """Check that β_i = min(1 − ᾱ((i+1)/T)/ᾱ(i/T), 0.999) with ᾱ(s) = 1 − √(s+1e-4), and only the last β is capped."""
    betas = torch.tensor(sqrt_schedule_betas(T), dtype=torch.float64)
    s = torch.arange(T + 1, dtype=torch.float64) / T
    continuous = 1 - torch.sqrt(s + 1e-4)
    expected = torch.minimum(1 - continuous[1:] / continuous[:-1], torch.tensor(0.999, dtype=torch.float64))
    torch.testing.assert_close(betas, expected, rtol=1e-12, atol=0)
    assert betas[-1] == 0.999 and bool((betas[:-1] < 0.999).all())  # ᾱ(1) < 0: only the last step hits the cap
    assert float(continuous[-1]) < 0  # the uncapped ratio would give β > 1 there
    torch.testing.assert_close(
        betas[0], torch.tensor(1 - (1 - math.sqrt(1e-3 + 1e-4)) / (1 - math.sqrt(1e-4)), dtype=torch.float64)
    )
    short = sqrt_schedule_betas(10)
    assert len(short) == 10 and short[-1] == 0.999


def test_scheduler_alphas_cumprod_positive_decreasing_and_official() -> None:
    """Check that the diffusion's ᾱ_t are positive, strictly decreasing, ≈ 0 at T−1 and equal the official ones."""
    alpha_bar = ClusterDiffusion().scheduler.alphas_cumprod
    assert alpha_bar.shape == (T,)
    assert bool((alpha_bar > 0).all()) and bool((alpha_bar[1:] < alpha_bar[:-1]).all())
    assert float(alpha_bar[-1]) < 1e-6 and float(alpha_bar[0]) > 0.97
    torch.testing.assert_close(alpha_bar.double(), official_alpha_bar(), rtol=1e-4, atol=1e-9)


def test_q_sample_rescales_noise_with_one_timestep_per_copy() -> None:
    """Check that q_sample is √ᾱ_t z0 + √(1−ᾱ_t)·r·ε with t of shape [S] broadcast over [S, B, E]."""
    diffusion = ClusterDiffusion()
    g = torch.Generator().manual_seed(0)
    z0, eps = torch.randn(4, 5, 6, generator=g), torch.randn(4, 5, 6, generator=g)
    t = torch.tensor([0, 10, 500, 999])
    z_t = diffusion.q_sample(z0, t, eps)
    a = official_alpha_bar()[t].float().view(-1, 1, 1)
    torch.testing.assert_close(z_t, a.sqrt() * z0 + (1 - a).sqrt() * R_SCALE * eps, rtol=1e-4, atol=1e-4)
    assert z_t.shape == (4, 5, 6)
    # copies with different t are scaled differently: not one t for the whole batch
    same_t = diffusion.q_sample(z0, torch.full((4,), 500), eps)
    torch.testing.assert_close(z_t[2], same_t[2])
    assert not torch.allclose(z_t[0], same_t[0])


def test_loss_weights_are_min_snr_over_rescale() -> None:
    """Check that weights(t) = min(ᾱ_t/(1−ᾱ_t), 5) / r (SNR without r), for every t and for another r and γ."""
    t = torch.arange(T)
    a = official_alpha_bar()
    for rescale, gamma in ((R_SCALE, 5.0), (7.0, 2.0)):
        w = ClusterDiffusion(rescale=rescale, min_snr=gamma).weights(t)
        expected = (a / (1 - a)).clamp(max=gamma) / rescale
        torch.testing.assert_close(w.double(), expected, rtol=1e-4, atol=1e-10)
        assert float(w[0]) == pytest.approx(gamma / rescale)  # SNR_0 ≈ 42 is capped
    w = ClusterDiffusion().weights(torch.tensor([3, 999, 3]))
    assert w.shape == (3,) and w[0] == w[2] and w[1] < 1e-8


# ------------------------------------------------------------------------------------------------ sampler
@pytest.mark.parametrize("steps", [1, 2, 10, 25, 50])
def test_sample_uses_the_official_time_grid(steps: int) -> None:
    """Check that the timesteps the denoiser sees are reversed(linspace(−1, T−1, R+1).int()) without the −1,
    one t per copy."""
    net = FakeNet(lambda z, x, t, z_sc: torch.zeros_like(z))
    ClusterDiffusion().sample(net, torch.randn(3, 2, 5), steps, generator=torch.Generator().manual_seed(0))
    assert len(net.calls) == steps
    for _, t, _ in net.calls:
        assert t.shape == (3,) and t.dtype == torch.long and len(set(t.tolist())) == 1
    assert [int(t[0]) for _, t, _ in net.calls] == official_grid(steps)


@pytest.mark.parametrize("value", [0.3, -0.7, 4.0, -2.5])
def test_sample_returns_head_of_the_clamped_last_prediction(value: float) -> None:
    """Check that the output is head(clamp(ẑ0)) of the last step: a denoiser returning a constant c at the last t
    (and junk before) gives exactly head(clamp(c, −1, 1))."""

    def fn(z: Tensor, x: Tensor, t: Tensor, z_sc: Tensor) -> Tensor:
        return torch.full_like(z, value) if int(t[0]) == 99 else 0.1 * z

    net = FakeNet(fn)
    logits = ClusterDiffusion().sample(net, torch.randn(2, 7, 5), 10, generator=torch.Generator().manual_seed(0))
    c = max(-1.0, min(1.0, value))
    assert logits.shape == (2, 7, 3)
    torch.testing.assert_close(logits, net.head(torch.full((2, 7, 4), c)).detach(), rtol=0, atol=0)
    # with the clamp off the constant passes unchanged
    unclamped = ClusterDiffusion(clamp=False).sample(net, torch.randn(2, 7, 5), 10)
    torch.testing.assert_close(unclamped, net.head(torch.full((2, 7, 4), value)).detach(), rtol=0, atol=0)


def test_sample_with_a_constant_denoiser_gives_head_of_the_constant() -> None:
    """Check that a denoiser always returning c ∈ [−1, 1] yields head(c) exactly, whatever the noise."""
    net = FakeNet(lambda z, x, t, z_sc: torch.full_like(z, 0.25))
    logits = ClusterDiffusion().sample(net, torch.randn(3, 4, 5), 25)
    torch.testing.assert_close(logits, net.head(torch.full((3, 4, 4), 0.25)).detach(), rtol=0, atol=0)


@pytest.mark.parametrize("steps", [0, 3, 7, 1001])
def test_sample_rejects_steps_not_dividing_t(steps: int) -> None:
    """Check that steps < 1 or not dividing T raise ValueError (the trailing grid would then differ)."""
    with pytest.raises(ValueError, match="divide"):
        ClusterDiffusion().sample(FakeNet(smooth_fn), torch.randn(1, 2, 5), steps)


def test_sample_is_reproducible_per_generator_seed() -> None:
    """Check that equal generator seeds give identical logits and different seeds different ones."""
    net = AssignmentDenoiser(feat_dim=8, num_clusters=3, emb_dim=4, assign_dim=8).eval()
    x, diffusion = torch.randn(2, 6, 8), ClusterDiffusion()
    with torch.no_grad():
        a, b, c = (diffusion.sample(net, x, 10, generator=torch.Generator().manual_seed(s)) for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def reference_ddim(
    fn: Callable[..., Tensor], x: Tensor, steps: int, emb_dim: int, generator: torch.Generator
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """The card's §1 teacher sampling in float64: returns the z and z_sc fed to the net at each step and the last ẑ0.

    Noise is drawn like ``sample`` does: the start z first, then one draw per step (also the last, unused).
    """
    a = official_alpha_bar()
    times = list(reversed(torch.linspace(-1, T - 1, steps + 1).int().tolist()))
    shape = (*x.shape[:-1], emb_dim)
    z = (R_SCALE * torch.randn(shape, generator=generator)).double()
    z_sc = torch.zeros_like(z)
    zs, z_scs = [], []
    z0 = z
    for t, t_next in zip(times[:-1], times[1:]):
        zs.append(z), z_scs.append(z_sc)
        z0 = fn(z, x.double(), torch.full((x.shape[0],), t), z_sc).clamp(-1, 1)
        xi = torch.randn(shape, generator=generator).double()
        if t_next < 0:
            z = z0
            continue
        at, an = a[t], a[t_next]
        eps = (z / at.sqrt() - z0) / (1 / at - 1).sqrt()
        sigma = ((1 - at / an) * (1 - an) / (1 - at)).sqrt()
        c = (1 - an - sigma**2).sqrt()
        z = an.sqrt() * z0 + c * eps + sigma * R_SCALE * xi
        z_sc = z0
    return zs, z_scs, z0


@pytest.mark.parametrize("steps", [2, 5])
def test_sample_matches_a_hand_written_ddim_eta_one_reference(steps: int) -> None:
    """Check the sampler against the card's formulas ε̂ = (z/√ᾱ_t − ẑ0)/√(1/ᾱ_t − 1), σ, c and
    z ← √ᾱ_t' ẑ0 + c ε̂ + σ r ξ, with self-conditioning on the clamped ẑ0 and logits head(ẑ0) of the last step."""
    x = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(1))
    net = FakeNet(smooth_fn)
    logits = ClusterDiffusion().sample(net, x, steps, generator=torch.Generator().manual_seed(7))
    zs, z_scs, z0 = reference_ddim(smooth_fn, x, steps, 4, torch.Generator().manual_seed(7))
    assert len(net.calls) == steps
    for (z, _, z_sc), z_ref, z_sc_ref in zip(net.calls, zs, z_scs):
        torch.testing.assert_close(z.double(), z_ref, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(z_sc.double(), z_sc_ref, rtol=1e-4, atol=1e-4)
    assert bool((z_scs[-1].abs() == 1).any())  # the clamp was active on the self-conditioning input
    torch.testing.assert_close(logits, net.head(z0.float()).detach(), rtol=1e-4, atol=1e-4)
    # the chain really moved z away from pure rescaled noise: the reference without the √ᾱ' ẑ0 + c ε̂ part differs
    assert not torch.allclose(net.calls[1][0], zs[0].float(), atol=1.0)


def test_sample_backpropagates_through_the_whole_chain() -> None:
    """Check that under grad mode a parameter used only at the first step gets a gradient (through z and z_sc), that
    every part of a real denoiser does, and that no_grad gives logits without a graph."""
    first = nn.Parameter(torch.tensor(0.9))

    def fn(z: Tensor, x: Tensor, t: Tensor, z_sc: Tensor) -> Tensor:
        out = torch.tanh(0.02 * z + 0.5 * z_sc + x[..., :4])
        return out * first if int(t[0]) == 999 else out

    x = torch.randn(2, 5, 6)
    ClusterDiffusion().sample(FakeNet(fn), x, 4, generator=torch.Generator().manual_seed(0)).sum().backward()
    assert first.grad is not None and float(first.grad.abs()) > 0
    net = AssignmentDenoiser(feat_dim=8, num_clusters=3, emb_dim=4, assign_dim=8).eval()
    ClusterDiffusion().sample(net, torch.randn(2, 5, 8), 5).pow(2).sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name
    with torch.no_grad():
        assert not ClusterDiffusion().sample(net, torch.randn(2, 5, 8), 5).requires_grad


# ------------------------------------------------------------------------------------------------ loss
def official_extended_new_loss_newnew(
    p1: Tensor, p2: Tensor, w: Tensor | None, row: float, col: float, swap_weights: bool = False
) -> Tensor:
    """A line-by-line transcription of the official ``loss_utils.extended_new_loss_newnew`` (teacher p1, student p2);
    ``swap_weights`` broadcasts the weights the wrong way round ([1,S] for l1, [S,1] for l2)."""
    logs_1 = torch.log(p1.shape[1] / p1.shape[-1] * F.normalize(F.softmax(p1 / row, -1), p=1, dim=1, eps=1e-8) + 1e-8)
    logs_2 = torch.log(p1.shape[1] / p1.shape[-1] * F.normalize(F.softmax(p2 / row, -1), p=1, dim=1, eps=1e-8) + 1e-8)
    logs_1, logs_2 = logs_1.unsqueeze(1), logs_2.unsqueeze(0)
    norm_1 = F.normalize(F.softmax(p1 / col, 1), p=1, dim=2, eps=1e-8).unsqueeze(1)
    norm_2 = F.normalize(F.softmax(p2 / col, 1), p=1, dim=2, eps=1e-8).unsqueeze(0)
    l_1 = -torch.mean(torch.sum(norm_1 * logs_2, dim=3), dim=-1)
    l_2 = -torch.mean(torch.sum(norm_2 * logs_1, dim=3), dim=-1)
    if w is None:
        return (l_1.mean() + l_2.mean()) / 2
    w1, w2 = (w.unsqueeze(0), w.unsqueeze(1)) if swap_weights else (w.unsqueeze(1), w.unsqueeze(0))
    return ((l_1 * w1).mean() + (l_2 * w2).mean()) / 2


@pytest.mark.parametrize("taus", [(0.1, 0.05), (0.3, 0.2)])
def test_row_column_ce_matches_the_official_loss(taus: tuple[float, float]) -> None:
    """Check row_column_ce against the official function with and without [S] weights broadcast [S,1] / [1,S]."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(3, 40, 5, generator=g), torch.randn(3, 40, 5, generator=g)
    w = torch.rand(3, generator=g) + 0.1
    for weights in (None, w):
        expected = official_extended_new_loss_newnew(p, q, weights, *taus)
        torch.testing.assert_close(row_column_ce(p, q, weights, *taus), expected, rtol=1e-6, atol=1e-7)
    # the comparison can see the broadcasting: the wrong one ([1,S] for l1, [S,1] for l2) or no weights differ
    loss = row_column_ce(p, q, w, *taus).item()
    assert abs(loss - official_extended_new_loss_newnew(p, q, w, *taus, swap_weights=True).item()) > 1e-4
    assert abs(loss - row_column_ce(p, q, None, *taus).item()) > 1e-4


def test_row_column_ce_is_lower_for_agreeing_logits() -> None:
    """Check that identical teacher/student logits give a lower loss than cluster- or row-permuted ones."""
    p = 3 * torch.randn(2, 64, 4, generator=torch.Generator().manual_seed(0))
    same = row_column_ce(p, p)
    assert same < row_column_ce(p, p.roll(1, dims=-1))
    assert same < row_column_ce(p, p[:, torch.randperm(64, generator=torch.Generator().manual_seed(1))])


def test_row_column_ce_rejects_bad_shapes() -> None:
    """Check that teacher/student shape mismatches and non-3-D logits raise ValueError."""
    with pytest.raises(ValueError, match=r"\(S, B, K\)"):
        row_column_ce(torch.randn(2, 8, 4), torch.randn(2, 8, 5))
    with pytest.raises(ValueError, match=r"\(S, B, K\)"):
        row_column_ce(torch.randn(8, 4), torch.randn(8, 4))


# ------------------------------------------------------------------------------------------------ student view
def test_perturb_features_adds_one_noise_scale_per_copy() -> None:
    """Check that with no masking the added noise has the same norm s for every row of a copy, s ∈ [0.2, 1.0],
    and that the copies draw different scales."""
    x = F.normalize(torch.randn(6, 50, 16, generator=torch.Generator().manual_seed(0)), dim=-1)
    y = perturb_features(x, drop=(0.0, 0.0), generator=torch.Generator().manual_seed(1))
    norms = (y - x).norm(dim=-1)  # (S, B)
    torch.testing.assert_close(norms, norms[:, :1].expand_as(norms), rtol=1e-5, atol=1e-6)
    scales = norms[:, 0]
    assert bool((scales >= 0.2).all()) and bool((scales <= 1.0).all())
    assert float(scales.max() - scales.min()) > 0.05
    wide = perturb_features(x, noise=(3.0, 3.0), drop=(0.0, 0.0), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close((wide - x).norm(dim=-1), torch.full((6, 50), 3.0), rtol=1e-5, atol=1e-5)


def test_perturb_features_masks_without_rescaling_at_a_rate_per_copy() -> None:
    """Check that the mask zeroes entries and keeps the others equal to the noisy values (no 1/(1−p) rescale), with
    a drop rate per copy within [0.05, 0.10] (up to sampling error) that differs between copies."""
    x = F.normalize(torch.randn(8, 256, 200, generator=torch.Generator().manual_seed(0)), dim=-1)
    y = perturb_features(x, generator=torch.Generator().manual_seed(3))
    noisy = perturb_features(x, drop=(0.0, 0.0), generator=torch.Generator().manual_seed(3))  # same draws, no mask
    kept = y != 0
    assert torch.equal(y[kept], noisy[kept])
    rates = 1 - kept.float().mean((1, 2))
    assert bool((rates > 0.045).all()) and bool((rates < 0.105).all()), rates
    assert float(rates.max() - rates.min()) > 0.005  # one rate per copy, not one for all
    assert 0.05 < float(rates.mean()) < 0.10
    assert perturb_features(x[:1, :4]).shape == (1, 4, 200)  # the global RNG path works too


# ------------------------------------------------------------------------------------------------ denoiser
def test_embed_has_norm_sqrt_e_and_fixed_codes() -> None:
    """Check that Emb(p) has norm √E for one-hot and soft p, and that the codes are a unit-row buffer, not trained."""
    net = AssignmentDenoiser(feat_dim=8, num_clusters=5, emb_dim=16, assign_dim=8, seed=3)
    probs = torch.cat([torch.eye(5), torch.randn(7, 5).softmax(-1)])
    emb = net.embed(probs)
    assert emb.shape == (12, 16)
    torch.testing.assert_close(emb.norm(dim=-1), torch.full((12,), 4.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(emb[:5], 4.0 * net.codes)  # one-hot p picks √E μ̂_k
    assert "codes" in dict(net.named_buffers()) and "codes" not in dict(net.named_parameters())
    assert all(p is not net.codes for p in net.parameters())
    torch.testing.assert_close(net.codes.norm(dim=-1), torch.ones(5))
    same = AssignmentDenoiser(feat_dim=8, num_clusters=5, emb_dim=16, assign_dim=8, seed=3)
    other = AssignmentDenoiser(feat_dim=8, num_clusters=5, emb_dim=16, assign_dim=8, seed=4)
    assert torch.equal(net.codes, same.codes) and not torch.equal(net.codes, other.codes)


def test_denoiser_renormalises_its_features_and_checks_shapes() -> None:
    """Check that scaling x leaves the eval output unchanged, that the output is (S, B, E), and that a wrong feature
    width, mismatched z_t or K < 2 raise ValueError."""
    net = AssignmentDenoiser(feat_dim=8, num_clusters=3, emb_dim=4, assign_dim=8).eval()
    z, x, t = torch.randn(2, 5, 4), torch.randn(2, 5, 8), torch.tensor([10, 700])
    out = net(z, x, t)
    assert out.shape == (2, 5, 4) and net.head(out).shape == (2, 5, 3)
    torch.testing.assert_close(net(z, 3 * x, t), out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(net(z, x, t, torch.zeros_like(z)), out)  # z_sc=None means zeros
    assert not torch.allclose(net(z, x, torch.tensor([11, 700])), out)  # t enters
    assert not torch.allclose(net(z, x, t, torch.ones_like(z)), out)  # self-conditioning enters
    with pytest.raises(ValueError, match="8"):
        net(z, torch.randn(2, 5, 9), t)
    with pytest.raises(ValueError, match="z_t"):
        net(torch.randn(2, 4, 4), x, t)
    with pytest.raises(ValueError, match="at least 2"):
        AssignmentDenoiser(feat_dim=8, num_clusters=1)
    net.train()
    assert not torch.equal(net(z, x, t), net(z, x, t))  # dropout is active in training
