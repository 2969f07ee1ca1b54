"""Tests of CLUDI's Lightning module (split from ``test_cludi.py``, which tests the schedule, sampler, loss, student
views and denoiser): argument checks, inference, per-parameter clipping, teacher gradients, the EMA teacher, the
no-diffusion ablation, the training loss against independent arithmetic from the card's §1, the student's timestep
draws, a short fit, and the test metrics against scipy/sklearn."""

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
from zoo.models.cludi import CLUDIModule

T, R_SCALE = 1000, 49.0
SMALL = dict(num_clusters=3, feat_dim=8, emb_dim=4, batch_diffusion=2, train_steps=5, eval_steps=5, eval_samples=2)


def small_module(**kwargs) -> CLUDIModule:
    torch.manual_seed(0)
    return CLUDIModule(**{**SMALL, **kwargs})


def batch(n: int = 24, feat_dim: int = 8, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, feat_dim, generator=g), torch.randint(0, 3, (n,), generator=g)


# ------------------------------------------------------------------------------------------------ card arithmetic
def card_alpha_bar(steps: int = T) -> Tensor:
    """ᾱ_t in float64 from the card's closed form: ᾱ(s) = 1 − √(s + 1e-4), β_i = min(1 − ᾱ((i+1)/T)/ᾱ(i/T), 0.999),
    ᾱ_t = Π_{i≤t} (1 − β_i)."""
    s = torch.arange(steps + 1, dtype=torch.float64) / steps
    continuous = 1 - torch.sqrt(s + 1e-4)
    betas = (1 - continuous[1:] / continuous[:-1]).clamp(max=0.999)
    return torch.cumprod(1 - betas, 0)


def card_embed(probs: Tensor, mu: Tensor) -> Tensor:
    """Emb(p) = √E · normalize(p μ̂) with μ̂ the row-normalised codes ``mu`` ``(K, E)``: norm √E whatever p."""
    mu_hat = mu / mu.norm(dim=-1, keepdim=True)
    mixed = probs @ mu_hat
    return math.sqrt(mu.shape[-1]) * mixed / mixed.norm(dim=-1, keepdim=True)


