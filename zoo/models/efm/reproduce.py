"""``zoo reproduce efm``: a learned electrostatic field carries P to a bimodal Q, near the ground-truth field's transport.

The EFM card's §6 experiment, as a plain loop over the pure-torch parts (no Trainer):

* P = N(0, I₂) on the plate z = 0, Q = ½N((−4, 0), 0.25 I) + ½N((4, 0), 0.25 I) on the plate z = L = 6;
  fresh samples every step; held-out samples of Q for evaluation;
* EFM: the card's MLP (3 × 256, SiLU, 16 Fourier features of z/L), 512 field points per step (segment + 0.5 noise,
  15 % outer points), 1024 charges per plate, the paper's normalised-field target, Adam 1e-3 with cosine decay;
  transport: Euler in z, 100 steps, f_z clamped at 1e-3 (clamped steps counted);
* baselines in the same run: the identity map; the oracle (the same integrator on the Monte-Carlo field of 2048
  fresh charges per plate) with the paper target and with the official code's target; Flow Matching (independent
  coupling, the same MLP with t as its height input, the same number of steps, Euler 100); and (full run) EFM trained
  on the official code's target, plus the 8-Gaussians target;
* the oracle and EFM once more with the behind-plate continuation: lines that cross the Q plate between the modes
  are followed behind it until they land on its back side, as the paper's theorem has it (and the official toy
  solver does); the learned field for it is trained with twice the outer points over a wider box;
* metrics: energy distance to held-out Q, mode balance (share of outputs with x₁ > 0), share of outputs off the modes
  (farther than 1.5 from every centre), clamped steps, sliced W2 (when POT is installed), training steps/s.

The card's assertions are checked (``claims/...``); no claim that EFM beats Flow Matching is made.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from datamodules.pairs import toy_distribution
from zoo.metrics import energy_distance
from zoo.models.efm.field import FieldTarget, lift
from zoo.models.efm.flow_matching import flow_matching_loss, flow_matching_transport
from zoo.models.efm.module import EFM
from zoo.models.efm.networks import MLPFieldNet
from zoo.models.efm.ode import Transport, transport
from zoo.reporting import print_claims

__all__ = ["run", "train_efm", "train_flow_matching", "oracle_transport"]

L, EPS = 6.0, 1e-3
SAMPLER = {"noise": 0.5, "outer_fraction": 0.15, "outer_margin": 1.0, "outer_box": 6.0}
# For lines followed behind the target plate the field must be learned out there: twice the outer points, over a box
# that holds the loops (the oracle's reach L + 2.2 in z and 7.6 in x).
SAMPLER_BEHIND = {"noise": 0.5, "outer_fraction": 0.3, "outer_margin": 2.5, "outer_box": 8.0}
BEHIND_PROBE = 0.3
_ANGLES = torch.arange(8) * (torch.pi / 4)
MODES = {
    "two_modes": torch.tensor([[-4.0, 0.0], [4.0, 0.0]]),
    "eight_gaussians": 4.0 * torch.stack([_ANGLES.cos(), _ANGLES.sin()], dim=1),
}
BEHIND_STEPS = 300  # behind-plate continuation budget of the oracle arm (steps of 0.2; lines return within ~60)


def _cosine_adam(params: Any, steps: int, lr: float = 1e-3) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.Adam(params, lr=lr)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)


def _train(loss_fn: Callable[[Tensor, Tensor], Tensor], params: Any, target: str, steps: int, seed: int) -> float:
    """Adam + cosine on fresh (P, Q) batches of 1024; returns the training speed in steps/s."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt, sched = _cosine_adam(params, steps)
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(toy_distribution("gaussian", 1024, g), toy_distribution(target, 1024, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return steps / (time.perf_counter() - start)


def train_efm(
    target: str, steps: int, seed: int = 0, field_target: str = "paper", behind_plate: bool = False
) -> tuple[EFM, float]:
    """EFM with the card's network and sampler, trained for ``steps``; returns ``(model in eval mode, steps/s)``.

    ``behind_plate``: train on the wider outer region and follow lines behind the target plate at inference.
    """
    torch.manual_seed(seed)
    model = EFM(
        shape=[2],
        L=L,
        eps=EPS,
        field_target=field_target,
        sampler_kwargs=SAMPLER_BEHIND if behind_plate else SAMPLER,
        num_field_points=512,
        behind_plate_steps=BEHIND_STEPS if behind_plate else 0,
        behind_plate_probe=BEHIND_PROBE,
    )
    speed = _train(model.loss, model.parameters(), target, steps, seed)
    return model.eval(), speed


def train_flow_matching(target: str, steps: int, seed: int = 0) -> tuple[MLPFieldNet, float]:
    """Flow Matching on the same MLP, same batches and schedule; returns ``(network, steps/s)``."""
    torch.manual_seed(seed)
    net = MLPFieldNet(2, L=L)
    speed = _train(lambda x0, x1: flow_matching_loss(net, x0, x1, L), net.parameters(), target, steps, seed)
    return net.eval(), speed


def oracle_transport(
    x: Tensor,
    target: str,
    charges: int,
    seed: int,
    field_target: str = "paper",
    steps: int = 100,
    behind_steps: int = 0,
) -> Transport:
    """The same Euler-in-z integrator on the Monte-Carlo field of ``charges`` fresh samples per plate.

    ``behind_steps > 0`` also follows the lines that pass through the target plate until they come back to it.
    """
    g = torch.Generator().manual_seed(10_000 + seed)
    positive = lift(toy_distribution("gaussian", charges, g), 0.0)
    negative = lift(toy_distribution(target, charges, g), L)
    field_fn = FieldTarget(field_target, gamma=1e-7)

    def field(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        f = field_fn(torch.cat([x, z[:, None]], dim=1), positive, negative)
        return f[:, :-1], f[:, -1]

    return transport(field, x, EPS, L, steps=steps, behind_steps=behind_steps)


def _sliced_w2(x: Tensor, y: Tensor) -> float | None:
    try:
        import ot
    except ImportError:
        return None
    return float(ot.sliced_wasserstein_distance(x.double().numpy(), y.double().numpy(), n_projections=200, seed=0))


def _score(r: dict[str, float], key: str, x: Tensor, q: Tensor, moved: Transport | None = None) -> None:
    r[f"ed/{key}"] = float(energy_distance(x, q))
    r[f"balance/{key}"] = float((x[:, 0] > 0).float().mean())
    centres = MODES["eight_gaussians" if key.startswith("8g/") else "two_modes"]
    # Outputs farther than 3 standard deviations (1.5) from every mode centre: mass the transport left between modes.
    r[f"off_modes/{key}"] = float((torch.cdist(x, centres).min(dim=1).values > 1.5).float().mean())
    if moved is not None:
        r[f"clamped/{key}"] = moved.clamped_fraction
        if moved.lines_behind:
            r[f"lines_behind/{key}"], r[f"lines_lost/{key}"] = moved.lines_behind, moved.lines_lost
    w2 = _sliced_w2(x, q)
    if w2 is not None:
        r[f"sliced_w2/{key}"] = w2


def _trajectories(model: EFM, x: Tensor, steps: int = 100) -> Tensor:
    """Field lines of ``x`` as ``(steps + 1, n, 3)`` points (x₁, x₂, z) for the plot (the same Euler steps)."""
    dz, path = (L - EPS) / steps, [torch.cat([x, torch.full((len(x), 1), EPS)], 1)]
    for k in range(steps):
        z = EPS + k * dz
        x = transport(model.field, x, z, z + dz, steps=1).x
        path.append(torch.cat([x, torch.full((len(x), 1), z + dz)], 1))
    return torch.stack(path)


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, float]:
    """Run the arms, print the table, and (with ``out``) write ``efm.json`` and ``efm.png``.

    ``quick``: 1000 training steps, 1000 particles, 1024 oracle charges, no code-target ablation, no 8 Gaussians;
    full: the card's 3000 steps, 2000 particles, 2048 oracle charges, all arms.

    Returns:
        flat results (``ed/<arm>``, ``balance/<arm>``, ``clamped/<arm>``, steps/s, seconds) plus ``claims/...``.
    """
    start = time.perf_counter()
    steps, particles, charges = (1000, 1000, 1024) if quick else (3000, 2000, 2048)
    seed = 0
    g = torch.Generator().manual_seed(1)
    x0 = toy_distribution("gaussian", particles, g)
    q = toy_distribution("two_modes", particles, g)
    r: dict[str, float] = {"steps": steps, "particles": particles, "oracle_charges": charges}

    _score(r, "identity", x0, q)
    for kind in ("paper", "code_per_plate"):
        moved = oracle_transport(x0, "two_modes", charges, seed, field_target=kind)
        _score(r, f"oracle_{kind}", moved.x, q, moved)
    moved = oracle_transport(x0, "two_modes", charges, seed, behind_steps=BEHIND_STEPS)
    _score(r, "oracle_behind_plate", moved.x, q, moved)
    efm, r["efm_steps_per_s"] = train_efm("two_modes", steps, seed)
    moved = efm.transport(x0)
    _score(r, "efm", moved.x, q, moved)
    efm_behind, _ = train_efm("two_modes", steps, seed, behind_plate=True)
    moved = efm_behind.transport(x0)
    _score(r, "efm_behind_plate", moved.x, q, moved)
    fm, r["fm_steps_per_s"] = train_flow_matching("two_modes", steps, seed)
    _score(r, "flow_matching", flow_matching_transport(fm, x0, L), q)
    if not quick:
        ablation, _ = train_efm("two_modes", steps, seed, field_target="code_per_plate")
        moved = ablation.transport(x0)
        _score(r, "efm_code_target", moved.x, q, moved)
        q8 = toy_distribution("eight_gaussians", particles, g)
        _score(r, "8g/identity", x0, q8)
        moved = oracle_transport(x0, "eight_gaussians", charges, seed)
        _score(r, "8g/oracle_paper", moved.x, q8, moved)
        efm8, _ = train_efm("eight_gaussians", steps, seed)
        moved = efm8.transport(x0)
        _score(r, "8g/efm", moved.x, q8, moved)
        fm8, _ = train_flow_matching("eight_gaussians", steps, seed)
        _score(r, "8g/flow_matching", flow_matching_transport(fm8, x0, L), q8)
    r["seconds"] = time.perf_counter() - start
    r.update(_claims(r))
    _print(r)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "efm.json").write_text(json.dumps(r, indent=2))
        samples = {
            "P (identity)": x0,
            "EFM": efm.transport(x0).x,
            "Flow Matching": flow_matching_transport(fm, x0, L),
            "oracle field": oracle_transport(x0, "two_modes", charges, seed).x,
        }
        _plot(samples, q, _trajectories(efm, x0[:40]), r, folder / "efm.png")
    return r


def _claims(r: dict[str, float]) -> dict[str, float]:
    """The card's §6 assertions (margins as written there); 1.0 when they hold."""
    ed = {k[3:]: v for k, v in r.items() if k.startswith("ed/")}
    return {
        "claims/efm_ed_at_most_quarter_of_identity": float(ed["efm"] <= 0.25 * ed["identity"]),
        "claims/efm_mode_balance_within_0.35_0.65": float(0.35 <= r["balance/efm"] <= 0.65),
        "claims/efm_within_0.3_of_oracle": float(ed["efm"] <= ed["oracle_paper"] + 0.3),
        "claims/oracle_paper_target_beats_code_target": float(ed["oracle_paper"] < ed["oracle_code_per_plate"]),
        "claims/efm_clamped_steps_below_1pct": float(r["clamped/efm"] <= 0.01),
        # The theorem's other half: lines that cross the plate between the modes come back onto Q from behind.
        "claims/behind_plate_lines_halve_oracle_ed": float(
            ed["oracle_behind_plate"] <= 0.5 * ed["oracle_paper"] and r["lines_lost/oracle_behind_plate"] <= 0.01
        ),
        "claims/learned_behind_plate_lines_improve_efm": float(
            ed["efm_behind_plate"] <= 0.75 * ed["efm"] and r["lines_lost/efm_behind_plate"] <= 0.05
        ),
    }


def _print(r: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(
        title=f"EFM on N(0, I) -> two modes (L = {L}): {r['steps']:.0f} steps, {r['particles']:.0f} particles"
    )
    for col in ("arm", "energy distance", "mode balance", "off the modes", "clamped steps", "sliced W2"):
        table.add_column(col)
    for key in (k[3:] for k in r if k.startswith("ed/")):
        clamped, w2 = r.get(f"clamped/{key}"), r.get(f"sliced_w2/{key}")
        table.add_row(
            key,
            f"{r[f'ed/{key}']:.3f}",
            f"{r[f'balance/{key}']:.3f}",
            f"{r[f'off_modes/{key}']:.3f}",
            "-" if clamped is None else f"{clamped:.4f}",
            "-" if w2 is None else f"{w2:.3f}",
        )
    console.print(table)
    console.print(
        f"training: EFM {r['efm_steps_per_s']:.0f} steps/s, Flow Matching {r['fm_steps_per_s']:.0f} steps/s; "
        f"total {r['seconds']:.0f} s"
    )
    print_claims(console, r)


def _plot(samples: dict[str, Tensor], q: Tensor, lines: Tensor, r: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(samples) + 1, figsize=(4 * (len(samples) + 1), 4))
    keys = {"P (identity)": "identity", "EFM": "efm", "Flow Matching": "flow_matching", "oracle field": "oracle_paper"}
    for ax, (name, x) in zip(axes, samples.items()):
        ax.scatter(q[:, 0], q[:, 1], s=2, c="0.75", label="Q (held out)")
        ax.scatter(x[:, 0], x[:, 1], s=2, c="C0", label=name)
        ax.set_title(f"{name}: ED {r['ed/' + keys[name]]:.3f}")
        ax.set_xlim(-7, 7)
        ax.set_ylim(-4, 4)
        ax.legend(loc="upper right", fontsize=7, markerscale=4)
    ax = axes[-1]
    for k in range(lines.shape[1]):
        ax.plot(lines[:, k, 0], lines[:, k, 2], lw=0.8, c="C1")
    ax.axhline(0, c="k", lw=1)
    ax.axhline(L, c="k", lw=1)
    ax.set_xlabel("x₁")
    ax.set_ylabel("z")
    ax.set_title("learned field lines (x₁, z): P plate z=0 → Q plate z=L")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
