"""Tests of ``callbacks.SNNConversion``: any module with ``to_snn`` (here also a plain ReLU CNN), the logged numbers
against a direct simulation, no work during the sanity check, clear errors, and the accuracy-against-T figure."""

from __future__ import annotations

import pytest
import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn

from zoo.callbacks import SNNConversion
from zoo.datamodules.images import ImageDataModule
from zoo.models.snn_ecl import ECLClassifier, SpikingNetwork, naive_convert


class _ReLUCNN(LightningModule):
    """A plain ReLU CNN (not this paper's model) whose only link to the callback is ``to_snn``."""

    def __init__(self, calibration: Tensor | None = None, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10),
        )  # fmt: skip
        self.calibration, self.lr = calibration, lr

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def to_snn(
        self,
        calibration: Tensor | list[Tensor] | None = None,
        percentile: float = 99.9,
        v0_ratio: float = 0.0,
        dual: bool = False,
        **kwargs,
    ) -> SpikingNetwork:
        data = self.calibration if calibration is None else calibration
        return naive_convert(self.net, data, percentile, v0_ratio=v0_ratio, dual=dual, **kwargs)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def test_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class _NoSNN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(64, 10)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0].flatten(1)), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SanityProbe(Callback):
    """Records what the conversion callback had produced when the sanity check ended."""

    def __init__(self, conversion: SNNConversion) -> None:
        self.conversion, self.seen = conversion, None

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        keys = [k for k in trainer.callback_metrics if "snn_acc" in k]
        self.seen = (dict(self.conversion.results), keys, trainer.sanity_checking)


