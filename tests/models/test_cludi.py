"""Tests of CLUDI (clustering via self-supervised diffusion): the sqrt schedule, the rescaled forward process and
min-SNR weights, the η = 1 DDIM sampler against a hand-written reference, the row/column-normalised loss against the
official ``extended_new_loss_newnew``, the student's feature views, the denoiser and the Lightning module (teacher
gradients, EMA teacher, ablation, per-parameter clipping, metrics bookkeeping)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from lightning import Trainer
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel

from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.models.cludi import (
    AssignmentDenoiser,
    CLUDIModule,
    ClusterDiffusion,
    perturb_features,
    row_column_ce,
    sqrt_schedule_betas,
)

T, R_SCALE = 1000, 49.0
SMALL = dict(num_clusters=3, feat_dim=8, emb_dim=4, batch_diffusion=2, train_steps=5, eval_steps=5, eval_samples=2)


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


def small_module(**kwargs) -> CLUDIModule:
    torch.manual_seed(0)
    return CLUDIModule(**{**SMALL, **kwargs})


def batch(n: int = 24, feat_dim: int = 8, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, feat_dim, generator=g), torch.randint(0, 3, (n,), generator=g)


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


# ------------------------------------------------------------------------------------------------ module
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_clusters=1), "at least 2"),
        (dict(train_steps=3), "train_steps"),
        (dict(eval_steps=7), "eval_steps"),
        (dict(teacher="momentum"), "teacher"),
        (dict(mode="diffuse"), "mode"),
        (dict(eval_samples=0), "eval_samples"),
    ],
)
def test_module_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    """Check that K < 2, steps not dividing T, unknown teacher or mode and zero samples raise ValueError."""
    with pytest.raises(ValueError, match=match):
        CLUDIModule(**{**SMALL, **kwargs})


def test_forward_is_deterministic_and_checks_feature_width() -> None:
    """Check that forward returns (B, K), repeats exactly, accepts an (x, y) batch, and names the expected width."""
    model = small_module().eval()
    x, y = batch(7)
    a = model(x)
    assert a.shape == (7, 3) and torch.equal(a, model(x)) and torch.equal(a, model((x, y)))
    assert not torch.equal(a, model(x, generator=torch.Generator().manual_seed(5)))
    # the mean of eval_samples chains of eval_steps steps over the L2-normalised rows, seeded with `seed`
    copies = F.normalize(x, dim=-1).expand(2, -1, -1)
    chains = model.diffusion.sample(model.net, copies, 5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a, chains.mean(0))
    with pytest.raises(ValueError, match="8-d features"):
        model(torch.randn(7, 9))


def test_cluster_and_predict_give_argmax_labels_and_normalised_probs() -> None:
    """Check that cluster() returns argmax labels of the mean logits and softmax probabilities summing to 1, and that
    predict_step on batch 0 agrees with it."""
    model = small_module().eval()
    x, y = batch(9)
    labels, probs = model.cluster(x)
    logits = model(x)
    assert torch.equal(labels, logits.argmax(-1)) and torch.equal(labels, probs.argmax(-1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(9))
    torch.testing.assert_close(probs, logits.softmax(-1))
    out = model.predict_step((x, y), 0)
    assert torch.equal(out["labels"], labels) and torch.allclose(out["probs"], probs)


def test_per_parameter_clipping() -> None:
    """Check that on_before_optimizer_step clips each parameter's gradient to norm ≤ 4 separately, keeps the direction,
    leaves small gradients untouched and does nothing when clip_per_param = 0."""
    model = small_module()
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=g) for p in params]
    grads = [gr / gr.norm() * (100.0 if i % 2 else 0.5) for i, gr in enumerate(grads)]
    for p, gr in zip(params, grads):
        p.grad = gr.clone()
    model.on_before_optimizer_step(None)
    for i, (p, gr) in enumerate(zip(params, grads)):
        if i % 2:
            assert float(p.grad.norm()) == pytest.approx(4.0, abs=1e-4)
            torch.testing.assert_close(p.grad, gr * (4.0 / 100.0), rtol=1e-4, atol=1e-7)
        else:
            assert torch.equal(p.grad, gr)
    off = small_module(clip_per_param=0.0)
    for p, gr in zip(off.parameters(), grads):
        p.grad = gr.clone()
    off.on_before_optimizer_step(None)
    assert all(torch.equal(p.grad, gr) for p, gr in zip(off.parameters(), grads))


def training_grads(model: CLUDIModule, seed: int = 0) -> tuple[float, dict[str, Tensor]]:
    """Loss and gradients of one training_step of ``model`` (train mode) on a fixed batch under ``seed``."""
    model.train().zero_grad()
    torch.manual_seed(seed)
    loss = model.training_step(batch(24), 0)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.net.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:.*self.log.*")
def test_teacher_gradients_flow_unless_detached() -> None:
    """Check that detach_teacher=False (official) and True give the same loss on the same seed but different gradients
    (the teacher path), and that the student's train mode is restored after the eval-mode teacher."""
    attached, detached = small_module(), small_module(detach_teacher=True)
    detached.load_state_dict(attached.state_dict())
    loss_a, grads_a = training_grads(attached)
    loss_d, grads_d = training_grads(detached)
    assert math.isfinite(loss_a) and loss_a == pytest.approx(loss_d, rel=1e-6)
    assert grads_a.keys() == grads_d.keys() and "head.weight" in grads_a
    diff = sum(float((grads_a[n] - grads_d[n]).abs().sum()) for n in grads_a)
    assert diff > 1e-6
    assert attached.net.training and all(m.training for m in attached.net.modules())
    assert float(grads_a["features.0.weight"].abs().sum()) > 0  # the student's feature path is trained


