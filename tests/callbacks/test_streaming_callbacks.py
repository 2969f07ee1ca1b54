"""Tests of the streaming callbacks: ``StreamingAveragePrecision``, ``WeightTrace`` and ``log_figure``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from matplotlib.figure import Figure
from sklearn.metrics import average_precision_score
from torch import Tensor

from zoo.callbacks.images import log_figure
from zoo.callbacks.streaming_ap import StreamingAveragePrecision
from zoo.callbacks.weight_trace import WeightTrace
from zoo.datamodules.streams import StreamDataModule, make_drifting_stream

N, WARMUP, CHUNK = 1000, 100, 50


class NormDetector(LightningModule):
    """Scores a point by its norm; two made-up detectors (dims 0-1 and 2-3) and weights that drift towards 2-3."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("log_w", torch.zeros(2))

    @property
    def weights(self) -> Tensor:
        return self.log_w.softmax(0)

    def _step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        x = batch["x"]
        self.log_w[1] += 0.1  # something that moves, to trace
        detector_scores = torch.stack([x[:, :2].norm(dim=1), x[:, 2:4].norm(dim=1)], dim=1)
        return {"score": x.norm(dim=1), "detector_scores": detector_scores}

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)


class NoWeights(LightningModule):
    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return {"score": batch["x"].norm(dim=1)}


class NoScore(LightningModule):
    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return batch["x"].norm(dim=1)


def _reference() -> tuple[float, list[float]]:
    x, y = make_drifting_stream(n=N)
    keep = slice(WARMUP, None)
    aps = average_precision_score(y[keep].numpy(), x.norm(dim=1)[keep].numpy())
    per = [average_precision_score(y[keep].numpy(), x[keep, d : d + 2].norm(dim=1).numpy()) for d in (0, 2)]
    return aps, per


def _trainer(tmp_path: Path, callbacks: list[Any]) -> Trainer:
    return Trainer(
        logger=CSVLogger(tmp_path), callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False
    )


def test_streaming_ap_equals_sklearn_on_evaluated_rows(tmp_path: Path) -> None:
    """Check that test/aps (and each detector's) equals sklearn's average precision after the warm-up."""
    aps_cb = StreamingAveragePrecision(per_detector=True)
    dm = StreamDataModule(n=N, warmup=WARMUP, chunk_size=CHUNK)
    (logged,) = _trainer(tmp_path, [aps_cb]).test(NormDetector(), datamodule=dm, verbose=False)
    aps, per = _reference()
    assert logged["test/aps"] == pytest.approx(aps, abs=1e-5)
    assert [logged["test/aps_detector0"], logged["test/aps_detector1"]] == pytest.approx(per, abs=1e-5)
    assert logged["test/aps_best_detector"] == pytest.approx(max(per), abs=1e-5)
    assert aps_cb.results["test"]["aps"] == pytest.approx(aps, abs=1e-5)
    assert aps_cb.results["test"]["best_detector"] == int(np.argmax(per))
    assert aps_cb.results["test"]["aps_rank"] == 1 + sum(p > aps for p in per)


def test_streaming_ap_keeps_large_scores_untied(tmp_path: Path) -> None:
    """Check that scores far above 1 are not squashed by a sigmoid (which would tie them and change the APS)."""

    class Scaled(NormDetector):
        def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
            return {"score": 100.0 * batch["x"].norm(dim=1)}

    aps_cb = StreamingAveragePrecision()
    (logged,) = _trainer(tmp_path, [aps_cb]).test(Scaled(), datamodule=StreamDataModule(n=N), verbose=False)
    assert logged["test/aps"] == pytest.approx(_reference()[0], abs=1e-5)


def test_streaming_ap_stores_predict_results(tmp_path: Path) -> None:
    """Check that predict, which cannot log, stores the APS in results['predict']."""
    aps_cb = StreamingAveragePrecision()
    _trainer(tmp_path, [aps_cb]).predict(NormDetector(), datamodule=StreamDataModule(n=N), return_predictions=False)
    assert aps_cb.results["predict"]["aps"] == pytest.approx(_reference()[0], abs=1e-5)


def test_streaming_ap_raises_when_step_returns_no_score(tmp_path: Path) -> None:
    """Check that outputs without 'score' raise a TypeError naming the method to change."""
    with pytest.raises(TypeError, match=r"needs `NoScore\.test_step` to return a dict with 'score'"):
        _trainer(tmp_path, [StreamingAveragePrecision()]).test(NoScore(), datamodule=StreamDataModule(n=200))


def test_weight_trace_records_one_column_per_chunk_and_writes_png(tmp_path: Path) -> None:
    """Check that WeightTrace keeps a (T, M) trace, one row per chunk, and writes a heat-map PNG under the log dir."""
    trace_cb = WeightTrace(log_scale=True)
    trainer = _trainer(tmp_path, [trace_cb])
    trainer.test(NormDetector(), datamodule=StreamDataModule(n=N, chunk_size=CHUNK), verbose=False)
    assert trace_cb.trace.shape == (N // CHUNK, 2)
    assert torch.allclose(trace_cb.trace.sum(1), torch.ones(N // CHUNK))
    assert trace_cb.trace[-1, 1] > trace_cb.trace[0, 1]  # the weights moved, and the trace saw it
    png = trace_cb.paths["test"]
    assert png.is_file() and png.parent == Path(trainer.loggers[0].log_dir) / "images"
    assert png.name == "test_weights_step0.png" and png.read_bytes()[:4] == b"\x89PNG"


def test_weight_trace_raises_when_module_has_no_weights(tmp_path: Path) -> None:
    """Check that a module without a `weights` property is refused in setup with the house-style message."""
    with pytest.raises(TypeError, match=r"WeightTrace needs `NoWeights\.weights` as an \(M,\) tensor"):
        _trainer(tmp_path, [WeightTrace()]).test(NoWeights(), datamodule=StreamDataModule(n=200))


def test_log_figure_returns_none_without_file_logger() -> None:
    """Check that log_figure writes nothing and returns None when the Trainer has no logger."""
    figure = Figure()
    figure.subplots().plot([0, 1])
    assert log_figure(Trainer(logger=False, enable_progress_bar=False), "test/x", figure) is None
