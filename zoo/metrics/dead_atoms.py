"""Dead-atom fraction: the share of dictionary atoms whose code never fired (RA-SAE §3, "dead-code ratio")."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["DeadAtomFraction"]


class DeadAtomFraction(Metric):
    """Fraction of dictionary atoms that never fired. ``update(codes)``: ``(N, num_atoms)``; ``compute()``: scalar.

    An atom fires on a sample when its code is ``> 0`` (TopK/ReLU codes are non-negative). Counts are summed over
    every ``update`` since the last reset (an epoch, when logged as an object), so an atom is dead only if it
    stayed silent on all of them; ``alive()`` gives the mask of the others, for example to restrict
    ``dictionary_stability`` to atoms that are in use.

    Args:
        num_atoms: number of atoms k (code width).
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: ``num_atoms`` is not a positive int; ``codes`` is not ``(N, num_atoms)``.

    Example:
        >>> m = DeadAtomFraction(num_atoms=4)
        >>> m.update(torch.tensor([[0.0, 1.0, 0.0, 2.0]]))
        >>> m.compute()
        tensor(0.5000)
        >>> m.alive()
        tensor([False,  True, False,  True])
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    fired: Tensor

    def __init__(self, num_atoms: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_atoms, int) or isinstance(num_atoms, bool) or num_atoms < 1:
            raise ValueError(f"Expected argument `num_atoms` to be a positive int but got {num_atoms!r}.")
        self.add_state("fired", default=torch.zeros(num_atoms), dist_reduce_fx="sum")  # fixed size: cheap DDP sync

    def update(self, codes: Tensor) -> None:
        """Count, per atom, the samples of ``codes`` ``(N, num_atoms)`` on which it fired."""
        if codes.ndim != 2 or codes.shape[1] != self.fired.numel():
            raise ValueError(
                f"Expected codes of shape (N, {self.fired.numel()}), got {tuple(codes.shape)}. "
                "Pass the encoder's codes, not the activations."
            )
        self.fired += (codes > 0).sum(0)

    def compute(self) -> Tensor:
        """The fraction of atoms with no firing, in ``[0, 1]``."""
        return (self.fired == 0).float().mean()

    def alive(self) -> Tensor:
        """Bool mask ``(num_atoms,)`` of the atoms that fired at least once since the last reset.

        Reads this process's counts; under DDP call it inside ``with metric.sync_context():`` for the global mask
        (a collective, so on every rank, as ``compute()``).
        """
        return self.fired > 0
