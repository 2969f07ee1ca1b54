"""ZILOT's learned parts, as the card's §5 toy builds them (state space, not TD-MPC2's SimNorm latents):

* :class:`WorldModel`: a residual MLP predicting Δobs from (chosen observation entries, action);
* :class:`GoalQ`: Q(s, ·, g) over a grid of actions (the toy's discrete u); the policy is its argmax;
* :class:`TwoStreamValue`: V(s, g) = φ(s) · ψ(g), the official value ZILOT's cost uses (two streams, so the cost of
  every state against every goal is one matrix product);
* :class:`GoalGoalValue`: W(g₁, g₂), the goal-to-goal value, an MLP on the pair;
* :func:`td_target`: the undiscounted, clamped TD target all three values regress onto.

All MLPs use LayerNorm and Mish (the card). Values count steps: reward −1 per step, no discount, V ∈ [−T_max, 0].

Example:
    >>> q = GoalQ(obs_dim=4, goal_dim=2, n_actions=5)
    >>> q(torch.zeros(3, 4), torch.zeros(3, 2)).shape
    torch.Size([3, 5])
    >>> td_target(torch.tensor([-5.0, -5.0, -5.0]), torch.tensor([False, True, False]),
    ...           torch.tensor([False, False, True]), t_max=100).tolist()
    [-6.0, -1.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["GoalGoalValue", "GoalQ", "TwoStreamValue", "WorldModel", "mlp", "td_target"]


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int) -> nn.Sequential:
    """Linear → LayerNorm → Mish per hidden layer, then a linear head (TD-MPC2's ``NormedLinear`` stack; timm's
    ``Mlp`` has one hidden layer and no norm after it)."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.LayerNorm(width), nn.Mish()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def td_target(next_value: Tensor, next_done: Tensor, done: Tensor, t_max: float) -> Tensor:
    """y = −1 + V_targ(s', g); −1 where s' reaches the goal, 0 where s already does; clamped to [−T_max, 0]."""
    y = torch.where(next_done, torch.full_like(next_value, -1.0), next_value - 1.0)
    y = torch.where(done, torch.zeros_like(y), y)
    return y.clamp(-t_max, 0.0)


class WorldModel(nn.Module):
    """obs' = obs + f([obs[inputs], a]), clamped to the observation box where it is given.

    ``inputs`` picks the observation entries the dynamics see (the card's toy: the heading (cos θ, sin θ), so the
    model is invariant to position); ``None`` takes all of them.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (128, 128),
                 inputs: Sequence[int] | None = None, low: Sequence[float] | None = None,
                 high: Sequence[float] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.register_buffer("inputs", torch.tensor(list(inputs) if inputs is not None else range(obs_dim)))
        self.net = mlp(len(self.inputs) + action_dim, hidden, obs_dim)
        self.register_buffer("low", torch.tensor(low, dtype=torch.float32) if low is not None else None)
        self.register_buffer("high", torch.tensor(high, dtype=torch.float32) if high is not None else None)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        nxt = obs + self.net(torch.cat([obs[..., self.inputs], action], dim=-1))
        if self.low is not None:
            nxt = torch.maximum(torch.minimum(nxt, self.high), self.low)
        return nxt

    def rollout(self, obs: Tensor, actions: Tensor) -> Tensor:
        """States ``[P, H, obs_dim]`` after each of the actions ``[P, H, A]`` from ``obs [obs_dim]`` (or ``[P, ...]``)."""
        state = obs.expand(actions.shape[0], -1) if obs.ndim == 1 else obs
        states = []
        for h in range(actions.shape[1]):
            state = self(state, actions[:, h])
            states.append(state)
        return torch.stack(states, dim=1)


class GoalQ(nn.Module):
    """Q(s, u, g) for every u of the action grid at once: ``[..., n_actions]``."""

    def __init__(self, obs_dim: int, goal_dim: int, n_actions: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.net = mlp(obs_dim + goal_dim, hidden, n_actions)

    def forward(self, obs: Tensor, goal: Tensor) -> Tensor:
        return self.net(torch.cat([obs, goal], dim=-1))

    def pairwise(self, obs: Tensor, goals: Tensor) -> Tensor:
        """Q of states ``[..., obs_dim]`` against goals ``[N, goal_dim]``: ``[..., N, n_actions]``. The first layer is
        split into its state and goal halves, so it runs once per state and once per goal, not once per pair."""
        first = self.net[0]
        w_obs, w_goal = first.weight[:, : obs.shape[-1]], first.weight[:, obs.shape[-1] :]
        hidden = (obs @ w_obs.T)[..., None, :] + (goals @ w_goal.T + first.bias)
        return self.net[1:](hidden)


class TwoStreamValue(nn.Module):
    """V(s, g) = φ(s) · ψ(g); :meth:`pairwise` gives every state against every goal as one product."""

    def __init__(self, obs_dim: int, goal_dim: int, dim: int = 64, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.phi = mlp(obs_dim, hidden, dim)
        self.psi = mlp(goal_dim, hidden, dim)

    def forward(self, obs: Tensor, goal: Tensor) -> Tensor:
        return (self.phi(obs) * self.psi(goal)).sum(-1)

    def pairwise(self, obs: Tensor, goals: Tensor) -> Tensor:
        """V of states ``[..., obs_dim]`` against goals ``[N, goal_dim]``: ``[..., N]``."""
        return self.phi(obs) @ self.psi(goals).T


class GoalGoalValue(nn.Module):
    """W(g₁, g₂): the value of reaching g₂ from a state whose achieved goal is g₁ (trained on (φ(s), g) pairs)."""

    def __init__(self, goal_dim: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.net = mlp(2 * goal_dim, hidden, 1)

    def forward(self, g1: Tensor, g2: Tensor) -> Tensor:
        return self.net(torch.cat([g1, g2], dim=-1)).squeeze(-1)
