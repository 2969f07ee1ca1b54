"""``DyckDataModule``: Dyck-2 strings generated in code, in distribution for training, shifted for prompts.

Training and validation strings follow the training type probabilities ((0.2, 0.8) for ``(`` and ``[``); the test
split follows the flipped ones ((0.8, 0.2)): the out-of-distribution prompts of the backtracking paper. Every batch
is ``(tokens, prompt_lengths)``: complete strings ``(B, length + 2)`` and, for each, the length of the prefix used as
a prompt (drawn in [prompt_min, prompt_max] brackets after BOS; training ignores it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches
from zoo.datamodules.dyck import DyckGrammar

__all__ = ["DyckDataModule"]


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

    def grammar(self, shifted: bool = False) -> DyckGrammar:
        """The generator of the training (or, with ``shifted``, the test) distribution."""
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
