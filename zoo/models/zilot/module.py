"""``Zilot``: the offline-learned world model, policy and values ZILOT plans with, and its test-time evaluation.

Training (manual optimisation: each part's loss, its gradient clipped per part, then the Polyak update of the target
Q), per step on a batch of goal-relabelled transitions from :class:`~datamodules.offline_goals.OfflineGoalDataModule`:

* world model: MSE of the predicted next observation;
* Q(s, u, g) over the action grid (the offline action rounded to the nearest grid value): MSE onto
  y = td_target(max_u Q_targ(s', u, g)), scaled by 1 / T_max (the card's toy; the official TD-MPC2 uses two-hot
  cross-entropy and an actor);
* W(φ(s), g), and with ``value="two_stream"`` V(s, g) = φ(s) · ψ(g): MSE(· / T_max, y / T_max) onto the same target
  (official ``tdmpc2.py``). By default V = max_u Q (the card's toy): the two-stream V fitted the same targets about
  3x worse here (1.5 steps off within a step of the goal, where the classifier of the baselines reads it).

Test: each test item is a demonstration (``goals``, ``start``, ``budget``); the chosen planner (``test_planner``:
``"zilot"``, ``"zilot_cls"``, ``"pi_cls"`` or ``"mpc_cls"``) imitates it in the environment ``env``, and W_min,
GoalFraction and the success rate are logged (:class:`~zoo.metrics.imitation.ImitationMetrics`).

Example:
    >>> model = Zilot(q_hidden=[32], v_hidden=[32], w_hidden=[32], wm_hidden=[32])
    >>> obs, goals = torch.zeros(3, 4), torch.rand(5, 2)
    >>> model.distance(obs, goals).shape, model.policy(obs[0], goals[0]).shape
    (torch.Size([3, 5]), torch.Size([1]))
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.metrics.imitation import ImitationMetrics
from zoo.models.zilot.networks import GoalGoalValue, GoalQ, TwoStreamValue, WorldModel, td_target
from zoo.module import ZooModule

__all__ = ["Zilot"]

PLANNERS = ("zilot", "zilot_cls", "pi_cls", "mpc_cls")


class Zilot(ZooModule):
    """World model, goal-conditioned Q (the policy), V and W for zero-shot imitation (Rupf et al., ICML 2025).

    Args:
        obs_dim / action_dim / goal_dim: the environment's sizes (DubinsPoint: 4 / 1 / 2).
        goal_slice: the observation entries that are the achieved goal φ(s) (for ZILOT+h and W's inputs).
        action_grid: the discrete values of Q's actions in each dimension (the toy's u ∈ {−1, −.5, 0, .5, 1}); with
            ``action_dim`` > 1, Q has one output per point of the product grid (5² = 25 for a maze's 2-D force).
        wm_hidden / wm_inputs / obs_low / obs_high: the world model (card: MLP[128, 128] on (cos θ, sin θ, u), the
            next observation clamped to the observation box; ``None`` feeds every entry / leaves it unclamped).
        q_hidden / v_hidden / v_dim / w_hidden: the value networks (card: MLP[256, 256]).
        value: ``"q"`` (V = max_u Q, the card's toy) or ``"two_stream"`` (a separate V = φ(s) · ψ(g), official).
        t_max: the value scale (episode length; values lie in [−T_max, 0]).
        lr / tau / grad_clip: Adam's learning rate, the target Q's Polyak rate (card: 0.01) and the gradient-norm clip
            of each part (official: 20; 0 turns it off).
        env / goal_threshold: the evaluation environment (a gymnasium id) and the hit radius of GoalFraction.
        test_planner / theta / planner: the planner ``zoo test`` runs, the classifier threshold of the myopic
            baselines, and :class:`~zoo.models.zilot.planners.ZilotPlanner` keyword arguments.
        seed: the test rollouts' planning noise.
    """

    def __init__(
        self,
        obs_dim: int = 4,
        action_dim: int = 1,
        goal_dim: int = 2,
        goal_slice: list[int] | None = None,
        action_grid: list[float] | None = None,
        wm_hidden: list[int] | None = None,
        wm_inputs: list[int] | None = (2, 3),
        obs_low: list[float] | None = (-1.0, -1.0, -1.0, -1.0),
        obs_high: list[float] | None = (1.0, 1.0, 1.0, 1.0),
        q_hidden: list[int] | None = None,
        value: str = "q",
        v_hidden: list[int] | None = None,
        v_dim: int = 64,
        w_hidden: list[int] | None = None,
        t_max: float = 100.0,
        lr: float = 1e-3,
        tau: float = 0.01,
        grad_clip: float = 20.0,
        env: str = "zoo/DubinsPoint-v0",
        goal_threshold: float = 0.05,
        test_planner: str = "zilot",
        theta: float = 2.0,
        planner: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if test_planner not in PLANNERS:
            raise ValueError(f"test_planner is one of {PLANNERS}, got {test_planner!r}")
        grid = torch.tensor(action_grid if action_grid is not None else [-1.0, -0.5, 0.0, 0.5, 1.0])
        if grid.ndim != 1 or len(grid) < 2:
            raise ValueError(f"action_grid is a list of at least two values per action dimension, got {action_grid}")
        if len(grid) ** action_dim > 4096:
            raise ValueError(f"{len(grid)}^{action_dim} discrete actions are too many for Q's head; use a coarser grid")
        self.register_buffer("action_grid", grid.float())
        # Q's discrete actions: the grid's values in every dimension (the product grid for action_dim > 1)
        actions = torch.cartesian_prod(*[grid.float()] * action_dim).reshape(-1, action_dim)
        self.register_buffer("actions", actions)
        self.register_buffer("goal_index", torch.tensor(goal_slice if goal_slice is not None else range(goal_dim)))
        self.world_model = WorldModel(obs_dim, action_dim, wm_hidden or [128, 128], wm_inputs, obs_low, obs_high)
        self.q = GoalQ(obs_dim, goal_dim, len(actions), q_hidden or [256, 256])
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        if value not in ("q", "two_stream"):
            raise ValueError(f"value is 'q' (V = max_u Q, the card's toy) or 'two_stream' (official), got {value!r}")
        self.value = TwoStreamValue(obs_dim, goal_dim, v_dim, v_hidden or [256, 256]) if value == "two_stream" else None
        self.goal_value = GoalGoalValue(goal_dim, w_hidden or [256, 256])
        self.automatic_optimization = False
        self.test_metrics = ImitationMetrics(goal_threshold)

    # --- the learned quantities the planners use -------------------------------------------------------------------

    def achieved_goal(self, obs: Tensor) -> Tensor:
        """φ(s): the goal entries of observations ``[..., obs_dim]``."""
        return obs[..., self.goal_index]

    def distance(self, obs: Tensor, goals: Tensor) -> Tensor:
        """d(s, g) = max(0, −V(s, g)) ≈ steps from each state ``[..., obs_dim]`` to each goal ``[N, goal_dim]``:
        ``[..., N]``."""
        value = self.q.pairwise(obs, goals).amax(-1) if self.value is None else self.value.pairwise(obs, goals)
        return (-value).clamp_min(0.0)

    def pair_distance(self, obs: Tensor, goal: Tensor) -> Tensor:
        """d(s, g) pair by pair: ``[...]`` for states ``[..., obs_dim]`` and goals ``[..., goal_dim]``."""
        value = self.q(obs, goal).amax(-1) if self.value is None else self.value(obs, goal)
        return (-value).clamp_min(0.0)

    def goal_distance(self, g1: Tensor, g2: Tensor) -> Tensor:
        """max(0, −W(g₁, g₂)), pair by pair."""
        return (-self.goal_value(g1, g2)).clamp_min(0.0)

    def policy(self, obs: Tensor, goal: Tensor) -> Tensor:
        """argmax_u Q(s, u, g) as an action ``[..., action_dim]``."""
        return self.actions[self.q(obs, goal).argmax(-1)]

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The learned parts on a batch of transitions: predicted next observations, Q over the action grid, d(s, g)
        and the goal-to-goal distance from φ(s) to g."""
        obs, goal = batch["obs"], batch["goal"]
        return {
            "next_obs": self.world_model(obs, batch["action"]),
            "q": self.q(obs, goal),
            "distance": self.pair_distance(obs, goal),
            "goal_distance": self.goal_distance(self.achieved_goal(obs), goal),
        }

    def planner(self, name: str = "zilot", generator: torch.Generator | None = None, **kwargs: Any) -> Any:
        """A planner over this model: ``"zilot"``, ``"zilot_cls"`` (ZILOT+Cls), ``"pi_cls"`` or ``"mpc_cls"``
        (``kwargs`` override the ``planner`` settings; those with a classifier take ``theta``)."""
        from zoo.models.zilot.planners import MpcCls, PiCls, ZilotCls, ZilotPlanner

        settings = {**(self.hparams.planner or {}), **kwargs}
        theta = settings.pop("theta", self.hparams.theta)
        if name == "zilot":
            return ZilotPlanner(self, generator=generator, **settings)
        if name == "zilot_cls":
            return ZilotCls(self, theta, generator=generator, **settings)
        if name == "pi_cls":
            return PiCls(self, theta)
        if name == "mpc_cls":
            keys = ("horizon", "population", "iterations", "elites", "beta", "alpha", "icem_variant")
            icem = {k: settings[k] for k in keys if k in settings}
            return MpcCls(self, theta, generator=generator, **icem)
        raise ValueError(f"unknown planner {name!r}; the planners are {PLANNERS}")

    # --- training -------------------------------------------------------------------------------------------------

    def losses(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        obs, action, nxt, goal = batch["obs"], batch["action"], batch["next_obs"], batch["goal"]
        t_max = self.hparams.t_max
        with torch.no_grad():
            y = td_target(self.q_target(nxt, goal).max(-1).values, batch["next_done"], batch["done"], t_max)
        # the offline action's nearest grid point: the nearest value per dimension, as a product-grid index
        per_dim = (action[..., None] - self.action_grid).abs().argmin(-1)  # [B, A]
        base = len(self.action_grid) ** torch.arange(self.hparams.action_dim - 1, -1, -1, device=action.device)
        index = (per_dim * base).sum(-1)
        q = self.q(obs, goal).gather(-1, index[:, None]).squeeze(-1)
        losses = {
            "model": F.mse_loss(self.world_model(obs, action), nxt),
            "q": F.mse_loss(q / t_max, y / t_max),
            "w": F.mse_loss(self.goal_value(self.achieved_goal(obs), goal) / t_max, y / t_max),
        }
        if self.value is not None:
            losses["v"] = F.mse_loss(self.value(obs, goal) / t_max, y / t_max)
        return losses

    def _parts(self) -> dict[str, torch.nn.Module]:
        parts = {"model": self.world_model, "q": self.q, "w": self.goal_value}
        return parts if self.value is None else {**parts, "v": self.value}

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # The official code steps one optimiser per part in turn. Here the parts share no parameter (V and W read the
        # raw observations, not a shared encoder), so one backward of the summed losses gives each part exactly its own
        # loss's gradient, and one Adam with a parameter group per part makes the same updates in one call (and one
        # step of Lightning's step counter per batch, which four optimisers would make four).
        losses = self.losses(batch)
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        total = sum(losses.values())
        self.manual_backward(total)
        if self.hparams.grad_clip:
            for part in self._parts().values():
                torch.nn.utils.clip_grad_norm_(part.parameters(), self.hparams.grad_clip, foreach=True)
        optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.q_target.parameters()), list(self.q.parameters()), self.hparams.tau)
        if self.trainer.is_global_zero and self.global_step % self.trainer.log_every_n_steps == 0:
            # only on the steps the logger writes: self.log costs more than this step's small networks
            self.log("train/loss", total, prog_bar=True)
            self.log_dict({f"train/{k}_loss": v for k, v in losses.items()})
        return total

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        losses = self.losses(batch)
        self.log_dict({f"val/{k}_loss": v for k, v in losses.items()}, batch_size=len(batch["obs"]))
        self.log("val/loss", sum(losses.values()), prog_bar=True, batch_size=len(batch["obs"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        groups = [{"params": list(part.parameters()), "name": name} for name, part in self._parts().items()]
        return torch.optim.Adam(groups, lr=self.hparams.lr, fused=True)

    # --- evaluation: imitate the demonstrations -------------------------------------------------------------------

    def on_test_epoch_start(self) -> None:
        from zoo.datamodules.envs import make_env

        self._env = make_env(self.hparams.env, max_episode_steps=10_000)
        self._generator = torch.Generator().manual_seed(self.hparams.seed)

    def test_step(self, demo: dict[str, Any], batch_idx: int) -> None:
        from zoo.models.zilot.planners import run_episode

        planner = self.planner(self.hparams.test_planner, generator=self._generator)
        achieved = run_episode(self._env, planner, demo)
        self.test_metrics.update(achieved, demo["goals"])

    def on_test_epoch_end(self) -> None:
        self.log_dict({f"test/{k}": v for k, v in self.test_metrics.compute().items()})
        self.test_metrics.reset()
