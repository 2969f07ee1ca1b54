"""The parts of ``zoo reproduce efm`` and its diagnosis: training loops, the oracle, the non-learned maps, the scores.

Plain loops over the pure-torch parts (no Trainer): Adam + cosine on fresh (P, Q) batches of 1024 charges per plate,
the card's §6 setting. Distributions are the card's 2-D toys (:func:`~zoo.datamodules.pairs.toy_distribution`) and,
for the diagnosis's dimension sweep, their D-dimensional versions (:func:`toy_nd`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ot
import torch
from torch import Tensor

from zoo.datamodules.pairs import toy_distribution
from zoo.metrics import energy_distance
from zoo.models.efm.alternatives import assign, gaussian_ot_map, snap_crossing
from zoo.models.efm.field import FieldTarget, lift
from zoo.models.efm.flow_matching import flow_matching_loss, flow_matching_transport
from zoo.models.efm.module import EFM
from zoo.models.efm.networks import MLPFieldNet
from zoo.models.efm.ode import FieldFn, Transport, transport

__all__ = [
    "ARMS",
    "ARMS_8G",
    "BEHIND_PROBE",
    "BEHIND_STEPS",
    "EPS",
    "L",
    "MODES",
    "SAMPLER",
    "SAMPLER_BEHIND",
    "SEEDS",
    "TwoModesExperiment",
    "affine_map",
    "assignment_map",
    "build_efm",
    "oracle_field",
    "oracle_transport",
    "score",
    "toy_nd",
    "train_efm",
    "train_flow_matching",
    "trajectories",
]

L, EPS = 6.0, 1e-3
SAMPLER = {"noise": 0.5, "outer_fraction": 0.15, "outer_margin": 1.0, "outer_box": 6.0}
# For lines followed behind the target plate the field must be learned out there: twice the outer points, over a box
# that holds the loops (the oracle's reach L + 2.2 in z and 7.6 in x).
SAMPLER_BEHIND = {"noise": 0.5, "outer_fraction": 0.3, "outer_margin": 2.5, "outer_box": 8.0}
BEHIND_PROBE = 0.3
ORACLE_PROBE = 0.05  # the oracle's (``transport``'s default): its field is exact right behind the charges
BOX = 20.0  # |x| beyond which an output has diverged (Q's modes sit at 4 with std 0.5)
BEHIND_STEPS = 300  # behind-plate continuation budget (steps of 0.2; the oracle's lines return within ~60)
_ANGLES = torch.arange(8) * (torch.pi / 4)
MODES = {
    "two_modes": torch.tensor([[-4.0, 0.0], [4.0, 0.0]]),
    "eight_gaussians": 4.0 * torch.stack([_ANGLES.cos(), _ANGLES.sin()], dim=1),
}
#: The arms of the two-mode experiment, in the table's order.
ARMS = (
    "identity",
    "affine",
    "assignment",
    "efm_init",
    "efm",
    "efm_code_target",
    "efm_uniform_sampler",
    "flow_matching",
    "efm_behind_plate",
    "efm_behind_plate_stopped",
    "efm_snap",
    "oracle_paper",
    "oracle_code_per_plate",
    "oracle_behind_plate",
    "oracle_snap",
)
ARMS_8G = ("identity", "affine", "oracle_paper", "efm", "flow_matching")
SEEDS = {"quick": (0,), "full": (0, 1, 2)}


def toy_nd(name: str, n: int, generator: torch.Generator, dim: int = 2) -> Tensor:
    """``n`` samples of a card toy in ``dim`` dimensions; ``dim = 2`` is ``toy_distribution`` itself.

    ``"gaussian"``: N(0, I_D); ``"two_modes"``: ½N(−4e₁, 0.25·I_D) + ½N(4e₁, 0.25·I_D). The modes stay 8 apart
    while the noise spreads over every dimension, so in high D the two plates' charges grow far apart in every
    direction but one (the diagnosis's dimension axis: the paper's wins are on images).

    Example:
        >>> x = toy_nd("two_modes", 1000, torch.Generator().manual_seed(0), dim=8)
        >>> x.shape, 3.8 < float(x[:, 0].abs().mean()) < 4.2
        (torch.Size([1000, 8]), True)
    """
    if dim == 2:
        return toy_distribution(name, n, generator)
    if name == "gaussian":
        return torch.randn(n, dim, generator=generator)
    if name == "two_modes":
        x = 0.5 * torch.randn(n, dim, generator=generator)
        x[:, 0] += 4.0 * (torch.randint(0, 2, (n,), generator=generator) * 2.0 - 1.0)
        return x
    raise ValueError(f"no {dim}-dimensional version of {name!r}; choose 'gaussian' or 'two_modes'")


def _train(
    loss_fn: Callable[[Tensor, Tensor], Tensor], params: Any, target: str, steps: int, seed: int, dim: int = 2
) -> float:
    """Adam 1e-3 + cosine decay on fresh (P, Q) batches of 1024; returns the training speed in steps/s."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(params, lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(toy_nd("gaussian", 1024, g, dim), toy_nd(target, 1024, g, dim))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return steps / (time.perf_counter() - start)


