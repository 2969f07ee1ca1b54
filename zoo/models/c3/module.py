"""``C3Classifier``: the card's multi-modal host classifier, trained with C³R (``c3=True``) or plain (``c3=False``)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from zoo.models.c3.mixin import C3Regularized
from zoo.models.c3.regularizer import C3Regularizer
from zoo.module import ZooModule

__all__ = ["C3Classifier"]

Batch = dict[str, Tensor]


class C3Classifier(C3Regularized, ZooModule):
    """A multi-modal classifier: one MLP encoder per modality, a linear fusion Z = W [h_1; ...; h_M], a linear head
    f(Z); the task loss is CE(f(Z), y), and ``c3=True`` adds the C³R regulariser (card §5: with L_task = L_suff the
    regularised arm adds L_nec + λ_v L_IV + λ_fe L_fe, so the two arms differ by the regulariser alone).

    Batches are dicts ``{modality: (B, d_m), ..., "label": (B,)}`` (``datamodules.multimodal.MultiModalDataModule``);
    ``forward`` returns the logits ``(B, C)``. Test logs ``test/acc_<condition>`` for each of the DataModule's test
    loaders (``test_names``), ``test/acc_noise_avg`` and ``test/acc_noise_worst`` over the ID noise levels.

    Args:
        modalities / input_dims: the batch keys of the modalities and their widths.
        hidden / dim: the encoders' hidden width and the feature and fusion width d.
        num_classes: C.
        c3: train with C³R.
        lambda_v / lambda_fe / eta / cf_sign / eta_mode: ``C3Regularizer``'s.
        c3_weight: ``C3Regularizer``'s ``weight`` (0: the regulariser built but switched off).
        lr: Adam's learning rate.

    Example:
        >>> model = C3Classifier()
        >>> model({"a": torch.randn(4, 32), "b": torch.randn(4, 32)}).shape
        torch.Size([4, 3])
    """

    def __init__(
        self,
        modalities: list[str] | None = None,
        input_dims: list[int] | None = None,
        hidden: int = 64,
        dim: int = 32,
        num_classes: int = 3,
        c3: bool = True,
        lambda_v: float = 0.1,
        lambda_fe: float = 0.1,
        eta: float = 1.0,
        cf_sign: Literal["remove_evidence", "code_vt"] = "remove_evidence",
        eta_mode: Literal["absolute", "relative"] = "absolute",
        c3_weight: float = 1.0,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        modalities = list(modalities or ["a", "b"])
        input_dims = list(input_dims or [32] * len(modalities))
        if len(modalities) != len(input_dims) or len(modalities) < 2:
            raise ValueError(f"give two or more modalities with one width each, got {modalities} and {input_dims}")
        self.save_hyperparameters()
        self.encoders = nn.ModuleDict({
            m: nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, dim), nn.ReLU())
            for m, d in zip(modalities, input_dims)
        })  # fmt: skip
        self.fuse = nn.Linear(len(modalities) * dim, dim)
        self.head = nn.Linear(dim, num_classes)
        self.c3 = (
            C3Regularizer(dim, len(modalities), lambda_v, lambda_fe, eta, cf_sign, eta_mode, False, c3_weight)
            if c3 else None
        )  # fmt: skip
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_accs = nn.ModuleList()
        self.test_names: list[str] = []

    def encode(self, batch: Batch) -> tuple[list[Tensor], Tensor]:
        """The modality features ``[(B, d), ...]`` and the fused Z ``(B, d)``."""
        missing = [m for m in self.hparams.modalities if m not in batch]
        if missing:
            raise KeyError(f"the batch has no modality {missing} (keys {sorted(batch)}); set model.modalities to the "
                           "DataModule's")  # fmt: skip
        sizes = {m: len(batch[m]) for m in self.hparams.modalities}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"modalities of different batch sizes: {sizes}; pair every sample across modalities")
        for m, d in zip(self.hparams.modalities, self.hparams.input_dims):
            if batch[m].ndim != 2 or batch[m].shape[1] != d:
                raise ValueError(f"expected batch[{m!r}] of shape (B, {d}), got {tuple(batch[m].shape)}")
        features = [self.encoders[m](batch[m]) for m in self.hparams.modalities]
        return features, self.fuse(torch.cat(features, -1))

    def forward(self, batch: Batch) -> Tensor:
        return self.head(self.encode(batch)[1])

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        features, z = self.encode(batch)
        y = batch["label"]
        task = F.cross_entropy(self.head(z), y)
        loss = task + self.c3_loss(features, z, y)
        self.log_dict({"train/loss": loss, "train/loss_task": task}, prog_bar=True, batch_size=len(y))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.val_acc.update(self(batch), batch["label"])
        self.log("val/acc", self.val_acc, prog_bar=True, batch_size=len(batch["label"]))

    # -- test: one accuracy per test condition ------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        names = list(getattr(datamodule, "test_names", None) or ["test"])
        if stage == "test" and names != self.test_names:
            self.test_names = names
            self.test_accs = nn.ModuleList(MulticlassAccuracy(self.hparams.num_classes, average="micro")
                                           for _ in names).to(self.device)  # fmt: skip

    def test_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.test_accs[dataloader_idx].update(self(batch), batch["label"])

    def on_test_epoch_end(self) -> None:
        accs = {name: acc.compute() for name, acc in zip(self.test_names, self.test_accs)}
        metrics = {f"test/acc_{name}": v for name, v in accs.items()}
        # noise conditions are "<clean>_noise<level>" (id_noise0.5 on synthetic data, test_noise0.5 on features)
        noisy = {name: v for name, v in accs.items() if "_noise" in name}
        if noisy:
            clean = next(iter(noisy)).split("_noise")[0]
            levels = torch.stack([accs[clean], *noisy.values()] if clean in accs else list(noisy.values()))
            metrics |= {"test/acc_noise_avg": levels.mean(), "test/acc_noise_worst": levels.min()}
        self.log_dict(metrics, add_dataloader_idx=False)
        for acc in self.test_accs:
            acc.reset()

    def card_notes(self) -> str:
        arm = "with C³R (λ_v = λ_fe = 0.1, η = 1)" if self.hparams.c3 else "plain (no regulariser): C³R's baseline"
        return (
            f"The card's two-modality host classifier trained {arm} on its synthetic data: a causal modality `a` and "
            "a modality `b` with a spurious shortcut (the label's copy agrees with the label 90 % of the time in "
            "training). `test/acc_anti` is the anti-correlated test set (the shortcut always wrong), "
            "`test/acc_noise_*` Gaussian noise on `a`. The released code is a non-runnable sketch: the regulariser "
            "follows the card's reconstruction, and the paper's tables are not reproduced."
        )

