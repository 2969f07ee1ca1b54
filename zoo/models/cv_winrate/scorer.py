"""Reward-model scorers r(x, y) and the Bradley–Terry preference loss, in plain torch.

A scorer maps a prompt and a response to a scalar reward. The synthetic preference that A beats B is the
Bradley–Terry probability ``ẑ = σ(r(x, y_A) − r(x, y_B))`` (the official code's ``1 / (1 + exp(r_B − r_A))``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MLPScorer", "HFScorer", "bradley_terry_loss", "preference_probability"]


class MLPScorer(nn.Module):
    """Reward ``r(x, y) = MLP([x, y])`` on feature vectors: the tiny arena's reward model (card §5, 8 → 32 → 1 on y).

    The prompt features are given to the MLP too, so the same scorer works when utilities depend on the prompt.

    Args:
        dim: width of the prompt and response features.
        hidden: hidden width.

    Example:
        >>> r = MLPScorer(dim=8)
        >>> r(torch.randn(5, 8), torch.randn(5, 8)).shape
        torch.Size([5])
    """

    def __init__(self, dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.dim = dim
        self.net = nn.Sequential(nn.Linear(2 * dim, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Rewards ``(N,)`` for prompts ``x`` ``(N, dim)`` and responses ``y`` ``(N, dim)``."""
        if x.shape != y.shape or x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(
                f"MLPScorer expects prompt and response features of shape (N, {self.dim}), got {tuple(x.shape)} and "
                f"{tuple(y.shape)}. Set model.dim to the data's feature width (data.dim)."
            )
        return self.net(torch.cat([x, y], dim=1)).squeeze(1)


class HFScorer(nn.Module):
    """Reward from a Hugging Face sequence-classification model: ``r(x, y)`` = logit 0 of ``(prompt, response)``.

    The real path (Skywork, GRM, ArmoRM reward models in the paper): any ``AutoModelForSequenceClassification``
    checkpoint with one output, named by Hub id or local folder (holding the tokenizer too). Loading is offline
    when ``HF_HUB_OFFLINE=1`` or the folder is local. When the tokenizer has a chat template, the conversation is
    rendered with it (as the official evaluation does); otherwise prompt and response are encoded as a text pair.

    Args:
        model: Hub id or folder of the reward model and its tokenizer.
        max_length: truncation length in tokens.
    """

    def __init__(self, model: str, max_length: int = 512) -> None:
        super().__init__()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1)
        if self.tokenizer.pad_token is None:  # decoder reward models often ship without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.max_length = max_length

    def _encode(self, prompts: list[str], responses: list[str]) -> dict[str, Tensor]:
        if len(prompts) != len(responses):
            raise ValueError(f"Expected as many prompts as responses, got {len(prompts)} and {len(responses)}.")
        if getattr(self.tokenizer, "chat_template", None):
            texts = [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}, {"role": "assistant", "content": r}], tokenize=False
                )
                for p, r in zip(prompts, responses)
            ]
            enc = self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
        else:
            enc = self.tokenizer(
                prompts, responses, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
            )
        device = next(self.model.parameters()).device
        return {k: v.to(device) for k, v in enc.items()}

    def forward(self, x: list[str], y: list[str]) -> Tensor:
        """Rewards ``(N,)`` for prompt texts ``x`` and response texts ``y``."""
        return self.model(**self._encode(list(x), list(y))).logits[:, 0]


def preference_probability(scorer: nn.Module, x: Any, a: Any, b: Any) -> Tensor:
    """``ẑ = σ(r(x, a) − r(x, b))``, the probability that response A is preferred, ``(N,)``."""
    return torch.sigmoid(scorer(x, a) - scorer(x, b))


def bradley_terry_loss(delta: Tensor, z: Tensor) -> Tensor:
    """Bradley–Terry loss ``−log σ(r_chosen − r_rejected)`` on reward gaps ``delta = r_A − r_B`` and labels ``z``.

    Ties (``z = 0.5``) are dropped, as in the official fine-tuning. Written as binary cross-entropy with logits on
    the gap, which equals ``−log σ(r_chosen − r_rejected)`` for z ∈ {0, 1}. Returns 0 (with a graph) when every
    pair in the batch is a tie.

    Example:
        >>> bradley_terry_loss(torch.tensor([2.0, -1.0, 0.3]), torch.tensor([1.0, 0.0, 0.5])).round(decimals=4)
        tensor(0.2201)
    """
    keep = z != 0.5
    if not bool(keep.any()):
        return delta.sum() * 0.0
    return F.binary_cross_entropy_with_logits(delta[keep], z[keep])
