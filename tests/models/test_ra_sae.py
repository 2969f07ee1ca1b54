"""The RA-SAE maths: the archetypal constraints, the projection order, its numerical traps, the eval cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from zoo.datamodules.activations import make_sparse_concepts
from zoo.models.ra_sae import FreeDictionary, RelaxedArchetypalDictionary, SparseAutoencoder, TopKEncoder, sae_loss
from zoo.models.ra_sae.reproduce import train_arm


def _in_hull(points: np.ndarray, C: np.ndarray, tol: float = 1e-5) -> bool:
    """True when every row of ``points`` is a convex combination of rows of ``C`` (one LP per point)."""
    n = C.shape[0]
    A_eq = np.vstack([C.T, np.ones((1, n))])
    for p in points:
        res = linprog(np.zeros(n), A_eq=A_eq, b_eq=np.append(p, 1.0), bounds=[(0, None)] * n, method="highs")
        if res.status != 0 or np.abs(A_eq @ res.x - np.append(p, 1.0)).max() > tol:
            return False
    return True


@pytest.fixture(scope="module")
def data() -> torch.Tensor:
    return make_sparse_concepts(4000, dim=8, num_atoms=24, seed=1)[0]


@pytest.fixture(scope="module")
def trained(data: torch.Tensor) -> dict[str, tuple]:
    """One short training per arm on small data (shared by the tests below)."""
    return {
        arm: train_arm(data, arm, seed=0, steps=300, num_atoms=16, top_k=2, delta=0.5) for arm in ("a", "ra", "topk")
    }


def test_archetypal_atoms_lie_in_convex_hull_of_candidates(trained: dict) -> None:
    """Check that A-SAE atoms stay convex combinations of C after training (W row-stochastic, Λ ≡ 0, m = 0 scale)."""
    sae = trained["a"][0]
    d = sae.dictionary
    C = d.C.double().numpy()
    atoms = d.W.detach().double().numpy() @ C  # D / e^m: the multiplier only rescales the hull
    assert _in_hull(atoms, C)
    assert not _in_hull(C[:1] + 10 * (C.max(0) - C.min(0)), C)  # the LP does reject a point outside
    assert torch.allclose(d.get_dictionary(), d.W @ d.C * torch.exp(d.m), atol=1e-6)


def test_archetypal_training_moves_atoms_and_keeps_constraints(trained: dict) -> None:
    """Check that training moved W away from the identity while keeping rows stochastic and non-negative."""
    for arm in ("a", "ra"):
        sae, D0, _ = trained[arm]
        W = sae.dictionary.W.detach()
        assert (W >= 0).all()
        torch.testing.assert_close(W.sum(1), torch.ones(W.shape[0]), atol=1e-5, rtol=0)
        assert (W - torch.eye(*W.shape)).abs().max() > 0.01, f"{arm}: W never left its identity init"
        assert (sae.dictionary.get_dictionary() - D0).norm() > 1e-2


def test_stand_in_arms_keep_w_at_the_identity(data: torch.Tensor) -> None:
    """Check the reproduction's RA stand-ins: ``ra-init`` is the untrained RA-SAE (W = I, D = C), and
    ``ra-frozen-w`` trains Λ, m and the encoder but leaves W exactly at the identity."""
    kwargs = {"seed": 0, "steps": 100, "num_atoms": 16, "top_k": 2, "delta": 0.5}
    init, D0, first_r2 = train_arm(data, "ra-init", **kwargs)
    eye = torch.eye(16)
    assert torch.equal(init.dictionary.W.detach(), eye) and np.isnan(first_r2)
    torch.testing.assert_close(init.dictionary.get_dictionary(), init.dictionary.C)
    torch.testing.assert_close(D0, init.dictionary.C)
    frozen, D0_frozen, _ = train_arm(data, "ra-frozen-w", **kwargs)
    d = frozen.dictionary
    assert torch.equal(d.W.detach(), eye), "the frozen W moved"
    assert d.Lambda.detach().norm(dim=1).max() > 1e-3, "Λ should still train with W frozen"
    assert (d.get_dictionary() - D0_frozen).norm() > 1e-2


def test_relaxed_dictionary_rows_stay_within_delta(trained: dict) -> None:
    """Check that every RA-SAE relaxation row satisfies ‖Λ_i‖ ≤ δ: atoms lie within δ·e^m of the scaled hull."""
    sae = trained["ra"][0]
    d = sae.dictionary
    norms = d.Lambda.detach().norm(dim=1)
    assert norms.max() <= 0.5 + 1e-5
    assert norms.max() > 1e-3, "Λ never moved: the relaxation is not trained"
    hull_part = d.W @ d.C * torch.exp(d.m)
    dist = (d.get_dictionary() - hull_part).norm(dim=1)
    assert dist.max() <= 0.5 * float(torch.exp(d.m.detach())) + 1e-5


def test_projection_follows_official_order() -> None:
    """Check the order relu -> row-normalise (+1e-8) -> scale Λ by min(1, δ/‖Λ_i‖), on hand-made values."""
    d = RelaxedArchetypalDictionary(num_atoms=2, candidates=torch.eye(3), delta=1.0)
    with torch.no_grad():
        d.W.copy_(torch.tensor([[2.0, -1.0, 2.0], [0.0, 0.0, 0.0]]))
        d.Lambda.copy_(torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.0, 0.0]]))
    d.project_()
    torch.testing.assert_close(d.W[0], torch.tensor([0.5, 0.0, 0.5]), atol=1e-7, rtol=0)  # relu first, then normalise
    assert torch.equal(d.W[1], torch.zeros(3))  # 0 / (0 + 1e-8) stays 0, no NaN
    torch.testing.assert_close(d.Lambda[0], torch.tensor([0.6, 0.8, 0.0]), atol=1e-6, rtol=0)  # ‖·‖ 5 -> δ = 1
    torch.testing.assert_close(d.Lambda[1], torch.tensor([0.3, 0.0, 0.0]))  # inside the ball: unchanged


@pytest.mark.parametrize("m", [0.5, -0.7])
def test_relaxed_dictionary_is_hull_plus_lambda_times_the_multiplier_by_hand(m: float) -> None:
    """Check D = (W C + Λ)·e^m on hand values, with e^m above and below 1 (Λ added outside the multiplier, or the
    multiplier left out, gives other numbers for either sign of m). W rows are already stochastic and ‖Λ_i‖ ≤ δ, so
    the projection leaves them as set."""
    C = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
    d = RelaxedArchetypalDictionary(num_atoms=2, candidates=C, delta=1.0)
    with torch.no_grad():
        d.W.copy_(torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]))
        d.Lambda.copy_(torch.tensor([[0.3, -0.4], [0.0, 0.1]]))
        d.m.fill_(m)
    # W C = [[0.5, 1.0], [2.25, 1.25]]; + Λ = [[0.8, 0.6], [2.25, 1.35]]; times e^m.
    expected = torch.tensor([[0.8, 0.6], [2.25, 1.35]]) * np.exp(m)
    torch.testing.assert_close(d.eval().get_dictionary(), expected.float(), atol=1e-6, rtol=0)


def test_loaded_sae_refuses_nan_activations() -> None:
    """Check that the module's user entry points refuse a NaN row (it would come back as NaN codes with k atoms
    "active"), naming the row."""
    from zoo.models.ra_sae.module import RASAE

    model = RASAE(dim=8, num_atoms=16, top_k=2, dictionary="free").eval()
    x = torch.randn(5, 8)
    x[3, 2] = float("nan")
    with pytest.raises(ValueError, match=r"activations row 3 holds NaN or inf \(1 of 5 rows\)"):
        model(x)
    with pytest.raises(ValueError, match="row 3"):
        model.reconstruct(x)
    assert model(torch.randn(5, 8)).shape == (5, 16)


def test_archetypal_delta_zero_has_no_nan_and_no_trainable_lambda() -> None:
    """Check that δ = 0 (A-SAE) avoids the official 0/0 trap: Λ is a zero buffer and D stays finite."""
    d = RelaxedArchetypalDictionary(num_atoms=4, candidates=torch.randn(4, 3), delta=0.0)
    assert "Lambda" not in dict(d.named_parameters())
    d.train()
    assert torch.isfinite(d.get_dictionary()).all()


def test_relaxed_dictionary_initialises_extra_rows_when_fewer_candidates() -> None:
    """Check that with n' < k the rows past n' start at the uniform mixture rather than zero atoms."""
    C = torch.randn(3, 5)
    d = RelaxedArchetypalDictionary(num_atoms=5, candidates=C, delta=1.0)
    D = d.get_dictionary()
    torch.testing.assert_close(D[:3], C)
    torch.testing.assert_close(D[3], C.mean(0))


def test_eval_cache_is_detached_and_rebuilt_after_parameter_change() -> None:
    """Check that the eval-mode dictionary is cached without a graph and refreshed when a parameter changes."""
    d = RelaxedArchetypalDictionary(num_atoms=4, candidates=torch.randn(4, 3), delta=1.0).eval()
    D1 = d.get_dictionary()
    assert not D1.requires_grad and d.get_dictionary() is D1
    with torch.no_grad():
        d.m.add_(0.5)
    D2 = d.get_dictionary()
    torch.testing.assert_close(D2, D1 * np.exp(0.5))
    state = {k: v.clone() for k, v in d.state_dict().items()}
    state["W"] = torch.eye(4).flip(0)
    d.load_state_dict(state)
    torch.testing.assert_close(d.get_dictionary(), d.C.flip(0) * np.exp(0.5))


def test_free_dictionary_rows_are_unit_norm_after_training(trained: dict) -> None:
    """Check that the TopK baseline's free atoms are re-projected onto the unit sphere."""
    D = trained["topk"][0].dictionary.get_dictionary()
    torch.testing.assert_close(D.norm(dim=1), torch.ones(len(D)), atol=1e-5, rtol=0)


