"""The RA-SAE maths: the archetypal constraints, the projection order, its numerical traps, the eval cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from zoo.datamodules.activations import make_sparse_concepts
from zoo.models.ra_sae import FreeDictionary, RelaxedArchetypalDictionary, SparseAutoencoder, TopKEncoder, sae_loss
from zoo.models.ra_sae.experiment import frozen_dictionary, r2_score, train_arm
from zoo.models.ra_sae.sae import equal_norm_candidates


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
    # W = I and the equal-norm start: D = C · e^m with unit rows, along the k-means centroids
    C = init.dictionary.C
    torch.testing.assert_close(init.dictionary.get_dictionary(), C / C.norm(dim=1, keepdim=True))
    torch.testing.assert_close(D0, init.dictionary.get_dictionary())
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


# --- pinned to the official implementation (overcomplete, tests/fixtures/reference/ra-sae/official_core.json) -------


def test_relaxed_dictionary_matches_the_official_projection_and_fusion(reference) -> None:
    """Check D after the training-mode projection against overcomplete's RelaxedArchetypalDictionary on the same W
    (with negatives), Λ (one row above δ, one inside) and m = 0.3: Λ added after e^m, the projection skipped, or the
    Λ ball not applied each give other numbers."""
    ref = reference("ra-sae", "official_core")
    d = RelaxedArchetypalDictionary(num_atoms=3, candidates=torch.from_numpy(ref["C"]), delta=float(ref["delta"]))
    with torch.no_grad():
        d.W.copy_(torch.from_numpy(ref["W"]))
        d.Lambda.copy_(torch.from_numpy(ref["Lambda"]))
        d.m.fill_(float(ref["m"]))
    d.train()
    torch.testing.assert_close(d.get_dictionary().detach(), torch.from_numpy(ref["D"]), atol=1e-6, rtol=0)


def test_stability_and_r2_match_the_official_metrics(reference) -> None:
    """Check stability = 1 − cosine_hungarian_loss / k and the R² against overcomplete's metrics on the same data."""
    from zoo.metrics.dictionary_stability import dictionary_stability

    ref = reference("ra-sae", "official_core")
    A, B = torch.from_numpy(ref["A"]), torch.from_numpy(ref["B"])
    assert float(dictionary_stability(A, B)) == pytest.approx(1 - float(ref["hungarian_loss"]) / len(A), abs=1e-6)
    x, x_hat = torch.from_numpy(ref["x"]), torch.from_numpy(ref["x_hat"])
    assert r2_score(x, x_hat) == pytest.approx(float(ref["r2"]), abs=1e-6)


def test_one_training_step_matches_the_official_ra_sae(reference) -> None:
    """Check one step of the reproduction's loop (forward, MSE, backward, clip 1.0, Adam) from the official start
    (``candidate_scale="raw"``: C as given, m = 0) against overcomplete's RATopKSAE with the same encoder weights:
    the loss before the step and the projected dictionary after it."""
    ref = reference("ra-sae", "official_core")
    sae = SparseAutoencoder(4, 8, 2, "ra", delta=1.0, num_candidates=8, init="official", candidate_scale="raw")
    sae.set_candidates(torch.from_numpy(ref["step_C"]))
    with torch.no_grad():
        sae.encoder.linear.weight.copy_(torch.from_numpy(ref["step_enc_w"]))
        sae.encoder.linear.bias.copy_(torch.from_numpy(ref["step_enc_b"]))
    batch = torch.from_numpy(ref["step_batch"])
    opt = torch.optim.Adam(sae.parameters(), lr=1e-3)
    pre, codes, x_hat = sae(batch)
    loss = sae_loss(batch, x_hat, pre, codes, None)
    assert float(loss.detach()) == pytest.approx(float(ref["step_loss"]), rel=1e-6)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
    opt.step()
    sae.train()
    after = sae.dictionary.get_dictionary().detach()
    torch.testing.assert_close(after, torch.from_numpy(ref["step_D_after"]), atol=1e-6, rtol=0)


# --- the equal-norm start, the frozen dictionaries, the ReLU encoder (hand-derived) --------------------------------


