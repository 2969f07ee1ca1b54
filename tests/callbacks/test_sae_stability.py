import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from safetensors.torch import save_file
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from zoo.callbacks import SAEStability


class TinySAE(LightningModule):
    """A (8, 4) dictionary trained to reconstruct random data; ``dictionary`` is the documented property."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.D = nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        self.data = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    @property
    def dictionary(self) -> Tensor:
        return self.D

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        (x,) = batch
        return (torch.relu(x @ self.D.T) @ self.D - x).square().mean()

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.data), batch_size=16)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.data), batch_size=16)  # batches are [x]: the tuple path


class NoDictionary(TinySAE):
    dictionary = None  # type: ignore[assignment]


def _fit(module: LightningModule, callback: SAEStability, max_epochs: int = 2) -> Trainer:
    trainer = Trainer(
        max_epochs=max_epochs,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=2,
        limit_val_batches=2,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(module)
    return trainer


def test_sae_stability_logs_stabilization_and_floors():
    """Check that without a reference the callback logs val/stabilization from epoch 2 and both floors."""
    trainer = _fit(TinySAE(), SAEStability())
    metrics = trainer.callback_metrics
    assert {"val/stabilization", "val/stability_floor_gaussian", "val/stability_floor_points"} <= set(metrics)
    assert "val/stability" not in metrics
    assert -1.0 <= float(metrics["val/stabilization"]) <= 1.0 + 1e-6
    assert 0.0 < float(metrics["val/stability_floor_gaussian"]) < 1.0


def test_sae_stability_skips_stabilization_on_first_validation():
    """Check that the first computation only stores the dictionary, and that it round-trips through state_dict."""
    callback = SAEStability(floor_points=False)
    module = TinySAE()
    trainer = _fit(module, callback, max_epochs=1)
    assert "val/stabilization" not in trainer.callback_metrics
    assert "val/stability_floor_points" not in trainer.callback_metrics
    assert torch.equal(callback.previous, module.D.detach())
    restored = SAEStability(floor_points=False)
    restored.load_state_dict(callback.state_dict())
    assert torch.equal(restored.previous, callback.previous)


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_sae_stability_is_one_against_the_unchanged_initial_dictionary(tmp_path, suffix):
    """Check that a module with lr=0 has val/stability 1 against its own initial dictionary."""
    module = TinySAE(lr=0.0)
    path = tmp_path / f"reference{suffix}"
    if suffix == ".npy":
        np.save(path, module.D.detach().numpy())
    else:
        save_file({"dictionary": module.D.detach().clone()}, str(path))
    trainer = _fit(module, SAEStability(reference=str(path)))
    assert float(trainer.callback_metrics["val/stability"]) == pytest.approx(1.0, abs=1e-5)
    assert "val/stabilization" not in trainer.callback_metrics


def test_sae_stability_subsamples_above_max_atoms(tmp_path):
    """Check that with max_atoms < num_atoms the same rows of both dictionaries are matched."""
    module = TinySAE(lr=0.0)
    path = tmp_path / "reference.npy"
    np.save(path, module.D.detach().numpy())
    trainer = _fit(module, SAEStability(reference=str(path), max_atoms=3), max_epochs=1)
    assert float(trainer.callback_metrics["val/stability"]) == pytest.approx(1.0, abs=1e-5)


def test_sae_stability_raises_when_module_has_no_dictionary():
    """Check that a module without a dictionary property fails in setup with a TypeError."""
    with pytest.raises(TypeError, match=r"needs `NoDictionary.dictionary` as a \(num_atoms, dim\) tensor"):
        _fit(NoDictionary(), SAEStability())


def test_sae_stability_raises_when_reference_width_differs(tmp_path):
    """Check that a reference of another width raises a ValueError naming both shapes."""
    path = tmp_path / "reference.npy"
    np.save(path, np.zeros((8, 5), dtype=np.float32))
    with pytest.raises(ValueError, match=r"shape \(8, 5\).*shape \(8, 4\)"):
        _fit(TinySAE(), SAEStability(reference=str(path)))


def test_sae_stability_raises_when_reference_is_missing(tmp_path):
    """Check that a missing reference file raises FileNotFoundError with the path."""
    with pytest.raises(FileNotFoundError, match="No reference dictionary at .*missing.npy"):
        _fit(TinySAE(), SAEStability(reference=str(tmp_path / "missing.npy")))


def test_sae_stability_validates_arguments():
    """Check that bad arguments fail in __init__ with the offending value."""
    with pytest.raises(ValueError, match="Expected argument `every_n_epochs` to be a positive int but got 0"):
        SAEStability(every_n_epochs=0)
    with pytest.raises(ValueError, match="Expected argument `max_atoms`"):
        SAEStability(max_atoms=-1)
    with pytest.raises(ValueError, match=r"\.safetensors or \.npy file but got 'ref.pt'"):
        SAEStability(reference="ref.pt")


class DictBatches(TinySAE):
    def val_dataloader(self) -> DataLoader:
        return DataLoader([{"x": row} for row in self.data], batch_size=16)


def test_sae_stability_warns_when_batches_are_not_activations():
    """Check that batches the callback cannot read leave out the points floor with one warning."""
    with pytest.warns(UserWarning, match="collected 0 validation rows of the 16"):
        trainer = _fit(DictBatches(), SAEStability(), max_epochs=1)
    assert "val/stability_floor_points" not in trainer.callback_metrics
    assert "val/stability_floor_gaussian" in trainer.callback_metrics


def test_sae_stability_stabilization_compares_this_epoch_with_the_last():
    """Check the logged val/stabilization against dictionary_stability(D now, D one epoch earlier) computed here.

    A callback comparing D with itself would log 1.0; the training moves D enough that the true value is below it.
    """
    from lightning.pytorch.callbacks import Callback

    from zoo.metrics import dictionary_stability

    class Snapshots(Callback):
        def __init__(self) -> None:
            self.seen: list[Tensor] = []

        def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
            if not trainer.sanity_checking:
                self.seen.append(pl_module.dictionary.detach().clone())

    snapshots, callback = Snapshots(), SAEStability(floor_points=False)
    trainer = Trainer(
        max_epochs=2,
        callbacks=[snapshots, callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=4,
        limit_val_batches=1,
    )
    trainer.fit(TinySAE(lr=0.1))
    expected = float(dictionary_stability(snapshots.seen[1], snapshots.seen[0]))
    assert expected < 0.999
    assert float(trainer.callback_metrics["val/stabilization"]) == pytest.approx(expected, abs=1e-6)