def test_training_improves_reconstruction(trained: dict, data: torch.Tensor) -> None:
    """Check that every arm's R² rose from its first batch to the end of training."""
    for arm, (sae, _, first_r2) in trained.items():
        with torch.no_grad():
            x_hat = sae(data)[2]
        r2 = 1 - (data - x_hat).square().sum() / (data - data.mean()).square().sum()
        assert r2 > first_r2 + 0.05 and r2 > 0.3, f"{arm}: R² {float(r2):.3f} vs first batch {first_r2:.3f}"


def test_topk_encoder_keeps_exactly_top_k_positive_codes() -> None:
    """Check that codes equal ReLU(pre) on the kept top-k entries and zero elsewhere."""
    enc = TopKEncoder(dim=6, num_atoms=10, top_k=3)
    pre, codes = enc(torch.randn(50, 6))
    assert ((codes != 0).sum(1) <= 3).all()
    kept = codes != 0
    torch.testing.assert_close(codes[kept], pre[kept])
    third = torch.relu(pre).topk(3, dim=1).values[:, -1:]
    assert (codes[kept.any(1)].max(1).values >= third[kept.any(1)].squeeze(1) - 1e-6).all()


def test_auxk_loss_adds_a_penalty_only_when_enabled() -> None:
    """Check that aux_k_penalty=0 gives the plain MSE and a positive penalty increases the loss."""
    sae = SparseAutoencoder(dim=4, num_atoms=8, top_k=1, dictionary="free")
    x = torch.randn(16, 4)
    pre, codes, x_hat = sae(x)
    D = sae.dictionary.get_dictionary()
    mse = sae_loss(x, x_hat, pre, codes, D)
    torch.testing.assert_close(mse, (x - x_hat).square().mean())
    assert sae_loss(x, x_hat, pre, codes, D, aux_k_penalty=0.1) > mse


def test_sae_rejects_wrong_activation_width() -> None:
    """Check that a batch of the wrong width gets one clear error naming both shapes and the fix."""
    sae = SparseAutoencoder(dim=8, num_atoms=16, top_k=2, dictionary="free")
    with pytest.raises(ValueError, match=r"\(N, 8\), got \(5, 12\).*model.dim"):
        sae(torch.randn(5, 12))


def test_free_dictionary_rejects_wrong_initial_atoms() -> None:
    """Check that starting atoms of the wrong shape are refused."""
    with pytest.raises(ValueError, match="shape"):
        FreeDictionary(num_atoms=4, dim=3, init=torch.randn(4, 2))
