"""``PrefixErrorDataModule``: the learned verifier's training data, labelled prefixes of a Dyck LM's own samples.

It lives with the paper, not in ``datamodules/``: the data is made by running the paper's LM and sampler, and data
never depends on a model package (``datamodules/`` holds the grammar both sides use).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches
from zoo.datamodules.grammar import DyckDataModule
from zoo.models.backtrack_sampling.lm import CachedLM
from zoo.models.backtrack_sampling.samplers import generate

__all__ = ["PrefixErrorDataModule", "error_pairs"]


def error_pairs(
    lm: Any, grammar: Any, prompts: Tensor, prompt_lengths: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The probe's training pairs from the LM's own plain-sampled completions (the official ``train_err_pred``):

    for an erroneous completion, the prefix ending at its first error token (label 1) and one random earlier prefix
    with at least one generated token (label 0); for a correct completion, one random prefix (label 0). Returns
    ``(hidden, label, tokens, lengths)``: the LM's last-layer state at each prefix's last token, and the prefixes.
    """
    out = generate(CachedLM(lm), prompts, prompt_lengths, grammar.seq_len, None, generator=generator)
    tokens, n = out.tokens, len(out.tokens)
    # First error: the shortest prefix the exact verifier rejects (seq_len + 1 where none is).
    first = torch.full((n,), grammar.seq_len + 1, dtype=torch.long)
    for k in range(grammar.seq_len, 0, -1):
        bad = ~grammar.accept_prefix(tokens, torch.full((n,), k))
        first = torch.where(bad, torch.full_like(first, k), first)
    wrong = first <= grammar.seq_len
    # A random prefix length in [prompt + 1, first error − 1] (or up to the end for correct completions).
    upper = torch.where(wrong, first - 1, torch.full_like(first, grammar.seq_len))
    lower = prompt_lengths + 1
    has_negative = upper >= lower
    pick = lower + (torch.rand(n, generator=generator) * (upper - lower + 1).clamp(min=1)).long()
    lengths = torch.cat([first[wrong], pick[has_negative]])
    rows = torch.cat([tokens[wrong], tokens[has_negative]])
    labels = torch.cat([torch.ones(int(wrong.sum())), torch.zeros(int(has_negative.sum()))]).long()
    with torch.no_grad():
        _, hidden = lm(rows)
    hidden = hidden[torch.arange(len(rows)), lengths - 1]
    return hidden, labels, rows, lengths


class PrefixErrorDataModule(BatchedDataModule):
    """Labelled prefixes for the learned verifier: ``(hidden state, error label)`` batches from an LM's samples.

    The LM (a hub entry or folder, default ``backtrack-sampling``) completes prompts cut from in-distribution and
    shifted Dyck strings (half each) by plain sampling; :func:`error_pairs` turns the completions into first-error
    positives and earlier-position negatives, labelled by the exact verifier. Split 80 / 10 / 10 at random (seeded).

    Args:
        lm: hub entry name or folder of a ``DyckLM``.
        num_prompts: completions sampled (about 1–2 labelled prefixes each).
        batch_size: prefixes per batch.
        num_workers: DataLoader workers.
        seed: seed of the prompts, the sampling and the split.

    Example:
        >>> dm = PrefixErrorDataModule(num_prompts=200)
        >>> dm.setup("fit")
        >>> hidden, label = next(iter(dm.train_dataloader()))
        >>> hidden.shape[1], set(label.tolist()) <= {0, 1}
        (64, True)
    """

    def __init__(
        self,
        lm: str = "backtrack-sampling",
        num_prompts: int = 4000,
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        import zoo

        hp = self.hparams
        model = zoo.load(hp.lm)
        hidden, labels = self.pairs(model, hp.num_prompts, hp.seed)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(hp.seed))
        n_val = n_test = len(order) // 10
        parts = order[n_val + n_test :], order[:n_val], order[n_val : n_val + n_test]
        self.train_set, self.val_set, self.test_set = (TensorBatches(hidden[p], labels[p]) for p in parts)

    @staticmethod
    def pairs(model: Any, num_prompts: int, seed: int) -> tuple[Tensor, Tensor]:
        """``(hidden, label)`` pairs from ``num_prompts`` completions of a ``DyckLM`` (half shifted prompts)."""
        hp = model.hparams
        g = torch.Generator().manual_seed(seed)
        dm = DyckDataModule(hp.length, hp.max_depth, train_size=1, val_size=1, test_size=1, seed=seed)
        prompts, lengths = [], []
        for shifted, n in ((False, num_prompts // 2), (True, num_prompts - num_prompts // 2)):
            split = dm._split(n, shifted, g)
            prompts.append(split.tensors[0])
            lengths.append(split.tensors[1])
        hidden, labels, _, _ = error_pairs(model.lm.eval(), model.grammar, torch.cat(prompts), torch.cat(lengths), g)
        return hidden, labels

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        return (
            f"first-error / earlier-position prefixes of {hp.num_prompts} plain-sampled completions by `{hp.lm}` "
            "(half in distribution, half shifted prompts), labelled by the exact verifier, split 80/10/10 "
            f"(seed {hp.seed})"
        )
