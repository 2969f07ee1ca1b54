"""Precipitation metrics: CSI/ETS/HSS on hand-made tables, global vs batch averaging, MAE per lead, CRPS, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.metrics.precipitation import EnsembleCRPS, LeadTimeMAE, PrecipVerification, contingency, crps_ensemble


def _table(tp: int, fp: int, fn: int, tn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(preds, target) ``(1, N)`` rain amounts whose table at threshold 1 is (tp, fp, fn, tn); events are 2 mm."""
    preds = torch.tensor([2.0] * tp + [2.0] * fp + [0.0] * fn + [0.0] * tn)
    target = torch.tensor([2.0] * tp + [0.0] * fp + [2.0] * fn + [0.0] * tn)
    return preds[None], target[None]


def _scores(m: PrecipVerification, t: str = "1") -> tuple[float, float, float]:
    out = m.compute()
    return float(out[f"csi@{t}"]), float(out[f"ets@{t}"]), float(out[f"hss@{t}"])


def test_contingency_counts_events_at_each_threshold() -> None:
    """Check that events are ``value >= t`` and the four counts match a hand count at three thresholds."""
    preds, target = torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([0.0, 2.0, 1.0, 3.0])
    tp, fp, fn, tn = contingency(preds, target, (1, 2, 3))
    assert tp.tolist() == [3, 1, 1] and fp.tolist() == [0, 1, 0]
    assert fn.tolist() == [0, 1, 0] and tn.tolist() == [1, 1, 3]
    assert tp.dtype == torch.float64


def test_precip_verification_matches_hand_computed_table() -> None:
    """Check CSI, ETS and HSS on TP=10, FP=5, FN=3, TN=82 against hand values and the classic Heidke formula."""
    m = PrecipVerification(thresholds=(1.0,))
    m.update(*_table(10, 5, 3, 82))
    csi, ets, hss = _scores(m)
    r = 15 * 13 / 100  # chance hits (TP + FP)(TP + FN) / N
    assert csi == pytest.approx(10 / 18, abs=1e-6)
    assert ets == pytest.approx((10 - r) / (18 - r), abs=1e-6)
    assert hss == pytest.approx(2 * (10 * 82 - 3 * 5) / (13 * 85 + 15 * 87), abs=1e-6)


def test_precip_verification_gives_one_for_a_perfect_forecast() -> None:
    """Check that preds == target gives CSI = ETS = HSS = 1 at every threshold, in both averaging modes."""
    g = torch.Generator().manual_seed(0)
    target = torch.rand(8, 4, 16, 16, generator=g) ** 3 * 50  # skewed like rain, events and dry points at each t
    for average in ("global", "batch"):
        m = PrecipVerification(thresholds=(0.1, 1.0, 10.0), average=average)
        m.update(target[:4], target[:4])
        m.update(target[4:], target[4:])
        assert all(float(v) == pytest.approx(1.0, abs=1e-6) for v in m.compute().values())


def test_precip_verification_random_forecast_has_no_skill() -> None:
    """Check that an independent forecast with the observed event frequency gives |ETS| < 0.02 on 200k points."""
    g = torch.Generator().manual_seed(0)
    preds, target = torch.rand(2, 200_000, generator=g).unbind()
    m = PrecipVerification(thresholds=(0.8,))  # 20 % events in both
    m.update(preds, target)
    csi, ets, hss = _scores(m, "0.8")
    assert abs(ets) < 0.02 and abs(hss) < 0.04
    assert csi == pytest.approx(1 / 9, abs=0.01)  # p²/(2p − p²) with p = 0.2


def test_precip_verification_global_and_batch_averaging_differ_as_expected() -> None:
    """Check a perfect batch (1, 0, 0, 1) and a chance batch (1, 1, 1, 1): one pooled table vs the mean of scores."""
    batches = [_table(1, 0, 0, 1), _table(1, 1, 1, 1)]
    pooled, per_batch = PrecipVerification((1.0,)), PrecipVerification((1.0,), average="batch")
    for preds, target in batches:
        pooled.update(preds, target)
        per_batch.update(preds, target)
    # pooled: TP=2, FP=1, FN=1, TN=2, R = 3·3/6 = 1.5; batches: (CSI, ETS, HSS) = (1, 1, 1) and (1/3, 0, 0)
    assert _scores(pooled) == pytest.approx((2 / 4, 0.5 / 2.5, 2 * 0.2 / 1.2), abs=1e-6)
    assert _scores(per_batch) == pytest.approx(((1 + 1 / 3) / 2, 0.5, 0.5), abs=1e-6)


def test_precip_verification_zero_denominators_give_zero() -> None:
    """Check the 0/0 rule: no events gives 0 for all three; events everywhere, forecast right, gives CSI 1, ETS 0."""
    m = PrecipVerification(thresholds=(1.0,))
    m.update(*_table(0, 0, 0, 10))
    assert _scores(m) == (0.0, 0.0, 0.0)
    m = PrecipVerification(thresholds=(1.0,))
    m.update(*_table(10, 0, 0, 0))
    assert _scores(m) == (1.0, 0.0, 0.0)
    m = PrecipVerification(thresholds=(1.0,), average="batch")
    m.update(*_table(0, 0, 0, 10))  # a dry batch counts as 0 in the batch mean, as the official code's eps does
    m.update(*_table(5, 0, 0, 5))
    assert _scores(m) == pytest.approx((0.5, 0.5, 0.5), abs=1e-6)


