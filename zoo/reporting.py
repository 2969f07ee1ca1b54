"""What every ``zoo reproduce`` run ends with: its claims printed, and its results written to ``--out``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["print_claims", "write_results"]


def print_claims(console: Any, r: dict[str, Any]) -> None:
    """One ``PASS``/``FAIL`` line per ``claims/<name>`` entry of the results (1.0 when the claim holds).

    Example:
        >>> from rich.console import Console
        >>> print_claims(Console(), {"claims/beats_baseline": 1.0, "seconds": 3.0})
        PASS  beats_baseline
    """
    for name, ok in ((k, v) for k, v in r.items() if k.startswith("claims/")):
        console.print(f"{'PASS' if ok else 'FAIL'}  {name[7:]}")


def write_results(
    r: dict[str, Any], out: Path | str, name: str, plot: Callable[[dict[str, Any], Path], None] | None = None
) -> Path:
    """Write ``<out>/<name>.json`` (and, with ``plot``, ``<out>/<name>.png``); returns the folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(r, indent=2))
    if plot is not None:
        plot(r, folder / f"{name}.png")
    return folder
