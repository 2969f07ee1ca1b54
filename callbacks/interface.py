"""``required_tensor``: how a generic callback reads (and checks) the module attribute it is documented to need."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule
from torch import Tensor

__all__ = ["required_tensor"]


def required_tensor(callback: Callback, pl_module: LightningModule, attribute: str, ndim: int, shape: str) -> Tensor:
    """Return ``pl_module.<attribute>`` if it is an ``ndim``-D tensor, else raise one TypeError saying what to add.

    Args:
        callback: the callback asking (named in the message).
        pl_module: the module that should offer the attribute (usually a property).
        attribute: its name, e.g. ``"dictionary"``.
        ndim: the number of dimensions it must have.
        shape: its documented shape and meaning, e.g. ``"a (num_atoms, dim) tensor"``.

    Example:
        >>> import torch
        >>> from lightning import LightningModule
        >>> class M(LightningModule):
        ...     weights = torch.ones(3)
        >>> required_tensor(Callback(), M(), "weights", 1, "an (M,) tensor").shape
        torch.Size([3])
    """
    value = getattr(pl_module, attribute, None)
    if not isinstance(value, Tensor) or value.ndim != ndim:
        got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(
            f"{type(callback).__name__} needs `{type(pl_module).__name__}.{attribute}` as {shape}, got {got}. "
            "Add that property, or remove the callback."
        )
    return value
