"""Precipitation forecast verification (TCP-Diffusion): CSI, ETS and HSS at rain thresholds, MAE per lead time, CRPS."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["EnsembleCRPS", "LeadTimeMAE", "PrecipVerification", "contingency", "crps_ensemble"]

_AVERAGES = ("global", "batch")


def _check_tensors(where: str, **tensors: Tensor) -> None:
    for name, x in tensors.items():
        if not isinstance(x, Tensor):
            raise TypeError(f"{where} expects `{name}` to be a torch.Tensor, got {type(x).__name__}.")


def _check_same_shape(preds: Tensor, target: Tensor, where: str, layout: str = "(N, ...)") -> None:
    _check_tensors(where, preds=preds, target=target)
    if preds.shape != target.shape:
        raise ValueError(
            f"{where} expects preds and target of one shape {layout}, got preds {tuple(preds.shape)} and target "
            f"{tuple(target.shape)}."
        )


def _check_thresholds(thresholds: Sequence[float]) -> tuple[float, ...]:
    if isinstance(thresholds, (str, bytes)) or not isinstance(thresholds, Sequence):
        raise TypeError(f"Expected argument `thresholds` to be a sequence of rain amounts but got {thresholds!r}.")
    if any(isinstance(t, bool) or not isinstance(t, (int, float)) for t in thresholds):
        raise TypeError(f"Expected argument `thresholds` to hold numbers (rain amounts) but got {thresholds!r}.")
    values = tuple(float(t) for t in thresholds)
    # a threshold <= 0 would make every (non-negative) rain amount an event: nothing left to verify
    if not values or not all(math.isfinite(t) and t > 0 for t in values):
        raise ValueError(
            f"Expected argument `thresholds` to be non-empty, positive and finite rain amounts but got {thresholds!r}."
        )
    if len({f"{t:g}" for t in values}) != len(values):
        raise ValueError(f"Expected argument `thresholds` to be distinct (as printed by :g) but got {thresholds!r}.")
    return values


def _contingency_update(
    preds: Tensor, target: Tensor, thresholds: Sequence[float]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(TP, FP, FN, TN), each ``(len(thresholds),)`` float64, of the events ``value >= t``."""
    preds, target = preds.detach().reshape(-1), target.detach().reshape(-1)
    counts = []
    for t in thresholds:  # one threshold at a time: memory stays at one boolean field, not (T, numel)
        p, o = preds >= t, target >= t
        counts.append(torch.stack([(p & o).sum(), (p & ~o).sum(), (~p & o).sum()]))
    tp, fp, fn = torch.stack(counts).double().unbind(dim=1)
    tn = preds.numel() - tp - fp - fn
    # NaN >= t is False: a NaN field would count as dry; make the scores NaN instead (no host sync needed)
    bad = preds.isnan().any() | target.isnan().any()
    tp, fp, fn, tn = (torch.where(bad, torch.nan, x) for x in (tp, fp, fn, tn))
    return tp, fp, fn, tn


