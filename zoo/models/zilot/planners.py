"""The planners ZILOT is compared with, on one interface: ``reset(obs, goals)`` at an episode start, then
``act(obs) -> action`` at every step (receding horizon: plan, execute the first action, replan).

* :class:`ZilotPlanner`: iCEM maximising −⟨P*, C⟩, the transport cost between the agent's occupancy (the states seen
  so far plus the imagined rollout of the candidate) and the demonstration's goals, under the learned distance
  d(s, g) = max(0, −V(s, g)) (``objectives.ZILOT`` of the official code: the goal times, the goal window and the
  horizon truncation of the card's §1);
* :class:`PiCls`: the policy (argmax of Q) on the current goal; the goal advances while the classifier
  −V(s, g_i) ≤ θ fires (``planning.Pi``);
* :class:`MpcCls`: iCEM on the current goal only (``SequentialMyopicMPC``), the same classifier;
* :class:`ZilotCls`: ZILOT+Cls, the paper's ablation without the history, goals dropped by the same classifier;
* :class:`PurePursuit`: no learning at all, the first controller a practitioner would write for a car: steer straight
  at the current goal, take the next one within the hit radius;
* :func:`run_episode`: one demonstration in a gymnasium environment, the achieved goals of every step.

The learned parts come from a :class:`~zoo.models.zilot.module.Zilot` module (``distance``, ``goal_distance``,
``world_model``, ``policy``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from zoo.models.zilot.icem import ICEM
from zoo.nn.sinkhorn import sinkhorn

__all__ = [
    "MpcCls",
    "PiCls",
    "Planner",
    "PurePursuit",
    "ZilotCls",
    "ZilotPlanner",
    "check_demo",
    "check_obs",
    "run_episode",
]

TRUNCATIONS = ("official", "remaining", "none")


class Planner(Protocol):
    def reset(self, obs: Tensor, goals: Tensor) -> None: ...

    def act(self, obs: Tensor) -> Tensor: ...


def check_demo(goals: Any, goal_dim: int) -> Tensor:
    """A demonstration as a float tensor [N, goal_dim], or a clear error."""
    goals = torch.as_tensor(goals, dtype=torch.float32)
    if goals.ndim != 2 or goals.shape[1] != goal_dim:
        raise ValueError(
            f"a demonstration is a goal sequence [N, {goal_dim}] in the environment's goal space, got shape "
            f"{tuple(goals.shape)}: pass φ(s) of the demonstrated states (e.g. their (x, y)), not whole observations"
        )
    if len(goals) == 0:
        raise ValueError("the demonstration is empty: give at least one goal")
    if not torch.isfinite(goals).all():
        raise ValueError("the demonstration holds NaN or inf")
    return goals


def check_obs(obs: Any, obs_dim: int) -> Tensor:
    """One observation as a float tensor [obs_dim], or a clear error (a wrong width would fail deep in a matmul, and a
    NaN would make every candidate score NaN and the planner return an arbitrary action)."""
    obs = torch.as_tensor(obs, dtype=torch.float32)
    if obs.shape != (obs_dim,):
        raise ValueError(f"an observation is one vector of the model's obs_dim={obs_dim} entries, got shape "
                         f"{tuple(obs.shape)}")  # fmt: skip
    if not torch.isfinite(obs).all():
        raise ValueError(f"the observation holds NaN or inf: {obs.tolist()}")
    return obs


def _icem(model: Any, horizon: int, population: int, iterations: int, elites: int, beta: float, alpha: float,
          variant: str) -> ICEM:  # fmt: skip
    return ICEM(horizon, model.hparams.action_dim, population, iterations, elites, beta, alpha, variant=variant)


class ZilotPlanner:
    """Zero-shot imitation by occupancy matching with iCEM (the card's §1; toy sizes by default).

    Args:
        model: a trained :class:`~zoo.models.zilot.module.Zilot`.
        horizon / population / iterations / elites / beta / alpha: iCEM (card toy: 12 / 128 / 3 / 6 / 2 / 0.1).
        eps / sinkhorn_iterations / tau_b / tol: the Sinkhorn solver (ε 0.02 on costs in [0, 1], 100 iterations;
            ``tau_b`` 0.5 is ZILOT+Unbalanced; ``tol`` stops early on the marginal error: at 1e-4 the card's demos gave
            the same rollouts as 100 and 500 full iterations, 9x faster, though the cost itself moves by up to 9e-4
            against 500 iterations; ``None`` runs them all, and ``sinkhorn_iterations=500, tol=None`` is the official
            solver).
        cost: ``"value"`` (the learned distance) or ``"euclidean"`` (ZILOT+h: ‖φ(s) − g‖ / ``step_size``).
        truncation: the horizon H_tr that carries mass. ``"official"``: ⌊max(1, min(H, t̂_N − k))⌋, the official
            code's; once k ≥ t̂_N − 1 it is 1, the mass falls on the states already seen only, and every candidate
            scores the same (on the card's demonstrations the learned W puts t̂_N at 41-62 steps, below the car's
            straight-line time, so 54-65 % of each episode plans a constant). ``"remaining"`` (default): t̂_N − k is
            raised to d(s_k, g_N), the learned time from the current state to the last goal, so the horizon only
            collapses once the agent is at the end of the demonstration. ``"none"``: H_tr = H at every step.
        icem_variant: ``"zoo"`` or ``"official"`` (mbrl-lib's slot layout, last action and noise variance; see
            :class:`~zoo.models.zilot.icem.ICEM`).
        generator: the iCEM sampling noise.
    """

    def __init__(self, model: Any, horizon: int = 12, population: int = 128, iterations: int = 3, elites: int = 6,
                 beta: float = 2.0, alpha: float = 0.1, eps: float = 0.02, sinkhorn_iterations: int = 100,
                 tau_b: float = 1.0, tol: float | None = 1e-4, cost: str = "value", step_size: float = 0.04,
                 truncation: str = "remaining", icem_variant: str = "zoo",
                 generator: torch.Generator | None = None) -> None:  # fmt: skip
        if cost not in ("value", "euclidean"):
            raise ValueError(f"cost is 'value' or 'euclidean' (ZILOT+h), got {cost!r}")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation is one of {TRUNCATIONS}, got {truncation!r}")
        self.truncation = truncation
        self.model, self.horizon, self.cost_kind, self.step_size = model, horizon, cost, step_size
        self.t_max = float(model.hparams.t_max)
        self.eps, self.sinkhorn_iterations, self.tau_b, self.tol = eps, sinkhorn_iterations, tau_b, tol
        self.icem = _icem(model, horizon, population, iterations, elites, beta, alpha, icem_variant)
        self.generator = generator
        self.sinkhorn_seconds = 0.0  # time spent in Sinkhorn since the last reset (for the speed report)
        self.constant_steps = 0  # steps since the last reset at which no imagined state carried mass

    def _cost(self, obs: Tensor, goals: Tensor) -> Tensor:
        """clip(d(s, g) / T_max, 0, 1) of states ``[..., D]`` against goals ``[N, G]``: ``[..., N]``."""
        if self.cost_kind == "euclidean":
            d = torch.cdist(self.model.achieved_goal(obs).reshape(-1, goals.shape[1]), goals).reshape(
                *obs.shape[:-1], len(goals)) / self.step_size  # fmt: skip
        else:
            d = self.model.distance(obs, goals)
        return (d / self.t_max).clamp(0.0, 1.0)

    @torch.no_grad()
    def reset(self, obs: Tensor, goals: Tensor) -> None:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        self.goals = check_demo(goals, self.model.hparams.goal_dim)
        self.icem.reset()
        self.sinkhorn_seconds = 0.0
        self.constant_steps = 0
        # t̂_1 = d(s_0, g_1); t̂_j = t̂_{j-1} + max(0, −W(g_{j-1}, g_j)): when the expert's pace reaches each goal
        first = self.model.distance(obs, self.goals[:1]).reshape(1)
        steps = self.model.goal_distance(self.goals[:-1], self.goals[1:])
        self.goal_time = first + torch.cat([first.new_zeros(1), steps.cumsum(0)])
        self.history: list[Tensor] = []  # the cost rows of the states seen, computed once each

    def _truncated(self, obs: Tensor, k: int) -> int:
        """H_tr, the number of imagined states that carry mass at step k (see ``truncation``)."""
        if self.truncation == "none":
            return self.horizon
        left = float(self.goal_time[-1]) - k
        if self.truncation == "remaining":
            left = max(left, float(self.history[-1][-1]) * self.t_max)  # the cost row holds d(s_k, g_N) / T_max
        return int(math.floor(max(1.0, min(self.horizon, left))))

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        self.history.append(self._cost(obs, self.goals))
        k, h = len(self.history) - 1, self.horizon
        keep = torch.roll(self.goal_time < k + h, 1)  # the goals in the window, and the first one beyond it
        keep[0] = True
        truncated = self._truncated(obs, k)
        self.constant_steps += truncated == 1  # the mass is all on the states seen: every candidate scores the same
        goals = self.goals[keep]
        history = torch.stack(self.history)[:, keep]  # [k + 1, n]
        # uniform mass on the first k + H_tr of the k + 1 + H points (the rest, zero mass, are left out)
        a = torch.full((k + truncated,), 1.0 / (k + truncated))
        b = torch.full((len(goals),), 1.0 / len(goals))

        def objective(actions: Tensor) -> Tensor:
            imagined = self.model.world_model.rollout(obs, actions)[:, : truncated - 1]
            rows = torch.cat([history.expand(len(actions), -1, -1), self._cost(imagined, goals)], dim=1)
            start = time.perf_counter()
            cost, _ = sinkhorn(rows, a, b, self.eps, self.sinkhorn_iterations, tau_b=self.tau_b, tol=self.tol)
            self.sinkhorn_seconds += time.perf_counter() - start
            return -cost

        return self.icem.plan(objective, self.generator)[0]


class _Classifier:
    """The goal index of the myopic baselines: advances while −V(s, g_i) ≤ θ (and a next goal exists)."""

    def __init__(self, model: Any, theta: float) -> None:
        self.model, self.theta = model, theta

    def reset(self, obs: Tensor, goals: Tensor) -> None:
        check_obs(obs, self.model.hparams.obs_dim)
        self.goals = check_demo(goals, self.model.hparams.goal_dim)
        self.index = 0

    def _distance(self, obs: Tensor) -> float:
        return float(self.model.distance(obs, self.goals[self.index : self.index + 1]))

    def advance(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        while self.index < len(self.goals) - 1 and self._distance(obs) <= self.theta:
            self.index += 1
        return self.goals[self.index]


class PiCls(_Classifier):
    """Pi+Cls: the greedy policy argmax_u Q(s, u, g_i) on the current goal, switched by the classifier."""

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        return self.model.policy(obs, self.advance(obs))


class MpcCls(_Classifier):
    """MPC+Cls: iCEM on the current goal, score Σ_{h<H} −[not reached] − [not reached at H] · d(ŝ_H, g_i)."""

    def __init__(self, model: Any, theta: float, horizon: int = 12, population: int = 128, iterations: int = 3,
                 elites: int = 6, beta: float = 2.0, alpha: float = 0.1, icem_variant: str = "zoo",
                 generator: torch.Generator | None = None) -> None:  # fmt: skip
        super().__init__(model, theta)
        self.icem = _icem(model, horizon, population, iterations, elites, beta, alpha, icem_variant)
        self.generator = generator

    def reset(self, obs: Tensor, goals: Tensor) -> None:
        super().reset(obs, goals)
        self.icem.reset()

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        goal = self.advance(obs)[None]

        def objective(actions: Tensor) -> Tensor:
            d = self.model.distance(self.model.world_model.rollout(obs, actions), goal)[..., 0]  # [P, H]
            missed = (d > self.theta).cumprod(dim=1).float()  # not reached by step h
            return -missed[:, :-1].sum(1) - missed[:, -1] * d[:, -1]

        return self.icem.plan(objective, self.generator)[0]


class ZilotCls(ZilotPlanner):
    """ZILOT+Cls, the paper's ablation without the history (official ``objectives.ZILOTCls``).

    The classifier of the myopic baselines (−V(s, g_i) ≤ θ) drops the goals already reached; at every step the goal
    times restart from the current state (k = 0: t̂_1 = d(s, g_i), then W's chain), the goal window and the
    truncation H_tr = ⌊max(1, min(H, t̂_N))⌋ follow, and the agent's points are the imagined states alone, uniform mass
    on the first H_tr of them. Takes ``theta`` and :class:`ZilotPlanner`'s arguments (``truncation`` is unused: the
    goal times restart at every step, so they never run out).
    """

    def __init__(self, model: Any, theta: float, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.classifier = _Classifier(model, theta)

    @torch.no_grad()
    def reset(self, obs: Tensor, goals: Tensor) -> None:
        super().reset(obs, goals)
        self.classifier.reset(obs, goals)

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, self.model.hparams.obs_dim)
        self.classifier.advance(obs)
        goals = self.goals[self.classifier.index :]
        first = self.model.distance(obs, goals[:1]).reshape(1)
        goal_time = first + torch.cat([first.new_zeros(1), self.model.goal_distance(goals[:-1], goals[1:]).cumsum(0)])
        keep = torch.roll(goal_time < self.horizon, 1)
        keep[0] = True
        truncated = int(math.floor(max(1.0, min(self.horizon, float(goal_time[-1])))))
        goals = goals[keep]
        a = torch.full((truncated,), 1.0 / truncated)
        b = torch.full((len(goals),), 1.0 / len(goals))

        def objective(actions: Tensor) -> Tensor:
            imagined = self.model.world_model.rollout(obs, actions)[:, :truncated]
            start = time.perf_counter()
            cost, _ = sinkhorn(self._cost(imagined, goals), a, b, self.eps, self.sinkhorn_iterations, tau_b=self.tau_b,
                               tol=self.tol)  # fmt: skip
            self.sinkhorn_seconds += time.perf_counter() - start
            return -cost

        return self.icem.plan(objective, self.generator)[0]


class PurePursuit:
    """Goal by goal with a pure-pursuit steering law, for a car observed as (x, y, cos θ, sin θ) (the Dubins task).

    Steers by the heading error to the current goal, u = clip(error / ``turn``, −1, 1) (the full error when the car can
    turn that far in one step), and moves to the next goal once within ``radius``. A goal inside the car's turning
    circle is circled for ever: the myopic failure the ``tight`` demonstrations are built on.

    Args:
        radius: the hit radius that advances the goal (GoalFraction's, 0.05).
        turn: the heading change of u = 1 (rad per step; the Dubins car's 0.3).

    Example:
        >>> follower = PurePursuit()
        >>> follower.reset(torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([[0.0, 1.0]]))
        >>> follower.act(torch.tensor([0.0, 0.0, 1.0, 0.0]))  # the goal is 90° to the left: full left steering
        tensor([1.])
    """

    def __init__(self, radius: float = 0.05, turn: float = 0.3) -> None:
        if not radius > 0 or not turn > 0:
            raise ValueError(f"PurePursuit: radius and turn must be > 0, got {radius} and {turn}")
        self.radius, self.turn = radius, turn

    def reset(self, obs: Tensor, goals: Tensor) -> None:
        check_obs(obs, 4)
        self.goals = check_demo(goals, 2)
        self.index = 0

    def act(self, obs: Tensor) -> Tensor:
        obs = check_obs(obs, 4)  # (x, y, cos θ, sin θ)
        while self.index < len(self.goals) - 1 and torch.dist(obs[:2], self.goals[self.index]) <= self.radius:
            self.index += 1
        to_goal = self.goals[self.index] - obs[:2]
        error = torch.atan2(to_goal[1], to_goal[0]) - torch.atan2(obs[3], obs[2])
        error = torch.atan2(torch.sin(error), torch.cos(error))
        return (error / self.turn).clamp(-1.0, 1.0).reshape(1)


def run_episode(env: Any, planner: Planner, demo: dict[str, Any], steps: int | None = None) -> Tensor:
    """Roll ``planner`` out on ``demo`` (``goals``, optional ``start`` state and ``budget``): the achieved goals
    ``[steps + 1, goal_dim]`` from the reset on."""
    from zoo.datamodules.offline_goals import split_obs

    options = {"state": np.asarray(demo["start"], dtype=np.float64)} if demo.get("start") is not None else None
    obs, info = env.reset(options=options)
    obs_t, goal = map(torch.as_tensor, split_obs(obs, info))  # dict observations (gymnasium-robotics) too
    planner.reset(obs_t, demo["goals"])
    achieved = [goal]
    for _ in range(steps if steps is not None else int(demo.get("budget", 100))):
        action = planner.act(obs_t)
        obs, _, terminated, _, info = env.step(action.cpu().numpy().astype(np.float32))
        obs_t, goal = map(torch.as_tensor, split_obs(obs, info))
        achieved.append(goal)
        if terminated:
            break
    return torch.stack(achieved)