def _trainer(tmp_path, callbacks: list[Callback], max_epochs: int = 1, **kwargs) -> Trainer:
    options = dict(
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return Trainer(**options)


def _accuracy(logits: Tensor, y: Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean())


def test_converts_a_plain_relu_cnn_and_logs_both_arms(tmp_path) -> None:
    """Check that a non-ECL ReLU CNN with to_snn gets snn/naive accuracies and firing rates, T=64 near its ANN."""
    torch.manual_seed(0)
    dm = ImageDataModule(batch_size=64)
    dm.setup("fit")
    model = _ReLUCNN(calibration=dm.train_set.__getitems__(range(512))[0])
    cb = SNNConversion(steps=[1, 4, 64], naive=True, firing_rates=True, stages=["test"])
    trainer = _trainer(tmp_path, [cb], max_epochs=6, limit_val_batches=0)
    trainer.fit(model, dm)
    trainer.test(model, dm)
    metrics = trainer.callback_metrics
    for key in ("test/snn_acc_T1", "test/snn_acc_T4", "test/snn_acc_T64", "test/naive_acc_T1", "test/naive_acc_T64"):
        assert key in metrics and 0.0 <= float(metrics[key]) <= 1.0, key
    rates = {k: float(v) for k, v in metrics.items() if k.startswith("test/firing_rate/")}
    assert set(rates) == {"test/firing_rate/1", "test/firing_rate/5"}
    assert all(0.0 < r < 1.0 for r in rates.values())

    x, y = dm.test_set.x, dm.test_set.y
    with torch.no_grad():
        ann = _accuracy(model(x), y)
    assert ann > 0.8  # the CNN learned something, so the comparison below means something
    for arm in ("snn", "naive"):
        t64, t1 = float(metrics[f"test/{arm}_acc_T64"]), float(metrics[f"test/{arm}_acc_T1"])
        assert abs(t64 - ann) <= 0.04, (arm, t64, ann)
        assert t1 <= t64 - 0.4, (arm, t1, t64)  # v(0) = 0, percentile thresholds: nothing reaches the output at T=1
    # The default arm calibrates on the first 512 training images in order, the naive arm on the first 8 ordered
    # training batches of 64: the same images, hence the same thresholds and the same numbers.
    assert cb.results["test"]["naive"] == cb.results["test"]["snn"]
    assert cb.results["test"]["snn"] == {t: pytest.approx(float(metrics[f"test/snn_acc_T{t}"])) for t in (1, 4, 64)}
    assert cb.results["test"]["naive"] == {t: pytest.approx(float(metrics[f"test/naive_acc_T{t}"])) for t in (1, 4, 64)}


def test_validation_numbers_equal_a_direct_simulation(tmp_path) -> None:
    """Check that val/snn_acc_T{t} appear only after real validation and equal to_snn().predict over the test split."""
    torch.manual_seed(0)
    dm = ImageDataModule(batch_size=128)
    model = ECLClassifier(backbone="cnn_small")
    steps = [1, 2, 8]
    cb = SNNConversion(steps=steps, stages=["val"])
    probe = _SanityProbe(cb)
    trainer = _trainer(tmp_path, [cb, probe], max_epochs=2, num_sanity_val_steps=1)
    trainer.fit(model, dm)
    results, keys, sanity = probe.seen
    assert sanity and results == {} and keys == []  # the sanity check ran, and the callback stayed out of it

    correct = torch.zeros(len(steps))
    with torch.no_grad():
        snn = model.to_snn()
        for x, y in dm.val_dataloader():
            curve = snn.predict(x, max(steps))
            correct += torch.stack([(curve[t - 1].argmax(-1) == y).sum() for t in steps]).float()
    expected = correct / len(dm.test_set)
    assert len(dm.val_set) == len(dm.test_set) == 500
    for t, value in zip(steps, expected):
        assert float(trainer.callback_metrics[f"val/snn_acc_T{t}"]) == pytest.approx(float(value), abs=1e-6)
        assert cb.results["val"]["snn"][t] == pytest.approx(float(value), abs=1e-6)
    assert expected[-1] > expected[0]  # more steps, closer to the ANN: the curve is not one number repeated


@pytest.mark.parametrize(
    "kwargs", [{"steps": [0]}, {"steps": []}, {"steps": [2, -1]}, {"steps": [2.5]}, {"stages": ["train"]}]
)
def test_bad_arguments_raise(kwargs) -> None:
    """Check that non-positive or empty step lists and unknown stages raise ValueError."""
    with pytest.raises(ValueError):
        SNNConversion(**kwargs)


def test_module_without_to_snn_raises_type_error(tmp_path) -> None:
    """Check that fitting a module without to_snn raises a TypeError that names to_snn."""
    dm = ImageDataModule(batch_size=256)
    with pytest.raises(TypeError, match="to_snn"):
        _trainer(tmp_path, [SNNConversion(steps=[1])], limit_train_batches=1).fit(_NoSNN(), dm)


def test_csv_logger_run_writes_the_accuracy_plot(tmp_path) -> None:
    """Check that a test run with a CSVLogger writes the accuracy-against-T PNG under the log dir's images/."""
    dm = ImageDataModule(batch_size=64)
    logger = CSVLogger(str(tmp_path))
    cb = SNNConversion(steps=[1, 2])
    trainer = _trainer(tmp_path, [cb], logger=logger, limit_test_batches=1)
    trainer.test(ECLClassifier(), dm)
    pngs = list((tmp_path / "lightning_logs").rglob("images/test_snn_accuracy*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 1000
    assert set(cb.results["test"]["snn"]) == {1, 2}


def test_relu_classifier_is_converted_naively_on_calibration_batches(tmp_path) -> None:
    """Check that a ReLU ECLClassifier (snn_needs_calibration) gets training batches and its main arm is the naive one."""
    torch.manual_seed(0)
    dm = ImageDataModule(batch_size=128)
    model = ECLClassifier(activation="relu")
    assert model.snn_needs_calibration and not ECLClassifier().snn_needs_calibration
    cb = SNNConversion(steps=[1, 16], naive=True, calibration_batches=2)
    trainer = _trainer(tmp_path, [cb], max_epochs=2, limit_test_batches=2)
    trainer.fit(
        model,
        dm,
    )
    trainer.test(model, dm)
    results = cb.results["test"]
    assert results["snn"] == results["naive"]  # no learned thresholds: the default conversion is the naive one
    assert results["snn"][1] < 0.3 < results["snn"][16]  # v(0) = 0 and a single threshold: silent at T = 1
