"""``check_finite``: the one check that data read from a user's file holds no NaN or inf, run once after reading.

Every DataModule path that reads user files (activation ``.npy`` files and caches, feature files, stream files, vector
sources, score files) calls it right after loading, so bad data stops ``setup`` with one line that names the file and
the first bad row, before any fitting: otherwise the first to notice is k-means, a loss turning NaN many steps later,
or a silently wrong score.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["check_finite"]


def check_finite(
    data: np.ndarray | Tensor, source: str | Path, *, first_row: int = 0, unit: str = "row", chunk_rows: int = 65536
) -> None:
    """Raise ``ValueError`` naming ``source`` and the first row (and column) that holds NaN or inf.

    Rows are the first axis, columns the flattened rest (``(n,)`` arrays have no column). The array is read in chunks
    of ``chunk_rows`` rows, so a memory-mapped file is checked without being loaded whole. Integer and boolean data
    pass at once.

    Args:
        data: the array as read (numpy, memory-mapped, or a tensor).
        source: what to name in the message: the file, and the array where a file holds several.
        first_row: the number the message gives the array's row 0 (a CSV's first data line, say).
        unit: what a row is called in the message (``"row"``, ``"line"``).
        chunk_rows: rows per chunk.

    Raises:
        ValueError: ``"<source>: row <i> has NaN (column <j>); ..."``, with how many rows are bad in all.

    Example:
        >>> check_finite(np.ones((3, 2)), "ok.npy")
        >>> check_finite(np.array([[0.0, 1.0], [2.0, np.inf], [np.nan, 0.0]]), "acts.npy")
        Traceback (most recent call last):
            ...
        ValueError: acts.npy: row 1 has inf (column 1); 2 of 3 rows hold NaN or inf. Impute or drop them before ...
    """
    if isinstance(data, Tensor):
        if not (data.is_floating_point() or data.is_complex()):
            return
    elif not np.issubdtype(np.asarray(data[:0]).dtype, np.inexact):
        return
    n = len(data)
    first: tuple[int, int | None, float] | None = None
    bad_rows = 0
    for start in range(0, n, chunk_rows):
        chunk = data[start : start + chunk_rows]
        flat = chunk.detach().cpu().reshape(len(chunk), -1) if isinstance(chunk, Tensor) else np.asarray(chunk)
        flat = flat.reshape(len(flat), -1)
        finite = torch.isfinite(flat).numpy() if isinstance(flat, Tensor) else np.isfinite(flat)
        rows = ~finite.all(axis=1)
        if not rows.any():
            continue
        bad_rows += int(rows.sum())
        if first is None:
            row = int(np.argmax(rows))
            col = int(np.argmax(~finite[row]))
            first = (start + row, col if np.ndim(chunk) > 1 else None, float(flat[row, col]))
    if first is None:
        return
    row, col, value = first
    kind = "NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf")
    where = f" (column {col})" if col is not None else ""
    raise ValueError(
        f"{source}: {unit} {first_row + row} has {kind}{where}; {bad_rows} of {n} {unit}s hold NaN or inf. Impute or "
        "drop them before training (the zoo checks user data once, when the DataModule is set up)."
    )