@pytest.mark.filterwarnings("ignore:.*self.log.*")
def test_ema_teacher_is_an_averaged_copy_updated_after_each_batch() -> None:
    """Check that teacher="ema" keeps an AveragedModel that samples the teacher without gradients and moves by
    EMA after on_train_batch_end (the first update copies the weights)."""
    model = small_module(teacher="ema", ema_decay=0.9)
    assert isinstance(model.ema, AveragedModel) and small_module().ema is None
    loss, grads = training_grads(model)
    assert math.isfinite(loss) and grads
    assert all(p.grad is None for p in model.ema.parameters())
    with torch.no_grad():  # the teacher is the EMA copy: changing it changes the loss on the same seed
        model.ema.module.head.weight.mul_(-2.0)
    assert training_grads(model)[0] != pytest.approx(loss, rel=1e-6)
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.5)
    model.on_train_batch_end(None, None, 0)
    torch.testing.assert_close(model.ema.module.head.weight, model.net.head.weight)  # first update copies
    before = model.ema.module.head.weight.detach().clone()
    with torch.no_grad():
        model.net.head.weight.add_(1.0)
    model.on_train_batch_end(None, None, 1)
    torch.testing.assert_close(model.ema.module.head.weight, 0.9 * before + 0.1 * model.net.head.weight)