def card_row_column_ce(teacher: Tensor, student: Tensor, w: Tensor, tau_row: float, tau_col: float) -> Tensor:
    """The card's §1 step 6, copy pair by copy pair, independently of ``losses.py``: teacher P_i and student Q_j
    ``(B, K)``, log_row(A) = log((B/K)·colnorm_B(softmax_K(A/τ_r)) + 1e-8), tgt(A) = rownorm_K(softmax_B(A/τ_c)),
    l1_ij = −mean_b Σ_k tgt(P_i) log_row(Q_j), l2_ij = −mean_b Σ_k tgt(Q_j) log_row(P_i),
    L_ce = ½ [Σ_ij l1_ij w_i / S² + Σ_ij l2_ij w_j / S²].

    Both L1 normalisations divide by max(sum, 1e-8), as the official ``F.normalize(p=1, eps=1e-8)`` does: it matters
    for tgt, where a row far from every cluster's top of the batch-softmax (τ_c = 0.05) has a total mass under 1e-8.
    """
    s, b, k = teacher.shape

    def log_row(a: Tensor) -> Tensor:
        p = torch.softmax(a / tau_row, dim=1)  # over clusters
        column = p / p.sum(0, keepdim=True).clamp(min=1e-8)  # each cluster's column sums to 1 over the batch
        return torch.log(b / k * column + 1e-8)

    def tgt(a: Tensor) -> Tensor:
        q = torch.softmax(a / tau_col, dim=0)  # over the batch
        return q / q.sum(1, keepdim=True).clamp(min=1e-8)

    total1 = total2 = torch.zeros((), dtype=teacher.dtype)
    for i in range(s):
        for j in range(s):
            l1 = -(tgt(teacher[i]) * log_row(student[j])).sum(1).mean()
            l2 = -(tgt(student[j]) * log_row(teacher[i])).sum(1).mean()
            total1 = total1 + l1 * w[i]
            total2 = total2 + l2 * w[j]
    return (total1 + total2) / (2 * s * s)


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
    """Check the training loss against the card's §1 steps 2–7 recomputed by hand (float64, no module helpers but the
    network's forward and head): with the teacher chain stubbed to fixed logits ℓ^T and the student view stubbed to a
    fixed signed permutation of the feature coordinates,
    L = (1/S) Σ_s w_s · mean_{b,e}(Emb(softmax(ℓ^S/0.1)) − z_0)² + 50 · L_ce(ℓ^T, ℓ^S, w), where z_0 =
    Emb(softmax(ℓ^T/0.1)), z_t = √ᾱ_t z_0 + √(1−ᾱ_t)·49·ε, w_s = min(SNR_{t_s}, 5)/49, ℓ^S = head(f(z_t, x̃, t, z_sc))
    with z_sc = 0 or f(z_t, x̃, t, 0), t ~ U{0..T−1} per copy and ε ~ N(0, I) replayed from the seed. The teacher
    must see the clean L2-normalised copies in eval mode with train_steps steps.

    The student view is a signed permutation, not a rescale: the denoiser L2-normalises its features, which erases a
    scale, so with a ``2·x`` stub a student fed the clean copies instead of x̃ gives the same loss."""
    model = small_module(dropout=0.0, self_cond_prob=self_cond_prob, batch_diffusion=3).train()
    with torch.no_grad():  # an untrained net's logits hardly depend on x or z_t: amplify both, so a wrong input shows
        model.net.features[4].weight.mul_(30.0)
        model.net.assignments[4].weight.mul_(10.0)
        model.net.head.weight.mul_(10.0)
    s, b, k, e = 3, 24, 3, 4
    x, y = batch(b)
    teacher_logits = 3 * torch.randn(s, b, k, generator=torch.Generator().manual_seed(5))
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    signs = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0])
    seen: dict[str, object] = {}

    def fake_sample(net: nn.Module, xs: Tensor, steps: int, head: Callable | None = None) -> Tensor:
        seen.update(teacher_x=xs.detach().clone(), steps=steps, training=net.training)
        return teacher_logits

    def fake_view(xs: Tensor, noise: tuple[float, float], drop: tuple[float, float]) -> Tensor:
        seen.update(view_x=xs.detach().clone(), noise=noise, drop=drop)
        return xs[..., perm] * signs

    monkeypatch.setattr(model.diffusion, "sample", fake_sample)
    monkeypatch.setattr("zoo.models.cludi.module.perturb_features", fake_view)
    torch.manual_seed(0)
    loss = model.training_step((x, y), 0)

    # the view and the teacher are stubbed and dropout is 0, so the step's only global draws before the
    # self-conditioning coin are t ~ U{0..T−1} per copy, then ε: replay them (seed 0 gives t = 44, 239, 933, so
    # weights of 0.079, 0.022 and 0.0007)
    torch.manual_seed(0)
    t = torch.randint(0, T, (s,))
    eps = torch.randn(s, b, e).double()
    clean = F.normalize(x.double(), dim=-1).expand(s, -1, -1)
    assert seen["steps"] == 5 and seen["training"] is False
    torch.testing.assert_close(seen["teacher_x"].double(), clean)  # teacher: clean copies
    torch.testing.assert_close(seen["view_x"].double(), clean)  # the view is taken of the clean copies
    assert seen["noise"] == (0.2, 1.0) and seen["drop"] == (0.05, 0.10)
    student_x = (clean[..., perm] * signs.double()).float()

    a = card_alpha_bar()[t].view(s, 1, 1)
    w = ((a / (1 - a)).clamp(max=5.0) / R_SCALE).view(s)
    mu = model.net.codes.double()
    z0 = card_embed((teacher_logits.double() / 0.1).softmax(-1), mu)
    z_t = (a.sqrt() * z0 + (1 - a).sqrt() * R_SCALE * eps).float()
    with torch.no_grad():  # the network is the black box; everything around it is the card's arithmetic
        z_sc = torch.zeros(s, b, e)
        if self_cond_prob:
            z_sc = model.net(z_t, student_x, t, z_sc)
        student = model.net.head(model.net(z_t, student_x, t, z_sc)).double()
    z_loop = card_embed((student / 0.1).softmax(-1), mu)
    loss_diff = sum(w[i] * ((z_loop[i] - z0[i]) ** 2).mean() for i in range(s)) / s
    loss_ce = card_row_column_ce(teacher_logits.double(), student, w, 0.1, 0.05)
    expected = loss_diff + 50.0 * loss_ce
    assert float(loss_diff) > 1e-3 and float(50.0 * loss_ce) > 1e-3  # both terms take part in the comparison
    # float32 against float64 differs by ~1e-6 relative; the subtlest wrong composition tried (the self-conditioning
    # pass on the clean copies) moves the loss by 7.5e-4, a student on the clean copies by 0.3
    torch.testing.assert_close(loss.detach().double(), expected, rtol=5e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:.*self.log.*")
def test_student_timesteps_are_uniform_over_zero_to_t(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check, with torch.randint left alone, that the student's timesteps (the ``t`` each training step hands to
    ``q_sample``) are one long per copy and cover {0..T−1} as a uniform draw does: 50 steps × 16 copies = 800
    draws. A sampler restricted to a sub-range (t < 100, say) or one t shared by all copies fails.

    Bounds for 800 uniform draws (seeded, so the outcome is fixed; these are the odds that a correct sampler fails):
    P(min ≥ 50) = 0.95^800 ≈ 2e-18 and P(max ≤ 950) = 0.951^800 ≈ 4e-18; the share of t ≥ 500 has sd 0.5/√800 ≈
    0.018, so ±0.1 is 5.7 σ (p ≈ 2e-8); Pearson's χ² over 10 equal bins (80 expected each, 9 dof) exceeds 45 with
    p ≈ 1e-6. The 16 draws of one step are all equal with p = 1e-45."""
    model = CLUDIModule(
        num_clusters=3, feat_dim=8, emb_dim=4, batch_diffusion=16, train_steps=1, eval_steps=1, eval_samples=1
    ).train()
    draws: list[Tensor] = []
    q_sample = model.diffusion.q_sample

    def recording_q_sample(z0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        draws.append(t.detach().clone())
        return q_sample(z0, t, noise)

    monkeypatch.setattr(model.diffusion, "q_sample", recording_q_sample)
    x = batch(6)[0]  # 2·K rows, the smallest batch accepted; no labels, so no monitoring NMI per step
    steps = 50
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(steps):
            model.training_step(x, 0)
    assert len(draws) == steps
    assert all(t.shape == (16,) and t.dtype == torch.long for t in draws)
    assert all(len(set(t.tolist())) > 1 for t in draws)  # a t per copy, not one per step
    t = torch.cat(draws)
    assert int(t.min()) >= 0 and int(t.max()) <= T - 1
    assert int(t.min()) < 50 and int(t.max()) > 950, (int(t.min()), int(t.max()))
    above = float((t >= T // 2).float().mean())
    assert abs(above - 0.5) < 0.1, above
    counts = torch.bincount(t // (T // 10), minlength=10).double()
    expected = len(t) / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.0, (chi2, counts.tolist())


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
