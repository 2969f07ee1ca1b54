"""SEAD's ensemble: the prequential order, checkpointed continuation, SEAD++, bad rows, and the Lightning pass."""

from __future__ import annotations

import copy

import pytest
import torch
from lightning import Trainer

from zoo.datamodules.streams import StreamDataModule, make_drifting_stream
from zoo.models.sead import SEAD, SEADEnsemble, build_pool, default_pool
from zoo.models.sead.hedge import Hedge
from zoo.models.sead.normalize import QuantileNormalizer


@pytest.fixture(scope="module")
def stream() -> tuple[torch.Tensor, torch.Tensor]:
    return make_drifting_stream(n=1200, seed=3)


def test_ensemble_equals_its_parts_run_by_hand(stream: tuple) -> None:
    """Check the order score → normalise (old sketch) → insert → combine → Hedge (after warm-up) → learn, step by step."""
    x = stream[0][:300]
    ens = SEADEnsemble(default_pool(4, 2), dim=4, warmup=50, seed=0)
    pool = build_pool(default_pool(4, 2), 4, seed=0)
    norm, hedge = QuantileNormalizer(len(pool)), Hedge(len(pool))
    out = ens(x)
    for t, row in enumerate(x):
        raw = torch.stack([d.score(row) for d in pool]).float()
        s_hat = norm.normalize(raw)
        norm.insert(raw)
        torch.testing.assert_close(out["score"][t], hedge.combine(s_hat))
        if t >= 50:
            hedge.update(s_hat)
        for d in pool:
            d.learn(row)
        torch.testing.assert_close(out["weights"][t], hedge.weights())


def test_exact_history_ensemble_chunked_equals_row_by_row(stream: tuple) -> None:
    """Check capacity=None (the reproduction's exact-history arm) past the first 1,024 slots: the chunked pass equals
    the point-by-point one and the normaliser keeps every score (no compaction)."""
    x = stream[0]
    a = SEADEnsemble(default_pool(4, 2), dim=4, warmup=100, capacity=None)
    b = SEADEnsemble(default_pool(4, 2), dim=4, warmup=100, capacity=None, chunked=False)
    out_a, out_b = a(x), b(x)
    torch.testing.assert_close(out_a["score"], out_b["score"], rtol=0, atol=1e-6)
    torch.testing.assert_close(out_a["weights"], out_b["weights"], rtol=0, atol=1e-6)
    assert int(a.normalizer.level.max()) == 0 and a.normalizer.count.tolist() == [len(x)] * 5


def test_weights_stay_at_the_prior_during_warmup(stream: tuple) -> None:
    """Check that no weight moves before `warmup` points, and that they move after."""
    out = SEADEnsemble(default_pool(4), dim=4, warmup=100)(stream[0][:200])
    uniform = torch.full((7,), 1 / 7)
    torch.testing.assert_close(out["weights"][99], uniform)
    assert not torch.allclose(out["weights"][-1], uniform)


def test_restored_state_continues_the_stream_exactly(stream: tuple) -> None:
    """Check that a state_dict copied mid-stream into a fresh ensemble continues with identical scores and weights."""
    x = stream[0]
    first = SEADEnsemble(default_pool(4), dim=4, warmup=100)
    first(x[:500])
    second = SEADEnsemble(default_pool(4), dim=4, warmup=100)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    a, b = first(x[500:800]), second(x[500:800])
    torch.testing.assert_close(a["score"], b["score"], rtol=0, atol=0)
    torch.testing.assert_close(a["weights"], b["weights"], rtol=0, atol=0)


def test_bad_row_is_refused_and_leaves_state_unchanged(stream: tuple) -> None:
    """Check that a NaN row or a row of the wrong width raises before any state changes."""
    ens = SEADEnsemble(default_pool(4), dim=4, warmup=10)
    ens(stream[0][:50])
    before = copy.deepcopy(ens.state_dict())
    bad = stream[0][50:60].clone()
    bad[4, 2] = float("nan")
    with pytest.raises(ValueError, match="row 4 of this batch holds NaN"):
        ens(bad)
    with pytest.raises(ValueError, match=r"shape \(B, 4\), got \(3, 5\)"):
        ens(torch.randn(3, 5))
    for key, value in ens.state_dict().items():  # NaN marks empty window slots: compare them as equal
        assert torch.equal(value.nan_to_num(-7.0), before[key].nan_to_num(-7.0)), key


def test_empty_pool_is_refused() -> None:
    """Check that an ensemble without detectors gets one clear error."""
    with pytest.raises(ValueError, match="empty"):
        SEADEnsemble([], dim=4)


def test_sead_plus_plus_scores_fewer_detectors_and_still_follows_the_drift() -> None:
    """Check that SEAD++ leaves undrawn detectors unscored (NaN raw) yet ends with most weight on kNN {2,3}."""
    x, _ = make_drifting_stream(n=3000, drift_at=1500, seed=0)
    out = SEADEnsemble(default_pool(4, 13), dim=4, warmup=100, sample_k=8)(x)
    scored = torch.isfinite(out["raw"]).float().sum(1)
    # Under uniform weights about k = 8 of the 16 detectors score a point; once the weights concentrate, few do.
    assert 6 <= float(scored[:100].mean()) <= 10
    assert float(scored[-500:].mean()) < 4 and bool((scored >= 1).all())
    assert int(out["weights"][-1].argmax()) == 1


def test_sead_module_tests_a_stream_with_its_callbacks(tmp_path) -> None:
    """Check the Lightning pass: warm-up in fit, test continues the stream and logs APS and the weight trace."""
    from zoo.callbacks import StreamingAveragePrecision, WeightTrace

    dm = StreamDataModule(n=1500, drift_at=750, fit_on="warmup")
    model = SEAD(dim=4)
    trace = WeightTrace()
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[StreamingAveragePrecision(per_detector=True), trace],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    assert int(model.ensemble.t) == 100
    metrics = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert int(model.ensemble.t) == 1500
    assert metrics["test/aps"] > metrics["test/aps_detector0"] and metrics["test/aps"] > 0.5
    assert trace.trace.shape == (28, 7)  # 1,400 points in chunks of 50
