"""Tests of ``callbacks.TrainingDynamics``: per-sample records by index, the stop after T epochs, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from zoo.callbacks import TrainingDynamics


class _Classifier(LightningModule):
    def __init__(self, lr: float = 0.05, logits_key: str = "logits") -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)
        self.lr, self.logits_key = lr, logits_key

    def training_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, y), self.logits_key: logits}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _data(n: int = 50, with_index: bool = True) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(x, y, torch.arange(n)) if with_index else TensorDataset(x, y)


def _trainer(tmp_path, callback, max_epochs: int) -> Trainer:
    return Trainer(
        max_epochs=max_epochs,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )


def test_records_the_softmax_of_each_sample_at_its_index(tmp_path) -> None:
    """Check that with a frozen model (lr 0) every shuffled sample's record equals softmax(model(x))[y] at its index."""
    data = _data()
    model = _Classifier(lr=0.0)
    cb = TrainingDynamics(epochs=3, record_probs=True, record_loss=True)
    _trainer(tmp_path, cb, 3).fit(model, DataLoader(data, batch_size=8, shuffle=True))
    rec = cb.record()
    x, y, _ = data.tensors
    with torch.no_grad():
        probs = model.net(x).softmax(-1)
    for epoch in range(3):
        torch.testing.assert_close(rec["target_probs"][epoch], probs[torch.arange(len(y)), y])
        torch.testing.assert_close(rec["probs"][epoch], probs)
        torch.testing.assert_close(rec["loss"][epoch], -probs[torch.arange(len(y)), y].log())
    assert torch.equal(rec["labels"], y)


def test_stops_after_the_recorded_epochs_and_saves(tmp_path) -> None:
    """Check that a 20-epoch run stops after T = 4 recorded epochs and writes dynamics.npz with the record."""
    cb = TrainingDynamics(epochs=4, save_dir=str(tmp_path / "dyn"))
    trainer = _trainer(tmp_path, cb, 20)
    trainer.fit(_Classifier(), DataLoader(_data(), batch_size=8, shuffle=True))
    assert trainer.current_epoch == 4 and cb.recorded_epochs == 4
    saved = np.load(tmp_path / "dyn" / "dynamics.npz")
    assert saved["target_probs"].shape == (4, 50) and not np.isnan(saved["target_probs"]).any()
    np.testing.assert_array_equal(saved["target_probs"], cb.record()["target_probs"].numpy())
    # The probabilities move as the model learns: the record is not one epoch repeated.
    assert not np.allclose(saved["target_probs"][0], saved["target_probs"][-1])


def test_bad_batches_and_outputs_raise(tmp_path) -> None:
    """Check that batches without indices and a training_step without logits each raise one clear TypeError."""
    with pytest.raises(TypeError, match="carry sample indices"):
        _trainer(tmp_path, TrainingDynamics(epochs=1), 1).fit(_Classifier(), DataLoader(_data(with_index=False)))
    with pytest.raises(TypeError, match="return a dict with 'logits'"):
        _trainer(tmp_path, TrainingDynamics(epochs=1), 1).fit(_Classifier(logits_key="out"), DataLoader(_data()))
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        TrainingDynamics(epochs=0)


_DDP_SCRIPT = """
import sys
import torch
from lightning import Trainer
from zoo.callbacks import TrainingDynamics
from zoo.models.dual.data import PrunableImageDataModule
from zoo.models.dual import DualClassifier

torch.manual_seed(0)
# lr = 0 keeps the weights at their seeded init, so the test can recompute every record in one process.
callback = TrainingDynamics(epochs=2, record_probs=True, save_dir=sys.argv[1])
trainer = Trainer(max_epochs=200, strategy="ddp", devices=2, accelerator="cpu", callbacks=[callback], logger=False,
                  enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                  limit_val_batches=0, num_sanity_val_steps=0)
trainer.fit(DualClassifier(lr=0.0), PrunableImageDataModule(batch_size=64))
# Tear the gloo group down before the interpreter exits: left to interpreter shutdown it can abort the process
# ("terminate called without an active exception") after the work is done.
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
"""


def test_ddp_gathers_every_sample_once_per_epoch(tmp_path) -> None:
    """Check that under 2-process DDP the saved record covers all 1297 samples in each of the 2 epochs, each at its
    sample's index with the value a one-process forward gives (weights frozen at the seeded init by lr = 0)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "record.py"
    script.write_text(_DDP_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, cwd=root, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    saved = np.load(tmp_path / "dynamics.npz")
    assert saved["target_probs"].shape == (2, 1297) and not np.isnan(saved["target_probs"]).any()
    assert saved["probs"].shape == (2, 1297, 10)
    # Each record sits at its own sample's index, with the value one process computes for that sample.
    from zoo.models.dual import DualClassifier
    from zoo.models.dual.data import PrunableImageDataModule

    torch.manual_seed(0)
    model = DualClassifier(lr=0.0).eval()
    dm = PrunableImageDataModule(batch_size=64)
    dm.setup("fit")
    x, y, index = (torch.cat(parts) for parts in zip(*dm.train_dataloader()))
    with torch.no_grad():
        probs = torch.zeros(1297, 10).index_copy_(0, index, model(x).softmax(-1))
    labels = torch.zeros(1297, dtype=torch.long).index_copy_(0, index, y)
    np.testing.assert_array_equal(saved["labels"], labels.numpy())
    for epoch in range(2):
        np.testing.assert_allclose(saved["probs"][epoch], probs.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved["target_probs"][epoch], probs[torch.arange(1297), labels].numpy(), atol=1e-6)
