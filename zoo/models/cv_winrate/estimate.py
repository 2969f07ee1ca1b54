"""Win rate from a file of human labels (some missing) and synthetic scores: ``zoo winrate FILE``."""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path

import torch

from zoo.metrics.win_rate import WinRateEstimate, control_variates_win_rate, human_win_rate

__all__ = ["read_feedback", "estimate_from_file", "report"]


def read_feedback(
    path: str | Path, human: str = "human", synthetic: str = "synthetic"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``(z, ẑ)`` from a ``.csv`` or ``.jsonl`` file; an empty, ``null`` or ``nan`` human cell is unlabelled.

    Raises:
        FileNotFoundError: no such file. ValueError: unknown format, missing column, or a non-numeric value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No feedback file at {path}. Expected a .csv with columns '{human}' (1 = A wins, 0 = B wins, 0.5 = tie, "
            f"empty when unlabelled) and '{synthetic}' (probability that A wins, in [0, 1]), or the same as .jsonl."
        )
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))  # an empty file or a header alone gives no rows: refused below
    elif path.suffix in (".jsonl", ".json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"Unknown feedback format {path.suffix!r} for {path}: use .csv or .jsonl.")
    z, z_hat = [], []
    for line, row in enumerate(rows, start=2 if path.suffix == ".csv" else 1):
        for column in (human, synthetic):
            if column not in row:
                raise ValueError(
                    f"{path}:{line} has no column {column!r} (columns: {sorted(row)}). Pass --human/--synthetic."
                )
        try:
            raw = row[human]
            z.append(math.nan if raw in ("", None) or str(raw).lower() in ("nan", "null", "none") else float(raw))
            z_hat.append(float(row[synthetic]))
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{line}: non-numeric value in {row!r}.") from None
    if not z:
        raise ValueError(
            f"{path} holds no comparisons (an empty file, or a header alone). Expected one row per response pair "
            f"with columns '{human}' and '{synthetic}'."
        )
    return torch.tensor(z, dtype=torch.float64), torch.tensor(z_hat, dtype=torch.float64)


def estimate_from_file(path: str | Path, human: str = "human", synthetic: str = "synthetic") -> WinRateEstimate:
    """The control-variates win rate of the feedback in ``path`` (see :func:`read_feedback`)."""
    z, z_hat = read_feedback(path, human, synthetic)
    return control_variates_win_rate(z, z_hat)


def report(path: str | Path, human: str = "human", synthetic: str = "synthetic", level: float = 0.95) -> str:
    """A few lines comparing the CV estimate (with interval and predicted saving) to the human-only one; a first
    ``warning:`` line (and a ``UserWarning``) when the normal interval cannot be trusted (all labels equal, or fewer
    than 30 of them)."""
    z, z_hat = read_feedback(path, human, synthetic)
    cv = control_variates_win_rate(z, z_hat)
    h = human_win_rate(z)
    lo, hi = cv.interval(level)
    hlo, hhi = h.interval(level)
    warning = cv.interval_warning
    if warning is not None:
        warnings.warn(warning, stacklevel=2)
    return (
        (f"warning: {warning}\n" if warning else "")
        + f"{path}: {cv.n} human labels of {cv.N} pairs\n"
        f"control variates : win rate {cv.estimate:.4f}  {level:.0%} interval [{lo:.4f}, {hi:.4f}]  (se {cv.se:.4f})\n"
        f"human only       : win rate {h.estimate:.4f}  {level:.0%} interval [{hlo:.4f}, {hhi:.4f}]  (se {h.se:.4f})\n"
        f"alpha {cv.alpha:.3f}, rho {cv.rho:.3f}: the synthetic scores save {cv.predicted_saving:.1%} of the human "
        f"labels at equal variance (need {(1 - cv.predicted_saving) * cv.n:.0f} instead of {cv.n})"
    )
