"""``DyckLM``: the tiny causal LM trained on Dyck-2 (next-token loss), with the samplers and the exact verifier."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric

from zoo.datamodules.dyck import VOCAB, DyckGrammar
from zoo.models.backtrack_sampling.lm import CachedLM, TinyCausalLM
from zoo.models.backtrack_sampling.samplers import Generation, Verifier, block_best_of_n, generate, rejection_sample
from zoo.module import ZooModule

__all__ = ["DyckLM"]

Method = Literal["plain", "backtrack", "tokenwise", "rejection", "best_of_n"]


class DyckLM(ZooModule):
    """A tiny causal transformer trained on Dyck-2 strings, and verifier-assisted sampling from it.

    Training is the next-token cross-entropy (AdamW, linear warm-up then linear decay, as the official Dyck LM).
    Validation and test log the loss and the accuracy on closing brackets (the only deterministic tokens); test also
    completes every test prompt once by plain sampling and once with backtracking under the exact verifier (Q = 4,
    B = 4), logging the share of valid strings (``test/plain_accuracy``, ``test/backtrack_accuracy``) with a fixed
    random stream per batch.

    Args:
        length: brackets per string.
        max_depth: the training distribution's maximum depth (for the record; the verifier does not enforce it).
        d_model: transformer width.
        n_layers: blocks.
        n_heads: attention heads.
        d_mlp: MLP width.
        dropout: dropout in training.
        lr: peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up steps.

    Example:
        >>> model = DyckLM()
        >>> prompts = torch.tensor([[1, 3, 5, 6]])  # "B([]"
        >>> out = model.generate(prompts, torch.tensor([4]), method="backtrack", generator=torch.Generator().manual_seed(0))
        >>> out.tokens.shape, int(out.lengths[0])
        (torch.Size([1, 26]), 26)
    """

    def __init__(
        self,
        length: int = 24,
        max_depth: int = 8,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_mlp: int = 128,
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 100,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.grammar = DyckGrammar(length, max_depth)
        self.lm = TinyCausalLM(VOCAB, length + 2, d_model, n_layers, n_heads, d_mlp, dropout)
        self.metrics = nn.ModuleDict(
            {name: MeanMetric() for name in ("val_closing", "test_closing", "test_plain", "test_backtrack")}
        )

    def forward(self, tokens: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """Next-token logits ``(B, L, V)``; a ``(tokens, prompt_lengths)`` batch is accepted."""
        if isinstance(tokens, (tuple, list)):
            tokens = tokens[0]
        return self.lm(tokens)[0]

    # ------------------------------------------------------------------------------------------------ sampling
    def exact_verifier(self, tokens: Tensor, lengths: Tensor, hidden: Tensor | None = None) -> Tensor:
        """The exact process verifier as P(error): 1 where the prefix can no longer become a valid string."""
        return (~self.grammar.accept_prefix(tokens.cpu(), lengths.cpu())).float().to(tokens.device)

    def generate(
        self,
        prompts: Tensor,
        prompt_lengths: Tensor,
        method: Method = "backtrack",
        verifier: Verifier | None = None,
        **kwargs: Any,
    ) -> Generation:
        """Complete ``prompts`` to full strings with ``method`` (the verifier defaults to the exact one).

        ``"plain"``, ``"backtrack"`` (Q = 4, B = 4), ``"tokenwise"`` (B = 1, Q = 16), ``"rejection"`` (4 attempts) or
        ``"best_of_n"`` (blocks of 6, N = 4); ``kwargs`` go to the sampler (``temperature``, ``top_p``, ``quota``,
        ``stride``, ``threshold``, ``generator``...). ``"tokenwise"`` runs with ``forbid_repeat=False``: erasing one
        token returns to the previous prefix, so a redrawn copy of the rejected token must be rejected again rather
        than kept as an already-visited prefix.
        """
        lm = CachedLM(self.lm.eval())
        verifier = verifier or self.exact_verifier
        length = self.grammar.seq_len
        if method == "plain":
            return generate(lm, prompts, prompt_lengths, length, None, **kwargs)
        if method == "backtrack":
            return generate(lm, prompts, prompt_lengths, length, verifier, **kwargs)
        if method == "tokenwise":
            return generate(
                lm,
                prompts,
                prompt_lengths,
                length,
                verifier,
                **{"stride": 1, "quota": 16, "forbid_repeat": False, **kwargs},
            )
        if method == "rejection":
            return rejection_sample(lm, prompts, prompt_lengths, length, self.grammar.accept, **kwargs)
        if method == "best_of_n":
            return block_best_of_n(lm, prompts, prompt_lengths, length, verifier, **kwargs)
        raise ValueError(f"unknown method {method!r}; choose plain, backtrack, tokenwise, rejection or best_of_n")

    # ------------------------------------------------------------------------------------------------ training
    def _loss(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        logits = self(tokens)[:, :-1]
        target = tokens[:, 1:]
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        closing = (target == 4) | (target == 6)
        correct = (logits.argmax(-1) == target)[closing].float()
        return loss, correct

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch[0])
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(batch[0]))
        return loss

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        loss, correct = self._loss(batch[0])
        self.metrics["val_closing"].update(correct)
        self.log("val/loss", loss, batch_size=len(batch[0]), sync_dist=True)
        self.log("val/closing_accuracy", self.metrics["val_closing"], prog_bar=True)

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        tokens, prompt_lengths = batch[0], batch[1]
        loss, correct = self._loss(tokens)
        self.metrics["test_closing"].update(correct)
        self.log("test/loss", loss, batch_size=len(tokens), sync_dist=True)
        self.log("test/closing_accuracy", self.metrics["test_closing"])
        for name in ("plain", "backtrack"):
            g = torch.Generator(device=tokens.device).manual_seed(batch_idx)
            out = self.generate(tokens, prompt_lengths, name, generator=g)
            self.metrics[f"test_{name}"].update(self.grammar.accept(out.tokens.cpu(), out.lengths.cpu()).float())
            self.log(f"test/{name}_accuracy", self.metrics[f"test_{name}"])

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        g = torch.Generator(device=batch[0].device).manual_seed(batch_idx)
        return self.generate(batch[0], batch[1], "backtrack", generator=g).tokens

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=hp.lr
        )
        total = max(int(self.trainer.estimated_stepping_batches), hp.warmup_steps + 1)

        def schedule(step: int) -> float:  # linear warm-up, then linear decay to 0 (the official Dyck LM)
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            return max(0.0, (total - step) / (total - hp.warmup_steps))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def card_notes(self) -> str:
        return (
            "`test/plain_accuracy` and `test/backtrack_accuracy` are the shares of valid Dyck-2 strings when the LM "
            "completes the shifted test prompts ((0.8, 0.2) push probabilities against the (0.2, 0.8) it was trained "
            "on) by plain sampling and by tokenwise rejection sampling with backtracking under the exact verifier "
            "(Q = 4, B = 4), one sample per prompt. `zoo reproduce backtrack-sampling` compares every sampler with "
            "both verifiers. A 2-layer, 64-wide transformer on a synthetic grammar: the paper's CodeLlama experiment "
            "is not reproduced."
        )