def _scores_compute(tp: Tensor, fp: Tensor, fn: Tensor, tn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """CSI, ETS and HSS of contingency tables; 0 where a score is 0/0 (see :class:`PrecipVerification`)."""
    union = tp + fp + fn
    n = union + tn
    # R = (TP+FP)(TP+FN)/N; dividing (TP+FN) by N first gives exactly R = TP+FP when every point is observed wet
    r = (tp + fp) * ((tp + fn) / n.clamp_min(1))
    csi = torch.where(union == 0, 0.0, tp / union)
    # N·(TP+FP+FN−R) = FP² + FN² + TP·FP + TP·FN + FP·FN + TN·(TP+FP+FN) >= 0, zero exactly when FP = FN = 0 and
    # TP·TN = 0: no events anywhere or events everywhere, both forecast right. Test the counts, not a rounded float.
    degenerate = (fp + fn == 0) & (tp * tn == 0)
    ets = torch.where(degenerate, 0.0, (tp - r) / (union - r))
    hss = 2 * ets / (ets + 1)  # the official code's form; ETS >= -1/3, so ETS + 1 > 0
    return csi, ets, hss


def contingency(preds: Tensor, target: Tensor, thresholds: Sequence[float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Contingency table of rain events ``value >= t`` at each threshold, over every element of ``(N, ...)`` inputs.

    Args:
        preds: forecast rain amounts ``(N, ...)``.
        target: observed rain amounts, the shape of ``preds``.
        thresholds: rain amounts ``t``, positive and distinct.

    Returns:
        ``(tp, fp, fn, tn)``: hits, false alarms, misses and correct negatives, each ``(len(thresholds),)`` float64;
        all NaN when an input holds NaN.

    Example:
        >>> preds, target = torch.tensor([0.5, 8.0, 3.0, 25.0]), torch.tensor([0.0, 2.0, 12.0, 30.0])
        >>> [x.tolist() for x in contingency(preds, target, (1.0, 10.0))]
        [[3.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 2.0]]
    """
    _check_same_shape(preds, target, "contingency")
    return _contingency_update(preds, target, _check_thresholds(thresholds))


class PrecipVerification(Metric):
    """Categorical scores of rain forecasts at thresholds: CSI, ETS and HSS, as TCP-Diffusion reports them.

    At each threshold ``t`` prediction and truth are binarised (event = ``value >= t``) into the counts TP (hits),
    FP (false alarms), FN (misses), TN, N = TP + FP + FN + TN; then ``CSI = TP / (TP + FP + FN)``,
    ``ETS = (TP − R) / (TP + FP + FN − R)`` with the chance hits ``R = (TP + FP)(TP + FN) / N``, and
    ``HSS = 2·ETS / (ETS + 1)`` (the official code's form; equal to the classic Heidke score).

    ``average="global"`` sums one table per threshold (TP, FP, FN, TN float64 states) over all updates and scores
    it once. ``average="batch"`` scores each ``update`` call's table and averages the scores over calls, as the
    released code does (it averages per-batch scores): the states are the score sums and the call count. Both are
    fixed-size sums, exact under DDP.

    Zero denominators: the official code adds 1e-9 to each denominator, so a 0/0 score is 0. Here 0/0 is 0 exactly.
    CSI is 0/0 only when no event is forecast nor observed; ETS (and so HSS) when forecast and truth agree with no
    events at all or with events everywhere (TN = 0). All three are therefore 0 for a table without events, and a
    perfectly forecast all-event table gives CSI = 1 but ETS = HSS = 0 (no skill over chance is measurable). Every
    other table has non-zero denominators. NaN in an input makes that table's scores NaN.

    ``update(preds, target)``: rain amounts ``(N, ...)``, one shape. ``compute()`` returns float32 scalars
    ``{"csi@<t>": ..., "ets@<t>": ..., "hss@<t>": ...}`` per threshold in order, ``t`` written by ``f"{t:g}"``. A
    dict is not loggable as an object: call ``self.log_dict(m.compute())`` at epoch end, then ``m.reset()``.

    Args:
        thresholds: rain amounts ``t`` (units of the inputs), positive, finite and distinct.
        average: ``"global"`` (one table over everything seen) or ``"batch"`` (mean of per-``update`` scores).
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        TypeError: ``thresholds`` is not a sequence of numbers; an input is not a tensor.
        ValueError: ``thresholds`` empty, non-positive or repeated; ``average`` unknown; in ``update``, inputs of
            different shapes.

    Example:
        >>> target = torch.tensor([[0.0, 2.0, 12.0, 30.0]])  # mm at four grid points
        >>> preds = torch.tensor([[0.5, 8.0, 3.0, 25.0]])
        >>> m = PrecipVerification(thresholds=(1.0, 10.0))
        >>> m.update(preds, target)
        >>> {k: round(float(v), 3) for k, v in m.compute().items()}
        {'csi@1': 1.0, 'ets@1': 1.0, 'hss@1': 1.0, 'csi@10': 0.5, 'ets@10': 0.333, 'hss@10': 0.5}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    tp: Tensor
    fp: Tensor
    fn: Tensor
    tn: Tensor
    sum_csi: Tensor
    sum_ets: Tensor
    sum_hss: Tensor
    num_batches: Tensor

    def __init__(
        self, thresholds: Sequence[float], average: Literal["global", "batch"] = "global", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.thresholds = _check_thresholds(thresholds)
        if average not in _AVERAGES:
            raise ValueError(f"Expected argument `average` to be one of {_AVERAGES} but got {average!r}.")
        self.average = average
        self.keys = [f"{score}@{t:g}" for t in self.thresholds for score in ("csi", "ets", "hss")]
        zeros = torch.zeros(len(self.thresholds), dtype=torch.float64)
        names = ("tp", "fp", "fn", "tn") if average == "global" else ("sum_csi", "sum_ets", "sum_hss")
        for name in names:
            self.add_state(name, default=zeros.clone(), dist_reduce_fx="sum")
        if average == "batch":
            self.add_state("num_batches", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add forecast and observed rain amounts, ``(N, ...)`` each."""
        _check_same_shape(preds, target, "PrecipVerification.update")
        tp, fp, fn, tn = _contingency_update(preds, target, self.thresholds)
        if self.average == "global":
            self.tp += tp
            self.fp += fp
            self.fn += fn
            self.tn += tn
        else:
            csi, ets, hss = _scores_compute(tp, fp, fn, tn)
            self.sum_csi += csi
            self.sum_ets += ets
            self.sum_hss += hss
            self.num_batches += 1

    def compute(self) -> dict[str, Tensor]:
        """``{"csi@<t>", "ets@<t>", "hss@<t>"}`` per threshold, float32 scalars (0 before any update)."""
        if self.average == "global":
            scores = _scores_compute(self.tp, self.fp, self.fn, self.tn)
        else:
            count = self.num_batches.clamp_min(1)
            scores = (self.sum_csi / count, self.sum_ets / count, self.sum_hss / count)
        per_threshold = torch.stack(scores, dim=1).float()  # (T, 3): the order of self.keys
        return dict(zip(self.keys, per_threshold.reshape(-1).unbind()))


class LeadTimeMAE(Metric):
    """Mean absolute error per lead time: ``MAE_l = mean |ŷ_{n,l,…} − y_{n,l,…}|`` over samples and grid points.

    States: the absolute-error sum and the element count per lead time (float64 and int64, ``(L,)``), exact over
    batches and under DDP. ``update(preds, target)``: ``(N, L, ...)`` each, the L lead times on dim 1.
    ``compute()``: ``(L,)`` float32.

    Args:
        num_leads: the number of lead times L, ``>= 1``.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        TypeError: ``num_leads`` is not an int; an input is not a tensor.
        ValueError: ``num_leads < 1``; in ``update``, inputs of different shapes or without L lead times on dim 1.

    Example:
        >>> target = torch.arange(3.0)[None, :, None, None].expand(2, 3, 4, 4)  # (N, L, H, W): lead l is l mm
        >>> m = LeadTimeMAE(num_leads=3)
        >>> m.update(torch.zeros(2, 3, 4, 4), target)
        >>> m.compute()
        tensor([0., 1., 2.])
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    sum_abs_error: Tensor
    num_elements: Tensor

    def __init__(self, num_leads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(num_leads, bool) or not isinstance(num_leads, int):
            raise TypeError(f"Expected argument `num_leads` to be an int but got {num_leads!r}.")
        if num_leads < 1:
            raise ValueError(f"Expected argument `num_leads` to be >= 1 lead times but got {num_leads}.")
        self.num_leads = num_leads
        self.add_state("sum_abs_error", default=torch.zeros(num_leads, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_elements", default=torch.zeros(num_leads, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add forecasts and truths, ``(N, L, ...)`` each."""
        layout = f"(N, L, ...) with L = num_leads = {self.num_leads}"
        _check_same_shape(preds, target, "LeadTimeMAE.update", layout)
        if preds.ndim < 2 or preds.shape[1] != self.num_leads:
            raise ValueError(
                f"LeadTimeMAE.update expects {layout} lead times on dim 1, got preds {tuple(preds.shape)} and target "
                f"{tuple(target.shape)}. Move the lead axis to dim 1 or set num_leads to the forecast length."
            )
        error = (preds.detach().double() - target.detach().double()).abs().transpose(0, 1).reshape(self.num_leads, -1)
        self.sum_abs_error += error.sum(dim=1)
        self.num_elements += error.shape[1]

    def compute(self) -> Tensor:
        """MAE per lead time, ``(L,)`` float32."""
        return (self.sum_abs_error / self.num_elements).float()


def _crps_update(ensemble: Tensor, target: Tensor, fair: bool, where: str) -> Tensor:
    """Per-element ensemble CRPS, the shape of ``target``, float64."""
    _check_tensors(where, ensemble=ensemble, target=target)
    if ensemble.ndim < 2 or target.shape != ensemble.shape[:1] + ensemble.shape[2:]:
        raise ValueError(
            f"{where} expects ensemble (N, M, ...) with the M members on dim 1 and target (N, ...), the ensemble's "
            f"shape without dim 1, got ensemble {tuple(ensemble.shape)} and target {tuple(target.shape)}."
        )
    M = ensemble.shape[1]
    if fair and M < 2:
        raise ValueError(
            f"{where}: the fair CRPS divides by M (M − 1) and needs M >= 2 members, got ensemble "
            f"{tuple(ensemble.shape)}. Pass more members or fair=False."
        )
    x = ensemble.detach().double().movedim(1, -1)  # (N, ..., M)
    y = target.detach().double().unsqueeze(-1)
    to_truth = (x - y).abs().mean(dim=-1)
    # Σ_{m,m'} |x_m − x_m'| = 2 Σ_i (2i − M + 1) x_(i) over the members sorted ascending (0-based i):
    # O(M log M) per element and no (M, M) tensor, all elements in one op
    w = 2 * torch.arange(M, dtype=x.dtype, device=x.device) - M + 1
    pairwise = 2 * (x.sort(dim=-1).values * w).sum(dim=-1)
    return to_truth - pairwise / (2 * M * (M - 1) if fair else 2 * M * M)


def crps_ensemble(ensemble: Tensor, target: Tensor, fair: bool = False) -> Tensor:
    """Empirical CRPS of an ensemble at each element: ``mean_m |X_m − y| − Σ_{m,m'} |X_m − X_m'| / (2 M²)``.

    The fair version (Ferro, 2014) divides the second term by ``2 M (M − 1)``: unbiased for the CRPS of the
    distribution the members are drawn from. With M = 1 (not fair) it is the absolute error.

    Args:
        ensemble: members ``(N, M, ...)``, M on dim 1.
        target: truth ``(N, ...)``.
        fair: use the fair (unbiased) spread term; needs ``M >= 2``.

    Returns:
        The CRPS per element, the shape of ``target``, in the inputs' floating dtype (computed in float64).

    Example:
        >>> ensemble, target = torch.tensor([[0.0, 1.0]]), torch.tensor([0.0])  # N = 1, M = 2
        >>> crps_ensemble(ensemble, target), crps_ensemble(ensemble, target, fair=True)
        (tensor([0.2500]), tensor([0.]))
    """
    crps = _crps_update(ensemble, target, fair, "crps_ensemble")
    dtype = torch.promote_types(ensemble.dtype, target.dtype)
    return crps.to(dtype if dtype.is_floating_point else torch.get_default_dtype())


class EnsembleCRPS(Metric):
    """Mean ensemble CRPS over all elements: per element ``mean_m |X_m − y| − Σ_{m,m'} |X_m − X_m'| / (2 M²)``.

    ``fair=True`` divides the spread term by ``2 M (M − 1)`` instead (see :func:`crps_ensemble`). The pairwise sum
    is computed from the sorted members in O(M log M). States: the CRPS sum (float64) and the element count.
    ``update(ensemble, target)``: ``(N, M, ...)`` and ``(N, ...)``. ``compute()``: float32 scalar.

    Args:
        fair: use the fair (unbiased) spread term; needs ``M >= 2`` members.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        TypeError: ``fair`` is not a bool; an input is not a tensor.
        ValueError: in ``update``, shapes that are not ``(N, M, ...)`` and ``(N, ...)``; ``fair`` with ``M < 2``.

    Example:
        >>> m = EnsembleCRPS()
        >>> m.update(torch.tensor([[0.0, 1.0], [2.0, 2.0]]), torch.tensor([0.0, 3.0]))  # CRPS 0.25 and 1
        >>> m.compute()
        tensor(0.6250)
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    sum_crps: Tensor
    num_elements: Tensor

    def __init__(self, fair: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(fair, bool):
            raise TypeError(f"Expected argument `fair` to be a bool but got {fair!r}.")
        self.fair = fair
        self.add_state("sum_crps", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_elements", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, ensemble: Tensor, target: Tensor) -> None:
        """Add ensembles ``(N, M, ...)`` and their truths ``(N, ...)``."""
        crps = _crps_update(ensemble, target, self.fair, "EnsembleCRPS.update")
        self.sum_crps += crps.sum()
        self.num_elements += crps.numel()

    def compute(self) -> Tensor:
        """The mean CRPS, a float32 scalar."""
        return (self.sum_crps / self.num_elements).float()
