"""The frozen generator: the card's tiny GRU LM on SynLang (its own hub entry) or any Hugging Face causal LM.

Both sides offer the soft-input interface differentiable generation needs: ``embedding`` (the input table
``(V, d)``), ``begin(embeds) -> (logits, state)``, ``step(embed, state) -> (logits, state)`` and, for online
prompting, ``last_hidden(embeds)``. The Hugging Face side is :class:`zoo.models.backtrack_sampling.HFCausalLM`, the
adapter the zoo's samplers already use; the GRU is O(1) per generated token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric

from zoo.datamodules.synlang import SynLang
from zoo.module import ZooModule

__all__ = ["GRULM", "SynLangLM", "load_generator"]


class GRULM(nn.Module):
    """Embedding → 1-layer GRU → linear head, with the soft-input interface.

    Example:
        >>> lm = GRULM(98)
        >>> logits, state = lm.begin(lm.embedding[torch.ones(2, 4, dtype=torch.long)])
        >>> logits2, _ = lm.step(lm.embedding[torch.tensor([5, 6])], state)
        >>> logits.shape, logits2.shape
        (torch.Size([2, 98]), torch.Size([2, 98]))
    """

    def __init__(self, vocab_size: int, embed_dim: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.gru = nn.GRU(embed_dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    @property
    def embedding(self) -> Tensor:
        return self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits ``(B, L, V)``."""
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)

    def begin(self, embeds: Tensor) -> tuple[Tensor, Tensor]:
        out, h = self.gru(embeds)
        return self.head(out[:, -1]), h

    def step(self, embed: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        out, h = self.gru(embed[:, None], state)
        return self.head(out[:, -1]), h

    def last_hidden(self, embeds: Tensor) -> Tensor:
        return self.gru(embeds)[0][:, -1]


class SynLangLM(ZooModule):
    """The card's frozen tiny LM: a GRU trained by next-token cross-entropy on SynLang (Adam 3e-3).

    Logs ``{val,test}/nll`` (nats per token) and ``{val,test}/nll_gap``, its distance from the language's exact NLL
    on the same tokens (the card: within about 0.1 nat).

    Args:
        embed_dim: embedding width (32).
        hidden: GRU width (128).
        lr: Adam learning rate.
        language_seed: the SynLang it models.

    Example:
        >>> lm = SynLangLM()
        >>> lm(torch.ones(2, 5, dtype=torch.long)).shape
        torch.Size([2, 5, 98])
    """

    def __init__(self, embed_dim: int = 32, hidden: int = 128, lr: float = 3e-3, language_seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.language = SynLang(seed=language_seed)
        self.lm = GRULM(self.language.vocab_size, embed_dim, hidden)
        self.metrics = nn.ModuleDict({f"{s}_{m}": MeanMetric() for s in ("val", "test") for m in ("nll", "gap")})

    def forward(self, tokens: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """Next-token logits ``(B, L, V)``; a ``(tokens,)`` batch is accepted."""
        if isinstance(tokens, (tuple, list)):
            tokens = tokens[0]
        self.language._check(tokens)
        return self.lm(tokens)

    def _nll(self, tokens: Tensor) -> Tensor:
        logits = self(tokens)[:, :-1]
        return nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss = self._nll(batch[0]).mean()
        self.log_train({"train/nll": loss}, batch_idx, batch_size=len(batch[0]))
        return loss

    def _evaluate(self, batch: tuple[Tensor, ...], stage: str) -> None:
        tokens = batch[0]
        nll = self._nll(tokens)
        self.metrics[f"{stage}_nll"].update(nll)
        self.metrics[f"{stage}_gap"].update(nll - self.language.nll(tokens))
        self.log(f"{stage}/nll", self.metrics[f"{stage}_nll"], prog_bar=True)
        self.log(f"{stage}/nll_gap", self.metrics[f"{stage}_gap"])

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    def card_notes(self) -> str:
        return (
            "The frozen LM of `e2e-wm`: a 1-layer GRU (embedding 32, hidden 128) on SynLang, the card's synthetic "
            "language of 24 meaning classes × 4 synonyms whose exact likelihood is known. `test/nll_gap` is its NLL "
            "minus the language's exact NLL on the same test tokens."
        )


def load_generator(name: str, **hf_kwargs: Any) -> tuple[Any, Any]:
    """``(generator, text codec)`` for a zoo LM entry or folder (``"e2e-wm-lm"``), or a Hugging Face causal LM by
    name or folder. The codec is the :class:`~datamodules.synlang.SynLang` of a zoo LM, the tokenizer of an HF one.
    The generator is frozen (eval mode, no gradients)."""
    from zoo.registry import list_models

    if name in list_models():
        import zoo

        module = zoo.load(name)
        if not isinstance(module, SynLangLM):
            raise ValueError(f"{name!r} is a {type(module).__name__}, not a language model the watermark can drive")
        generator, codec = module.lm, module.language
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from zoo.models.backtrack_sampling.lm import HFCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(name, **hf_kwargs)
            codec = AutoTokenizer.from_pretrained(name, **hf_kwargs)
        except OSError as err:
            raise FileNotFoundError(
                f"{name!r} is neither a zoo LM entry nor a Hugging Face causal LM found locally or on the Hub ({err})"
            ) from None
        generator = HFCausalLM(model)
    for p in _parameters(generator):
        p.requires_grad_(False)
    _module(generator).eval()
    return generator, codec


def _module(generator: Any) -> nn.Module:
    return generator if isinstance(generator, nn.Module) else generator.model


def _parameters(generator: Any) -> list[nn.Parameter]:
    return list(_module(generator).parameters())