def build_efm(
    seed: int,
    field_target: str = "paper",
    behind_plate: bool = False,
    *,
    sampler: str = "segment",
    sampler_kwargs: dict[str, Any] | None = None,
    plate_distance: float = L,
    dim: int = 2,
) -> EFM:
    """The card's EFM, initialised from ``seed`` (the ``efm_init`` arm is this, untrained).

    ``sampler_kwargs`` replace the card's segment settings (``SAMPLER``, or ``SAMPLER_BEHIND`` with
    ``behind_plate``); ``plate_distance`` and ``dim`` are the diagnosis's axes.
    """
    torch.manual_seed(seed)
    if sampler_kwargs is None:
        sampler_kwargs = (SAMPLER_BEHIND if behind_plate else SAMPLER) if sampler == "segment" else {}
    return EFM(
        shape=[dim],
        L=plate_distance,
        eps=EPS,
        field_target=field_target,
        sampler=sampler,
        sampler_kwargs=sampler_kwargs,
        num_field_points=512,
        behind_plate_steps=BEHIND_STEPS if behind_plate else 0,
        behind_plate_probe=BEHIND_PROBE,
    )


def train_efm(
    target: str, steps: int, seed: int = 0, field_target: str = "paper", behind_plate: bool = False, **build: Any
) -> tuple[EFM, float]:
    """EFM with the card's network and sampler, trained for ``steps``; returns ``(model in eval mode, steps/s)``.

    ``behind_plate``: train on the wider outer region and follow lines behind the target plate at inference.
    ``build``: ``build_efm``'s keyword arguments (sampler, plate distance, dimension).
    """
    model = build_efm(seed, field_target, behind_plate, **build)
    speed = _train(model.loss, model.parameters(), target, steps, seed, build.get("dim", 2))
    return model.eval(), speed


def train_flow_matching(
    target: str, steps: int, seed: int = 0, dim: int = 2, plate_distance: float = L
) -> tuple[MLPFieldNet, float]:
    """Flow Matching on the same MLP, same batches and schedule; returns ``(network, steps/s)``."""
    torch.manual_seed(seed)
    net = MLPFieldNet(dim, L=plate_distance)
    speed = _train(
        lambda x0, x1: flow_matching_loss(net, x0, x1, plate_distance), net.parameters(), target, steps, seed, dim
    )
    return net.eval(), speed


