"""``DyckDataModule``: Dyck-2 strings generated in code, in distribution for training, shifted for prompts.

Training and validation strings follow the training type probabilities ((0.2, 0.8) for ``(`` and ``[``); the test
split follows the flipped ones ((0.8, 0.2)): the out-of-distribution prompts of the backtracking paper. Every batch
is ``(tokens, prompt_lengths)``: complete strings ``(B, length + 2)`` and, for each, the length of the prefix used as
a prompt (drawn in [prompt_min, prompt_max] brackets after BOS; training ignores it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from datamodules.base import BatchedDataModule, TensorBatches

__all__ = ["DyckDataModule", "PrefixErrorDataModule", "error_pairs"]


class DyckDataModule(BatchedDataModule):
    """Dyck-2 strings of ``length`` brackets: in-distribution train/val splits and a shifted test split of prompts.

    Args:
        length: brackets per string (even).
        max_depth: the generator's maximum depth.
        type_probs: training push probabilities of ``(`` and ``[``.
        ood_type_probs: the test split's (shifted) push probabilities.
        train_size: training strings.
        val_size: validation strings (in distribution).
        test_size: test strings (shifted), i.e. prompts.
        prompt_min: fewest brackets in a prompt (after BOS).
        prompt_max: most brackets in a prompt.
        batch_size: strings per batch.
        num_workers: DataLoader workers.
        seed: seed of the strings and prompt lengths.

    Example:
        >>> dm = DyckDataModule(train_size=256, batch_size=32)
        >>> dm.setup("fit")
        >>> tokens, prompt_lengths = next(iter(dm.train_dataloader()))
        >>> tokens.shape, int(prompt_lengths.min()) >= 7
        (torch.Size([32, 26]), True)
    """

    def __init__(
        self,
        length: int = 24,
        max_depth: int = 8,
        type_probs: tuple[float, float] = (0.2, 0.8),
        ood_type_probs: tuple[float, float] = (0.8, 0.2),
        train_size: int = 40000,
        val_size: int = 1000,
        test_size: int = 300,
        prompt_min: int = 6,
        prompt_max: int = 16,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 1 <= prompt_min <= prompt_max < length:
            raise ValueError(f"need 1 ≤ prompt_min ≤ prompt_max < length, got {prompt_min}, {prompt_max}, {length}")
        self.save_hyperparameters()

    def grammar(self, shifted: bool = False):  # noqa: ANN201 - DyckGrammar, imported lazily
        """The generator of the training (or, with ``shifted``, the test) distribution."""
        from zoo.models.backtrack_sampling.dyck import DyckGrammar

        hp = self.hparams
        return DyckGrammar(hp.length, hp.max_depth, tuple(hp.ood_type_probs if shifted else hp.type_probs))

    def _split(self, n: int, shifted: bool, generator: torch.Generator) -> TensorBatches:
        hp = self.hparams
        tokens = self.grammar(shifted).sample(n, generator=generator)
        prompt = 1 + torch.randint(hp.prompt_min, hp.prompt_max + 1, (n,), generator=generator)
        return TensorBatches(tokens, prompt)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        g = torch.Generator().manual_seed(hp.seed)
        self.train_set = self._split(hp.train_size, False, g)
        self.val_set = self._split(hp.val_size, False, g)
        self.test_set = self._split(hp.test_size, True, g)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        return (
            f"Dyck-2, {hp.length} brackets, max depth {hp.max_depth}: {hp.train_size} training strings with push "
            f"probabilities {tuple(hp.type_probs)}, test prompts of {hp.prompt_min}–{hp.prompt_max} brackets cut from "
            f"{hp.test_size} strings with {tuple(hp.ood_type_probs)} (seed {hp.seed})"
        )


def error_pairs(
    lm: Any, grammar: Any, prompts: Tensor, prompt_lengths: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The probe's training pairs from the LM's own plain-sampled completions (the official ``train_err_pred``):

    for an erroneous completion, the prefix ending at its first error token (label 1) and one random earlier prefix
    with at least one generated token (label 0); for a correct completion, one random prefix (label 0). Returns
    ``(hidden, label, tokens, lengths)``: the LM's last-layer state at each prefix's last token, and the prefixes.
    """
    from zoo.models.backtrack_sampling.lm import CachedLM
    from zoo.models.backtrack_sampling.samplers import generate

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
            f"(half in distribution, half shifted prompts), labelled by the exact verifier, split 80/10/10 (seed {hp.seed})"
        )
