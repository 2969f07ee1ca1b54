"""RCSC: robust consensus anchors for efficient multi-view subspace clustering (Qin, Pu, Feng & Sebe, ICML 2025).

No official code: the objective is the card's marked reconstruction on SMVSC's official code (see solver.py).
"""

from zoo.models.rcsc.module import RCSCModule
from zoo.models.rcsc.solver import (
    RCSC,
    RCSCState,
    objective,
    project_simplex,
    spectral_labels,
)

__all__ = ["RCSC", "RCSCModule", "RCSCState", "objective", "project_simplex", "spectral_labels"]