def oracle_field(
    target: str, charges: int, seed: int, dim: int = 2, field_target: str = "paper", plate_distance: float = L
) -> FieldFn:
    """The Monte-Carlo field of ``charges`` fresh samples per plate, as ``field(x, z) -> (f_x, f_z)``."""
    g = torch.Generator().manual_seed(10_000 + seed)
    positive = lift(toy_nd("gaussian", charges, g, dim), 0.0)
    negative = lift(toy_nd(target, charges, g, dim), plate_distance)
    field_fn = FieldTarget(field_target, gamma=1e-7)

    def field(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        f = field_fn(torch.cat([x, z[:, None]], dim=1), positive, negative)
        return f[:, :-1], f[:, -1]

    return field


def oracle_transport(
    x: Tensor,
    target: str,
    charges: int,
    seed: int,
    field_target: str = "paper",
    steps: int = 100,
    behind_steps: int = 0,
    plate_distance: float = L,
) -> Transport:
    """The same Euler-in-z integrator on the Monte-Carlo field of ``charges`` fresh samples per plate.

    ``behind_steps > 0`` also follows the lines that pass through the target plate until they come back to it.
    """
    field = oracle_field(target, charges, seed, x.shape[1], field_target, plate_distance)
    return transport(field, x, EPS, plate_distance, steps=steps, behind_steps=behind_steps)


def affine_map(x: Tensor, target: str, seed: int, fit_samples: int = 4096) -> Tensor:
    """The ``affine`` arm: :func:`gaussian_ot_map` fitted to ``fit_samples`` fresh draws of P and of Q.

    The non-learned transport a practitioner tries first; it moves and stretches P but cannot split it into modes.
    """
    g = torch.Generator().manual_seed(20_000 + seed)
    p = toy_nd("gaussian", fit_samples, g, x.shape[1])
    return gaussian_ot_map(x, p, toy_nd(target, fit_samples, g, x.shape[1]))


def assignment_map(x: Tensor, target: str, seed: int) -> Tensor:
    """The ``assignment`` arm: :func:`assign` to as many fresh samples of Q. Its outputs are samples of Q, so it
    matches Q as well as Q's own samples do; what it lacks is a map defined off this batch.
    """
    g = torch.Generator().manual_seed(30_000 + seed)
    return assign(x, toy_nd(target, len(x), g, x.shape[1]))


def score(x: Tensor, q: Tensor, centres: Tensor | None = None, moved: Transport | None = None) -> dict[str, float]:
    """Transported samples ``x`` against held-out ``q``: energy distance (``ed``; outputs beyond ``BOX`` in any
    coordinate, or not finite, are counted as ``diverged`` and held at the box's edge), and with ``centres`` the mode
    balance (share with x₁ > 0), ``mode_min`` (the smaller share of outputs within 1.5 of a centre) and
    ``off_modes`` (farther than 1.5 from every centre); with ``moved`` the integrator's counts; POT's sliced W2 in 2-D.
    """
    # A line that ran parallel to the plates (clamped f_z) can be thrown arbitrarily far, even to inf: such outputs
    # are counted (``diverged``) and held at the box's edge, so they weigh as far-off mass instead of making the
    # energy distance inf or NaN.
    far = ~torch.isfinite(x).all(dim=1) | (x.abs() > BOX).any(dim=1)
    x = torch.nan_to_num(x, nan=BOX, posinf=BOX, neginf=-BOX).clamp(-BOX, BOX)
    m = {"ed": float(energy_distance(x, q)), "diverged": float(far.float().mean())}
    if centres is not None:
        near = torch.cdist(x[:, : centres.shape[1]], centres).min(dim=1)
        # Within 3 standard deviations (1.5) of a mode centre, per mode; farther than that from every centre is
        # mass the transport left between the modes.
        on = near.values <= 1.5
        shares = torch.stack([(on & (near.indices == k)).float().mean() for k in range(len(centres))])
        m |= {
            "balance": float((x[:, 0] > 0).float().mean()),
            "mode_min": float(shares.min()),
            "off_modes": float((~on).float().mean()),
        }
    if moved is not None:
        m.update(clamped=moved.clamped_fraction, lines_behind=moved.lines_behind, lines_lost=moved.lines_lost)
    if x.shape[1] == 2:
        # numpy arrays: POT draws the projections with numpy's generator (torch inputs draw other ones)
        xs, qs = x.double().numpy(), q.double().numpy()
        m["sliced_w2"] = float(ot.sliced_wasserstein_distance(xs, qs, n_projections=200, seed=0))
    return m


class TwoModesExperiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``: one seed's held-out data and models made once, then reused.

    Keeps seed ``plot_seed``'s transported samples and its EFM for the plot.
    """

    def __init__(self, steps: int, particles: int, charges: int, plot_seed: int) -> None:
        self.steps, self.particles, self.charges, self.plot_seed = steps, particles, charges, plot_seed
        self.seed: int | None = None
        self.cache: dict[str, Any] = {}
        self.samples: dict[str, Tensor] = {}
        self.efm: EFM | None = None
        self.plot_q: Tensor | None = None

    def _data(self, seed: int) -> dict[str, Any]:
        if seed != self.seed:
            g = torch.Generator().manual_seed(1 + seed)
            self.seed, self.cache = seed, {}
            # Drawn in this order so that seed 0 gives the held-out sets of the earlier single-seed version.
            self.cache["x0"] = toy_distribution("gaussian", self.particles, g)
            self.cache["q"] = toy_distribution("two_modes", self.particles, g)
            self.cache["q8"] = toy_distribution("eight_gaussians", self.particles, g)
            if seed == self.plot_seed:
                self.plot_q = self.cache["q"]
        return self.cache

    def _model(self, key: str, seed: int, make: Callable[[], tuple[Any, float]]) -> tuple[Any, float]:
        cache = self._data(seed)
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _oracle(self, seed: int) -> Transport:
        """The oracle's lines (paper target, stopped at z = L): the ``oracle_paper`` arm and the end points every
        two-mode arm's are measured against (``oracle_gap``)."""
        cache = self._data(seed)
        if "oracle" not in cache:
            cache["oracle"] = oracle_transport(cache["x0"], "two_modes", self.charges, seed)
        return cache["oracle"]

    def _pool(self, seed: int, target: str) -> Tensor:
        """Fresh samples of Q (as many as the oracle's charges) that the snapping alternative sends lines to."""
        g = torch.Generator().manual_seed(40_000 + seed)
        return toy_nd(target, self.charges, g)

    def _move(self, arm: str, seed: int, target: str, x0: Tensor) -> tuple[Tensor | Transport, float | None]:
        """The transported samples (or the integrator's ``Transport``) and the training speed, for either target."""
        key = "" if target == "two_modes" else "8g/"
        if arm == "identity":
            return x0, None
        if arm == "affine":
            return affine_map(x0, target, seed), None
        if arm == "assignment":
            return assignment_map(x0, target, seed), None
        if arm == "oracle_snap":  # the oracle's stopped lines; those the continuation would follow, snapped
            field = oracle_field(target, self.charges, seed)
            return snap_crossing(field, self._oracle(seed).x, self._pool(seed, target), L, ORACLE_PROBE), None
        if arm == "oracle_paper" and target == "two_modes":
            return self._oracle(seed), None
        if arm.startswith("oracle_"):
            kind = "paper" if arm == "oracle_behind_plate" else arm.removeprefix("oracle_")
            behind = BEHIND_STEPS if arm == "oracle_behind_plate" else 0
            return oracle_transport(x0, target, self.charges, seed, field_target=kind, behind_steps=behind), None
        if arm == "flow_matching":
            net, speed = self._model(key + arm, seed, lambda: train_flow_matching(target, self.steps, seed))
            return flow_matching_transport(net, x0, L), speed
        if arm == "efm_init":
            return build_efm(seed).eval().transport(x0), None
        if arm in ("efm", "efm_code_target", "efm_uniform_sampler"):
            kind = "code_per_plate" if arm == "efm_code_target" else "paper"
            sampler = "uniform" if arm == "efm_uniform_sampler" else "segment"
            model, speed = self._model(
                key + arm, seed, lambda: train_efm(target, self.steps, seed, kind, sampler=sampler)
            )
            return model.transport(x0), speed
        if arm in ("efm_behind_plate", "efm_behind_plate_stopped", "efm_snap"):
            model, speed = self._model(
                key + "efm_behind_plate", seed, lambda: train_efm(target, self.steps, seed, behind_plate=True)
            )
            if arm == "efm_behind_plate":
                return model.transport(x0), speed
            if arm == "efm_snap":
                stopped = transport(model.field, x0, EPS, L, steps=model.hparams.ode_steps).x
                return snap_crossing(model.field, stopped, self._pool(seed, target), L, BEHIND_PROBE), None
            # the field's training is counted once, under efm_behind_plate
            return transport(model.field, x0, EPS, L, steps=model.hparams.ode_steps, min_fz=model.hparams.min_fz), None
        raise ValueError(f"unknown arm {arm!r}; choose one of {ARMS}")

    def two_modes(self, arm: str, seed: int) -> dict[str, float]:
        data = self._data(seed)
        out, speed = self._move(arm, seed, "two_modes", data["x0"])
        moved = out if isinstance(out, Transport) else None
        x = moved.x if moved is not None else out
        m = score(x, data["q"], MODES["two_modes"], moved)
        # Where each particle's line ends against where the ground-truth field's line from the same start ends (the
        # median: lines that start near x₁ = 0 split between the modes on a small change of the field): learning the
        # field means learning this map, which a transport that only matches Q's samples need not.
        gap = (torch.nan_to_num(x, BOX, BOX, -BOX).clamp(-BOX, BOX) - self._oracle(seed).x).norm(dim=1)
        m["oracle_gap"] = float(gap.median())
        if speed is not None:
            m["steps_per_s"] = speed
        if seed == self.plot_seed:
            self.samples[arm] = x
            if arm == "efm":
                self.efm = self.cache["efm"][0]
        return m

    def eight_gaussians(self, arm: str, seed: int) -> dict[str, float]:
        if arm not in ARMS_8G:
            raise ValueError(f"unknown 8-Gaussians arm {arm!r}; choose one of {ARMS_8G}")
        data = self._data(seed)
        out, speed = self._move(arm, seed, "eight_gaussians", data["x0"])
        moved = out if isinstance(out, Transport) else None
        m = score(moved.x if moved is not None else out, data["q8"], MODES["eight_gaussians"], moved)
        if speed is not None:
            m["steps_per_s"] = speed
        return m


def trajectories(model: EFM, x: Tensor, steps: int = 100) -> Tensor:
    """Field lines of ``x`` as ``(steps + 1, n, 3)`` points (x₁, x₂, z) for the plot (the same Euler steps)."""
    dz, path = (L - EPS) / steps, [torch.cat([x, torch.full((len(x), 1), EPS)], 1)]
    for k in range(steps):
        z = EPS + k * dz
        # held in the box as ``score`` does: a line thrown to inf would make the next step refuse its input
        x = torch.nan_to_num(transport(model.field, x, z, z + dz, steps=1).x, BOX, BOX, -BOX).clamp(-BOX, BOX)
        path.append(torch.cat([x, torch.full((len(x), 1), z + dz)], 1))
    return torch.stack(path)
