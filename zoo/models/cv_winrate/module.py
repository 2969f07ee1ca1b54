"""``PairwiseRewardModel``: Lightning glue for a Bradley–Terry reward model that produces synthetic preferences."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, PearsonCorrCoef
from torchmetrics.classification import BinaryAccuracy

from zoo.arguments import check_choice, check_range
from zoo.metrics.pair_saving import AnnotationSaving
from zoo.models.cv_winrate.scorer import HFScorer, MLPScorer, bradley_terry_loss
from zoo.module import ZooModule

__all__ = ["PairwiseRewardModel"]


class PairwiseRewardModel(ZooModule):
    """Pairwise reward model (Bradley–Terry) whose ``predict`` gives the synthetic preferences ẑ of CV evaluation.

    Zhou, Song & Zanette (ICML 2025) estimate an LLM's win rate from a few human labels plus synthetic scores
    ``ẑ = σ(r(x, y_A) − r(x, y_B))`` of a reward model, combined by control variates (``zoo.metrics.win_rate``).
    The better ẑ correlates with human labels, the more annotations it saves (ρ² of them). This module trains the
    reward model: an MLP on feature vectors for the embedded tiny arena, or any Hugging Face sequence-classification
    reward model by name on text; fine-tuning on human preferences that leave out the evaluated LLM
    (``PreferenceDataModule(holdout_llm=k)``) raises ρ².

    Batches are dicts: ``x``, ``a``, ``b`` (feature tensors, or lists of prompt/response strings for ``scorer="hf"``),
    ``z`` (human label: 1 if A wins, 0 if B wins, 0.5 tie), ``llm_a``, ``llm_b`` (LLM ids).

    Test metrics: Bradley–Terry loss, pairwise accuracy on non-ties, pooled Pearson ρ of ẑ and z, the synthetic
    bias ``mean(ẑ) − mean(z)``, and ``saving``: the mean over model pairs of ρ² (the paper's saving ratio).

    Args:
        scorer: ``"mlp"`` (features) or ``"hf"`` (text, a Hugging Face reward model).
        dim: feature width for ``"mlp"``.
        hidden: MLP hidden width.
        hf_model: Hub id or folder of the reward model for ``"hf"``.
        max_length: token truncation for ``"hf"``.
        num_llms: LLM ids seen in evaluation (for the per-pair saving).
        min_pair_count: pairs with fewer test comparisons are left out of ``saving``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.

    Example:
        >>> model = PairwiseRewardModel(dim=8)
        >>> batch = {"x": torch.randn(4, 8), "a": torch.randn(4, 8), "b": torch.randn(4, 8)}
        >>> model(batch).shape
        torch.Size([4])
    """

    def __init__(
        self,
        scorer: Literal["mlp", "hf"] = "mlp",
        dim: int = 8,
        hidden: int = 32,
        hf_model: str | None = None,
        max_length: int = 512,
        num_llms: int = 6,
        min_pair_count: int = 100,
        lr: float = 1e-2,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        check_choice("scorer", scorer, ("mlp", "hf"))
        for name, value in (("dim", dim), ("hidden", hidden), ("max_length", max_length), ("num_llms", num_llms)):
            check_range(name, value, low=1 if name != "num_llms" else 2, integer=True)
        check_range("min_pair_count", min_pair_count, low=2, integer=True)
        check_range("lr", lr, low=0, low_open=True)
        check_range("weight_decay", weight_decay, low=0)
        self.save_hyperparameters()
        if scorer == "mlp":
            self.scorer: nn.Module = MLPScorer(dim, hidden)
        else:
            if not hf_model:
                raise ValueError("PairwiseRewardModel(scorer='hf') needs hf_model: a Hub id or a local folder.")
            self.scorer = HFScorer(hf_model, max_length)
        self.metrics = nn.ModuleDict(
            {
                stage: nn.ModuleDict(
                    {
                        "bt_loss": MeanMetric(),
                        "accuracy": BinaryAccuracy(),
                        "rho": PearsonCorrCoef(),
                        "synthetic_bias": MeanMetric(),
                        "saving": AnnotationSaving(num_llms, min_pair_count),
                    }
                )
                for stage in ("val", "test")
            }
        )

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        n = getattr(dm, "num_llms", None)
        if isinstance(n, int) and n > self.hparams.num_llms:
            raise ValueError(
                f"The data holds {n} LLMs but model.num_llms is {self.hparams.num_llms}: the per-pair saving needs "
                f"one cell per LLM pair. Set --model.init_args.num_llms {n}."
            )

    def reward_gap(self, batch: dict[str, Any]) -> Tensor:
        """``r(x, a) − r(x, b)`` ``(N,)``."""
        x = batch["x"] if "x" in batch else batch["prompt"]
        return self.scorer(x, batch["a"]) - self.scorer(x, batch["b"])

    def forward(self, batch: dict[str, Any]) -> Tensor:
        """Synthetic preferences ``ẑ = σ(r(x, a) − r(x, b))`` ``(N,)``: the probability that A wins."""
        return torch.sigmoid(self.reward_gap(batch))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss = bradley_terry_loss(self.reward_gap(batch), batch["z"].float())
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(batch["z"]))
        return loss

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        z = batch["z"].float()
        delta = self.reward_gap(batch)
        z_hat = torch.sigmoid(delta)
        m = self.metrics[stage]
        m["bt_loss"].update(bradley_terry_loss(delta, z), weight=(z != 0.5).sum().clamp(min=1))
        decided = z != 0.5
        m["accuracy"].update(z_hat[decided], z[decided].long())
        m["rho"].update(z_hat, z)
        m["synthetic_bias"].update(z_hat - z)
        m["saving"].update(z, z_hat, batch["llm_a"], batch["llm_b"])
        for key, metric in m.items():
            self.log(f"{stage}/{key}", metric, prog_bar=key == "saving", batch_size=len(z))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    @classmethod
    def card_notes(cls) -> str:
        """Limits written into the model card (``zoo publish``)."""
        return (
            "- A tiny MLP reward model on the embedded tiny arena (6 synthetic LLMs, feature vectors, a known human "
            'utility), not a language reward model; `scorer="hf"` takes any Hugging Face reward model by name.\n'
            "- `saving` is the mean over model pairs of ρ² between ẑ and human labels on the held-out split: the "
            "fraction of human labels control-variates evaluation saves at equal variance.\n"
            "- The synthetic scores are biased (`synthetic_bias`): use them through the control-variates estimator "
            "(`zoo.metrics.win_rate`), never alone.\n"
            "- Test metrics are measured on the test split of the data named above: for the off-the-shelf entry that is "
            "its own shifted population; on the arena pairs of the held-out LLM 0 it saves far less (measure with "
            "`zoo test -c conf/cv-winrate.yaml --pretrained cv-winrate-offshelf`)."
        )
