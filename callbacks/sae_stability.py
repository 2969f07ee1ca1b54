"""``SAEStability``: log the RA-SAE stability of a sparse autoencoder's dictionary during validation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from zoo.callbacks.interface import required_tensor
from zoo.metrics import dictionary_stability, stability_floor_gaussian, stability_floor_points

__all__ = ["SAEStability"]

_SUFFIXES = (".safetensors", ".npy")


def _load_reference(path: Path) -> Tensor:
    """The ``(k, d)`` reference dictionary stored at ``path``, as a float32 cpu tensor."""
    if not path.is_file():
        raise FileNotFoundError(
            f"No reference dictionary at {path}. SAEStability(reference=...) expects a .safetensors file with a "
            "tensor named 'dictionary', or a .npy file, of shape (num_atoms, dim). Save one with "
            "safetensors.torch.save_file({'dictionary': D}, path) or numpy.save, or leave reference at None to "
            "log how much the dictionary still moves."
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if "dictionary" not in tensors:
            raise ValueError(
                f"{path} has no tensor named 'dictionary' (it holds {sorted(tensors)}). "
                "Save the reference as safetensors.torch.save_file({'dictionary': D}, path)."
            )
        ref = tensors["dictionary"]
    else:
        ref = torch.from_numpy(np.load(path, allow_pickle=False))  # never unpickle a user file
    if ref.ndim != 2:
        raise ValueError(f"Expected the reference dictionary {path} to be (num_atoms, dim), got {tuple(ref.shape)}.")
    return ref.to(torch.float32)


class SAEStability(Callback):
    """Log how stable an SAE's dictionary is (RA-SAE stability: mean cosine of Hungarian-matched atoms).

    Requires ``pl_module.dictionary``: a ``(num_atoms, dim)`` tensor (a property). Every zoo SAE offers it.

    Every ``every_n_epochs`` validation epochs (never in the sanity check) the current dictionary is compared:

    - with ``reference`` (for example the dictionary of another seed's run): logs ``val/stability``;
    - without: with the dictionary of the previous such validation, logging ``val/stabilization`` (how much it
      still moves; 1 means it stopped). Nothing is logged the first time.

    Next to it, the chance levels to read the number against: ``val/stability_floor_gaussian`` (two independent
    Gaussian dictionaries of the same shape, seeded, so the same every epoch) and, with ``floor_points``,
    ``val/stability_floor_points`` (two disjoint draws of validation rows; a dictionary that copies data points
    scores about this). The floors are computed once and cached.

    Cost: the Hungarian solve is O(k³) time, O(k²) float64 memory, on cpu. Above ``max_atoms`` atoms a seeded
    random subset of ``max_atoms`` rows is matched instead (the same rows every time, and the same row indices of
    the reference or previous dictionary); the floors then use ``max_atoms`` too, so they stay comparable. With
    a reference whose atoms are in another order, subsampling lowers the score, since a sampled atom's partner
    may not be in the sampled reference rows. Around 4096 atoms a solve takes seconds.

    Scalars go through ``pl_module.log`` (``sync_dist=False``: every rank computes the same value from the same
    weights). The points floor uses each rank's own validation rows.

    Args:
        reference: path of a ``.safetensors`` file holding a tensor named ``"dictionary"``, or of a ``.npy`` file,
            shape ``(k', dim)``; ``None`` compares the dictionary with its previous self.
        every_n_epochs: compute at the validation of every n-th epoch (``current_epoch + 1`` divisible by n).
        floor_points: collect the first ``2 * min(num_atoms, max_atoms)`` validation rows (the batch, or its
            first element when it is a tuple or list, as ``(B, dim)``) and log the random data points floor.
        max_atoms: largest number of atoms matched; larger dictionaries are subsampled.
        seed: seed of the Gaussian floor, the points draw and the atom subset.

    Attributes:
        previous: the dictionary at the previous computation, ``(num_atoms, dim)`` float32 cpu, or ``None``; saved
            in checkpoints, so a resumed run logs ``val/stabilization`` at its first validation.

    Raises:
        ValueError: an argument is out of range, or the reference is not ``.safetensors``/``.npy`` (in
            ``__init__``); the reference's width differs from the dictionary's (in ``setup``).
        TypeError: ``pl_module.dictionary`` is missing or not a 2-D tensor (in ``setup``).
        FileNotFoundError: ``reference`` does not exist (in ``setup``).

    Example:
        >>> cb = SAEStability(every_n_epochs=2, max_atoms=1024)
        >>> cb.state_key
        "SAEStability{'reference': None}"
    """

    def __init__(
        self,
        reference: str | None = None,
        every_n_epochs: int = 1,
        floor_points: bool = True,
        max_atoms: int = 4096,
        seed: int = 0,
    ) -> None:
        if reference is not None:
            if not isinstance(reference, (str, os.PathLike)):
                raise TypeError(f"Expected argument `reference` to be a path or None but got {reference!r}.")
            if Path(reference).suffix not in _SUFFIXES:
                raise ValueError(
                    f"Expected argument `reference` to be a .safetensors or .npy file but got {os.fspath(reference)!r}."
                )
        for name, value in (("every_n_epochs", every_n_epochs), ("max_atoms", max_atoms)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Expected argument `{name}` to be a positive int but got {value!r}.")
        if not isinstance(floor_points, bool):
            raise ValueError(f"Expected argument `floor_points` to be a bool but got {floor_points!r}.")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"Expected argument `seed` to be an int but got {seed!r}.")
        self.reference = None if reference is None else os.fspath(reference)
        self.every_n_epochs = every_n_epochs
        self.floor_points = floor_points
        self.max_atoms = max_atoms
        self.seed = seed
        self.previous: Tensor | None = None
        self._reference: Tensor | None = None
        self._dim = 0
        self._rows: list[Tensor] = []
        self._num_rows = 0
        self._rows_needed = 0
        self._floors: dict[str, float] = {}
        self._warned = False

    @property
    def state_key(self) -> str:
        # Two instances with different references keep apart in a checkpoint.
        return self._generate_state_key(reference=self.reference)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        D = self._dictionary(pl_module)
        self._dim = D.shape[1]
        self._rows_needed = 2 * min(D.shape[0], self.max_atoms)
        if self.reference is not None:
            ref = _load_reference(Path(self.reference))
            if ref.shape[1] != D.shape[1]:
                raise ValueError(
                    f"The reference dictionary {self.reference} has shape {tuple(ref.shape)}, but "
                    f"`{type(pl_module).__name__}.dictionary` has shape {tuple(D.shape)}: the widths (dim) differ. "
                    "Pass a reference from a model trained on activations of the same width."
                )
            self._reference = ref

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self.floor_points or self._num_rows >= self._rows_needed:
            return
        x = batch[0] if isinstance(batch, (tuple, list)) and len(batch) > 0 else batch
        if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != self._dim:
            return  # not activations; the epoch end warns once that the points floor is missing
        # One slice and one copy per batch, only until the reservoir is full: no per-sample work.
        rows = x[: self._rows_needed - self._num_rows].detach().to("cpu", torch.float32)
        self._rows.append(rows)
        self._num_rows += rows.shape[0]

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs != 0:
            return
        with torch.no_grad():
            D = self._dictionary(pl_module).detach().to("cpu", torch.float32).clone()
        if self._reference is not None:
            pl_module.log("val/stability", self._stability(D, self._reference), sync_dist=False)
        else:
            # A previous dictionary of another width (a checkpoint of another model) cannot be matched: restart.
            if self.previous is not None and self.previous.shape[1] == D.shape[1]:
                pl_module.log("val/stabilization", self._stability(D, self.previous), sync_dist=False)
            self.previous = D
        for key, value in self._compute_floors(D.shape[0]).items():
            pl_module.log(key, value, sync_dist=False)

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous = state_dict.get("previous")

    def _dictionary(self, pl_module: LightningModule) -> Tensor:
        return required_tensor(self, pl_module, "dictionary", 2, "a (num_atoms, dim) tensor")

    def _subsample(self, D: Tensor) -> Tensor:
        if D.shape[0] <= self.max_atoms:
            return D
        # Same seed, same permutation for equal k: the current and previous dictionaries keep the same atoms.
        index = torch.randperm(D.shape[0], generator=torch.Generator().manual_seed(self.seed))
        return D[index[: self.max_atoms]]

    def _stability(self, D: Tensor, D_ref: Tensor) -> float:
        return float(dictionary_stability(self._subsample(D), self._subsample(D_ref)))

    def _compute_floors(self, num_atoms: int) -> dict[str, float]:
        k = min(num_atoms, self.max_atoms)
        if "val/stability_floor_gaussian" not in self._floors:
            generator = torch.Generator().manual_seed(self.seed)
            self._floors["val/stability_floor_gaussian"] = float(stability_floor_gaussian(k, self._dim, generator))
        if self.floor_points and "val/stability_floor_points" not in self._floors:
            if self._num_rows >= 2 * k:
                x = torch.cat(self._rows)
                generator = torch.Generator().manual_seed(self.seed)
                self._floors["val/stability_floor_points"] = float(stability_floor_points(x, k, generator))
                self._rows, self._num_rows = [x], x.shape[0]
            elif not self._warned:
                self._warned = True
                rank_zero_warn(
                    f"SAEStability collected {self._num_rows} validation rows of the {2 * k} that "
                    "val/stability_floor_points needs; it is not logged yet. Validation batches must be (B, "
                    f"{self._dim}) tensors, or tuples/lists whose first element is one; or set floor_points=False.",
                    stacklevel=2,
                )
        return self._floors