def test_precip_verification_nan_input_gives_nan_scores() -> None:
    """Check that a NaN in the forecast makes the scores NaN instead of counting the point as dry."""
    preds, target = _table(3, 1, 1, 5)
    preds[0, 0] = float("nan")
    m = PrecipVerification(thresholds=(1.0,))
    m.update(preds, target)
    assert all(torch.isnan(v) for v in m.compute().values())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"thresholds": ()}, ValueError, "non-empty"),
        ({"thresholds": (1.0, -1.0)}, ValueError, "positive"),
        ({"thresholds": (1.0, 1.0)}, ValueError, "distinct"),
        ({"thresholds": 1.0}, TypeError, "sequence"),
        ({"thresholds": (1.0,), "average": "mean"}, ValueError, "`average` to be one of .*'global', 'batch'.* 'mean'"),
    ],
)
def test_precip_verification_rejects_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    """Check that empty, non-positive, repeated or non-sequence thresholds and an unknown average are refused."""
    with pytest.raises(error, match=match):
        PrecipVerification(**kwargs)


def test_precip_verification_rejects_mismatched_shapes() -> None:
    """Check that update names both shapes when preds and target differ."""
    with pytest.raises(ValueError, match=r"got preds \(2, 3\) and target \(2, 4\)"):
        PrecipVerification((1.0,)).update(torch.zeros(2, 3), torch.zeros(2, 4))


def test_lead_time_mae_matches_numpy() -> None:
    """Check the per-lead MAE over two updates of different sizes against numpy on the concatenated data."""
    g = torch.Generator().manual_seed(0)
    preds, target = torch.randn(7, 4, 5, 6, generator=g), torch.randn(7, 4, 5, 6, generator=g)
    m = LeadTimeMAE(num_leads=4)
    m.update(preds[:3], target[:3])
    m.update(preds[3:], target[3:])
    expected = np.abs(preds.numpy() - target.numpy()).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(m.compute().numpy(), expected, rtol=1e-6)
    assert m.compute().shape == (4,)


def test_lead_time_mae_rejects_wrong_number_of_leads() -> None:
    """Check that a lead axis of 3 where 4 were declared is refused, naming both, and that num_leads is checked."""
    with pytest.raises(ValueError, match=r"num_leads = 4 lead times on dim 1, got preds \(2, 3, 8\)"):
        LeadTimeMAE(num_leads=4).update(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match="got preds"):
        LeadTimeMAE(num_leads=4).update(torch.zeros(2, 4, 8), torch.zeros(2, 4, 9))
    with pytest.raises(ValueError, match=">= 1"):
        LeadTimeMAE(num_leads=0)


def test_crps_ensemble_matches_properscoring() -> None:
    """Check the per-element CRPS and the metric's mean against properscoring.crps_ensemble, with and without ties."""
    properscoring = pytest.importorskip("properscoring")
    g = torch.Generator().manual_seed(0)
    ensemble = torch.randn(6, 9, 3, 5, generator=g, dtype=torch.float64)  # (N, M, H, W)
    target = torch.randn(6, 3, 5, generator=g, dtype=torch.float64)
    ties = torch.randint(0, 3, (6, 9, 3, 5), generator=g).double()  # repeated members
    for ens in (ensemble, ties):
        expected = properscoring.crps_ensemble(target.numpy(), np.moveaxis(ens.numpy(), 1, -1))
        np.testing.assert_allclose(crps_ensemble(ens, target).numpy(), expected, atol=1e-6)
        m = EnsembleCRPS()
        m.update(ens[:2], target[:2])
        m.update(ens[2:], target[2:])
        assert float(m.compute()) == pytest.approx(float(expected.mean()), abs=1e-6)


def test_crps_ensemble_fair_matches_naive_pairwise_loop() -> None:
    """Check the fair CRPS against the spread term summed over every (m, m') pair by an explicit loop."""
    g = torch.Generator().manual_seed(1)
    ensemble, target = torch.randn(4, 7, 10, generator=g), torch.randn(4, 10, generator=g)
    M = ensemble.shape[1]
    pairwise = sum((ensemble[:, i] - ensemble[:, j]).abs() for i in range(M) for j in range(M))
    expected = (ensemble - target[:, None]).abs().mean(dim=1) - pairwise / (2 * M * (M - 1))
    torch.testing.assert_close(crps_ensemble(ensemble, target, fair=True), expected, atol=1e-6, rtol=0)
    m = EnsembleCRPS(fair=True)
    m.update(ensemble, target)
    assert float(m.compute()) == pytest.approx(float(expected.mean()), abs=1e-6)


def test_crps_ensemble_with_one_member_is_the_absolute_error() -> None:
    """Check that M = 1 reduces the CRPS to |x − y| and the metric to the MAE; the fair version refuses M = 1."""
    g = torch.Generator().manual_seed(2)
    ensemble, target = torch.randn(5, 1, 8, generator=g), torch.randn(5, 8, generator=g)
    torch.testing.assert_close(crps_ensemble(ensemble, target), (ensemble[:, 0] - target).abs())
    m = EnsembleCRPS()
    m.update(ensemble, target)
    assert float(m.compute()) == pytest.approx(float((ensemble[:, 0] - target).abs().mean()), abs=1e-6)
    with pytest.raises(ValueError, match="needs M >= 2 members"):
        crps_ensemble(ensemble, target, fair=True)


def test_crps_ensemble_rejects_mismatched_shapes() -> None:
    """Check that a target that is not the ensemble's shape without dim 1 is refused, naming both shapes."""
    with pytest.raises(ValueError, match=r"got ensemble \(2, 5, 3\) and target \(2, 5\)"):
        EnsembleCRPS().update(torch.zeros(2, 5, 3), torch.zeros(2, 5))
    with pytest.raises(TypeError, match="`fair` to be a bool"):
        EnsembleCRPS(fair=1)  # type: ignore[arg-type]