def test_equal_norm_start_by_hand() -> None:
    """Check the equal-norm start on hand values: norms 5, 1, 2 -> median 2, so C rows rescaled to norm 2 along the
    same directions and m = −log 2, hence the atoms start at unit norm; the official ``"raw"`` start keeps C, m = 0."""
    C = torch.tensor([[3.0, 4.0], [0.0, 1.0], [2.0, 0.0]])
    C_eq, m0 = equal_norm_candidates(C)
    torch.testing.assert_close(C_eq, torch.tensor([[1.2, 1.6], [0.0, 2.0], [2.0, 0.0]]))
    assert m0 == pytest.approx(-np.log(2.0))
    sae = SparseAutoencoder(2, 3, 1, "ra", num_candidates=3)
    sae.set_candidates(C)
    torch.testing.assert_close(
        sae.dictionary.eval().get_dictionary(), torch.tensor([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])
    )
    raw = SparseAutoencoder(2, 3, 1, "ra", num_candidates=3, candidate_scale="raw")
    raw.set_candidates(C)
    assert float(raw.dictionary.m) == 0.0 and torch.equal(raw.dictionary.eval().get_dictionary(), C)
    with pytest.raises(ValueError, match="candidate_scale"):
        SparseAutoencoder(2, 3, 1, "ra", candidate_scale="unit")
    with pytest.raises(ValueError, match="zero row"):
        equal_norm_candidates(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_frozen_dictionaries_by_hand_and_frozen_in_training(data: torch.Tensor) -> None:
    """Check the classical dictionaries: PCA is ± the top right singular vectors (here e1 then e2, by hand), NMF
    atoms are non-negative unit rows, and a frozen arm's atoms do not move while its encoder trains."""
    x = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-2.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    atoms = frozen_dictionary(x, "pca", 4, seed=0)
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    signs = torch.sign((atoms[:2] * expected[:2]).sum(1, keepdim=True))  # SVD fixes each direction up to its sign
    torch.testing.assert_close(atoms, expected * signs.repeat(2, 1))
    nmf = frozen_dictionary(data, "nmf", 6, seed=0)
    assert (nmf >= 0).all() and torch.allclose(nmf.norm(dim=1), torch.ones(6), atol=1e-5)
    sae, D0, _ = train_arm(data, "kmeans-frozen", seed=0, steps=50, num_atoms=16, top_k=2)
    assert torch.equal(sae.dictionary.get_dictionary(), D0)
    assert not torch.equal(sae.encoder.linear.weight, D0), "the encoder should have trained"


def test_relu_encoder_l1_penalty_by_hand() -> None:
    """Check ReLU + L1 on hand values: pre-codes (1, −2, 3) and (−1, 0.5, 0) give codes (1, 0, 3), (0, 0.5, 0) and
    penalty λ · mean(4, 0.5) = 0.1 · 2.25."""
    from zoo.models.ra_sae import ReLUEncoder

    enc = ReLUEncoder(dim=3, num_atoms=3, l1_penalty=0.1)
    with torch.no_grad():
        enc.linear.weight.copy_(torch.eye(3))
        enc.linear.bias.zero_()
    pre, codes = enc(torch.tensor([[1.0, -2.0, 3.0], [-1.0, 0.5, 0.0]]))
    torch.testing.assert_close(codes, torch.tensor([[1.0, 0.0, 3.0], [0.0, 0.5, 0.0]]))
    assert float(enc.sparsity_loss(pre)) == pytest.approx(0.225)
    with pytest.raises(ValueError, match="l1_penalty"):
        ReLUEncoder(3, 3, l1_penalty=-1.0)


def test_pursuit_codes_and_heuristic_reconstructions_by_hand() -> None:
    """Check the non-learned codes by hand: over e1, e2, e3, x = (2, 1, 0) is coded exactly as (2, 1, 0) in two
    picks; x = (2, −1, 0) picks e1 then e3 (correlation 0 beats e2's −1) and keeps its codes non-negative, (2, 0, 0).
    PCA with 3 components reconstructs data of rank 3 exactly (R² 1)."""
    from zoo.models.ra_sae.experiment import heuristic_r2, pursuit_codes

    atoms = torch.eye(3)
    codes = pursuit_codes(torch.tensor([[2.0, 1.0, 0.0], [2.0, -1.0, 0.0]]), atoms, 2)
    torch.testing.assert_close(codes, torch.tensor([[2.0, 1.0, 0.0], [2.0, 0.0, 0.0]]))
    g = torch.Generator().manual_seed(0)
    low_rank = torch.randn(200, 3, generator=g) @ torch.randn(3, 8, generator=g)
    assert heuristic_r2(low_rank[:100], low_rank[100:], "pca", seed=0) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="heuristic"):
        heuristic_r2(low_rank, low_rank, "ica", seed=0)


def test_mixing_off_identity_and_constraint_violation_by_hand() -> None:
    """Check the grid's two archetypal numbers on hand values: W with diagonal (0.5, 1) is 0.25 off the identity;
    a W row summing to 1.2 and a ‖Λ_i‖ of 1.5 at δ = 1 violate the constraints by 0.5 (the larger)."""
    from zoo.models.ra_sae.experiment import constraint_violation, w_off_identity

    sae = SparseAutoencoder(2, 2, 1, "ra", delta=1.0, num_candidates=2)
    with torch.no_grad():
        sae.dictionary.W.copy_(torch.tensor([[0.5, 0.5], [0.0, 1.0]]))
    assert w_off_identity(sae) == pytest.approx(0.25) and constraint_violation(sae) == 0.0
    with torch.no_grad():
        sae.dictionary.W.copy_(torch.tensor([[0.6, 0.6], [0.0, 1.0]]))
        sae.dictionary.Lambda.copy_(torch.tensor([[1.5, 0.0], [0.0, 0.0]]))
    assert constraint_violation(sae) == pytest.approx(0.5)
    assert w_off_identity(SparseAutoencoder(2, 2, 1, "free")) is None


def test_classical_dictionaries_uncentred_pca_and_nmf_recovery() -> None:
    """Check that the PCA atoms come from the data as given (uncentred: for rows (3, ±1) the first direction is
    e1, where centred PCA would give e2) and that NMF recovers two planted non-negative atoms."""
    atoms = frozen_dictionary(torch.tensor([[3.0, 1.0], [3.0, -1.0]]), "pca", 2, seed=0)
    assert abs(float(atoms[0, 0])) == pytest.approx(1.0, abs=1e-6)
    g = torch.Generator().manual_seed(0)
    planted = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 2.0]]), dim=1)
    x = torch.rand(300, 2, generator=g) @ planted
    found = frozen_dictionary(x, "nmf", 2, seed=0)
    assert bool(((found @ planted.T).max(0).values > 0.99).all())
