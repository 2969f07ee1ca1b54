"""PAN+SR: BART variable screening for symbolic regression with large p (Ye & Li, ICML 2025).

The screen follows the official code (mattsheng/Scalable_SR: ``BART_VIP.R``, ``BART_perm.R``) on a ``stochtree``
backend; the SR stage is any method behind ``SRBackend`` (gplearn by default).
"""

from zoo.models.pan_sr.bart import StochtreeBART
from zoo.models.pan_sr.module import PanSR
from zoo.models.pan_sr.screen import PanScreen, permutation_select, rank_cluster_select, vip
from zoo.models.pan_sr.sr import GplearnSR, PySRSR, gplearn_to_sympy, is_solution, r2_zero, screen_rates

__all__ = [
    "GplearnSR",
    "PanSR",
    "PanScreen",
    "PySRSR",
    "StochtreeBART",
    "gplearn_to_sympy",
    "is_solution",
    "permutation_select",
    "r2_zero",
    "rank_cluster_select",
    "screen_rates",
    "vip",
]