@pytest.mark.filterwarnings("ignore:.*self.log.*")
def test_no_diffusion_ablation_never_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that mode="no_diffusion" trains (finite loss, gradients) and predicts without the diffusion sampler."""
    model = small_module(mode="no_diffusion")

    def forbidden(*args, **kwargs):
        raise AssertionError("the no-diffusion ablation called the sampler")

    monkeypatch.setattr(model.diffusion, "sample", forbidden)
    loss, grads = training_grads(model)
    assert math.isfinite(loss) and float(grads["head.weight"].abs().sum()) > 0
    x, _ = batch(10)
    labels, probs = model.eval().cluster(x)
    assert labels.shape == (10,) and probs.shape == (10, 3)
    torch.testing.assert_close(model(x), model(x))


@pytest.mark.filterwarnings("ignore:.*self.log.*")
@pytest.mark.parametrize("self_cond_prob", [0.0, 1.0])
def test_training_loss_is_the_cards_composition(monkeypatch: pytest.MonkeyPatch, self_cond_prob: float) -> None:
    """Check the training loss against the card's steps 4–7 with the teacher chain, the student view and t stubbed:
    L = mean_s w(t_s)·mean_{b,e}(Emb(softmax(ℓ^S/0.1)) − Emb(softmax(ℓ^T/0.1)))² + 50·L_ce(ℓ^T, ℓ^S, w(t)), where
    ℓ^S = head(f(z_t, x̃, t, z_sc)), z_t = q_sample(Emb(softmax(ℓ^T/0.1)), t, ε) and z_sc = 0 or f(z_t, x̃, t, 0);
    the teacher is sampled in eval mode on the clean, L2-normalised copies with train_steps steps."""
    model = small_module(dropout=0.0, self_cond_prob=self_cond_prob, batch_diffusion=3).train()
    x, y = batch(24)
    g = torch.Generator().manual_seed(5)
    teacher_logits = 3 * torch.randn(3, 24, 3, generator=g)
    t = torch.tensor([5, 400, 990])
    seen: dict[str, object] = {}

    def fake_sample(net: nn.Module, xs: Tensor, steps: int, head: Callable | None = None) -> Tensor:
        seen.update(x=xs, steps=steps, training=net.training)
        return teacher_logits

    monkeypatch.setattr(model.diffusion, "sample", fake_sample)
    monkeypatch.setattr("zoo.models.cludi.module.perturb_features", lambda xs, *args: 2 * xs)
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: t)
    torch.manual_seed(0)
    loss = model.training_step((x, y), 0)
    torch.manual_seed(0)
    eps = torch.randn(3, 24, 4)  # the only global draw before the self-conditioning coin
    clean = F.normalize(x, dim=-1).expand(3, -1, -1)
    assert seen["steps"] == 5 and seen["training"] is False and torch.allclose(seen["x"], clean)
    net, diffusion = model.net, model.diffusion
    with torch.no_grad():
        target = net.embed((teacher_logits / 0.1).softmax(-1))
        z_t = diffusion.q_sample(target, t, eps)
        z_sc = net(z_t, 2 * clean, t, torch.zeros_like(z_t)) if self_cond_prob else torch.zeros_like(z_t)
        student = net.head(net(z_t, 2 * clean, t, z_sc))
        w = diffusion.weights(t)
        loss_diff = (w * ((net.embed((student / 0.1).softmax(-1)) - target) ** 2).mean((1, 2))).mean()
        expected = loss_diff + 50.0 * official_extended_new_loss_newnew(teacher_logits, student, w, 0.1, 0.05)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_training_step_rejects_small_batches() -> None:
    """Check that a batch of fewer than 2K rows raises ValueError whose message asks for the 2K rows it checks."""
    model = small_module().train()
    k = model.hparams.num_clusters
    with pytest.raises(ValueError, match=rf"batch of {2 * k - 1} rows .* at least 2·K = {2 * k} rows"):
        model.training_step(batch(2 * k - 1), 0)
    assert torch.isfinite(model.training_step(batch(2 * k), 0))  # exactly 2K rows is accepted


def test_short_fit_on_digits_logs_finite_losses() -> None:
    """Check that a 2-epoch Lightning fit on the digits features runs, changes the weights and logs finite
    train/loss_diff, train/loss_ce and the teacher NMI."""
    torch.manual_seed(0)
    model = CLUDIModule(num_clusters=10, feat_dim=64, emb_dim=16, batch_diffusion=2, train_steps=5, eval_steps=5)
    before = model.net.head.weight.detach().clone()
    trainer = Trainer(
        max_epochs=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, FeatureClusteringDataModule(batch_size=256))
    metrics = trainer.callback_metrics
    for key in ("train/loss_diff", "train/loss_ce", "train/loss", "train/nmi_teacher"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert trainer.global_step == 10  # 2 epochs × 5 full batches of 256 (1437 rows, the last partial one dropped)
    assert not torch.equal(before, model.net.head.weight)


# ------------------------------------------------------------------------------------------------ metrics
def hungarian_accuracy(labels: np.ndarray, target: np.ndarray) -> float:
    """Accuracy of the best one-to-one matching of clusters to classes."""
    k = max(labels.max(), target.max()) + 1
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (labels, target), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return counts[rows, cols].sum() / len(labels)


@pytest.mark.parametrize("mode, batch_size", [("diffusion", 512), ("no_diffusion", 128)])
def test_test_metrics_agree_with_sklearn_on_cluster_labels(mode: str, batch_size: int) -> None:
    """Check that the logged test accuracy, NMI, ARI and clusters_used equal scipy/sklearn recomputations from
    model.cluster(x) on the test features (one test batch for diffusion, so the seeded chains coincide; several for
    the deterministic ablation, so the accumulation over batches is checked)."""
    torch.manual_seed(0)
    model = CLUDIModule(num_clusters=10, feat_dim=64, emb_dim=16, eval_samples=4, eval_steps=10, mode=mode)
    with torch.no_grad():  # an untrained net puts every row in one cluster: amplify the features' say in ẑ0
        model.net.features[4].weight.mul_(30.0)
        model.net.head.weight.mul_(10.0)
    dm = FeatureClusteringDataModule(batch_size=batch_size)
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    result = trainer.test(model, dm, verbose=False)[0]
    x, y = dm.test_set.tensors
    labels = model.eval().cluster(x)[0].numpy()
    assert len(np.unique(labels)) >= 3  # not a degenerate single-cluster check
    y = y.numpy()
    assert result["test/accuracy"] == pytest.approx(hungarian_accuracy(labels, y), abs=1e-5)
    assert result["test/nmi"] == pytest.approx(normalized_mutual_info_score(y, labels), abs=1e-4)
    assert result["test/ari"] == pytest.approx(adjusted_rand_score(y, labels), abs=1e-4)
    shares = np.bincount(labels, minlength=10) / len(labels)
    assert result["test/clusters_used"] == pytest.approx(float((shares >= 0.02).mean()), abs=1e-6)
