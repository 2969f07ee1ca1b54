"""Goal-reaching control tasks as ``gymnasium`` environments, made in code (no download, no physics engine).

:class:`DubinsPoint` is the ZILOT card's toy (§5): a car at constant speed that can only steer, so the way a goal is
reached (the heading on arrival) decides how quickly the next one can be. A planner that only looks at the next goal
arrives pointing the wrong way and must loop; one that sees the whole demonstration curves early.

The environment is registered with gymnasium as ``"zoo/DubinsPoint-v0"`` on import of this module, so
``gymnasium.make("zoo/DubinsPoint-v0")`` works like any other task.

Example:
    >>> env = DubinsPoint()
    >>> obs, info = env.reset(seed=0, options={"state": [0.0, 0.0, 0.0]})
    >>> obs, reward, terminated, truncated, info = env.step(np.array([0.0], dtype=np.float32))
    >>> [round(float(v), 2) for v in obs], [round(float(v), 2) for v in info["achieved_goal"]]
    ([0.04, 0.0, 1.0, 0.0], [0.04, 0.0])
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["DubinsPoint", "dubins_step", "goal_of", "make_env"]

SPEED = 0.04  # arena units per step
TURN = 0.3  # rad per step at |u| = 1: a turning radius of SPEED / TURN ≈ 0.133
ARENA = 1.0  # positions are clipped to [-ARENA, ARENA]²


def dubins_step(state: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One step of the car for a batch of states ``[..., 3]`` (x, y, θ) and steering ``u`` in [-1, 1] (``[...]``):
    turn by ``0.3 u`` rad, then move 0.04 along the new heading, clipped to the arena."""
    theta = state[..., 2] + TURN * np.clip(u, -1.0, 1.0)
    x = np.clip(state[..., 0] + SPEED * np.cos(theta), -ARENA, ARENA)
    y = np.clip(state[..., 1] + SPEED * np.sin(theta), -ARENA, ARENA)
    return np.stack([x, y, np.arctan2(np.sin(theta), np.cos(theta))], axis=-1)


def observe(state: np.ndarray) -> np.ndarray:
    """The observation (x, y, cos θ, sin θ) of states ``[..., 3]``."""
    return np.concatenate([state[..., :2], np.cos(state[..., 2:]), np.sin(state[..., 2:])], axis=-1).astype(np.float32)


def goal_of(obs: np.ndarray) -> np.ndarray:
    """The goal abstraction φ: the position (x, y) of observations ``[..., 4]``."""
    return obs[..., :2]


class DubinsPoint(gym.Env):
    """The Dubins-car point task: observation (x, y, cos θ, sin θ), action ``u`` in [-1, 1] (steering), goal (x, y).

    Reward-free, as the offline data is: ``reward`` is 0 and ``terminated`` is False; an episode ends by truncation at
    ``max_episode_steps``. ``info["achieved_goal"]`` is φ(s). ``reset(options={"state": (x, y, θ)})`` starts from a
    given pose; without it the pose is uniform in the arena (heading uniform in [-π, π)).

    Args:
        max_episode_steps: the episode length (the card's T_max = 100).
    """

    metadata = {"render_modes": []}

    def __init__(self, max_episode_steps: int = 100) -> None:
        self.max_episode_steps = max_episode_steps
        high = np.array([ARENA, ARENA, 1.0, 1.0], dtype=np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.goal_space = spaces.Box(-ARENA, ARENA, shape=(2,), dtype=np.float32)
        self.state = np.zeros(3)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if options and options.get("state") is not None:
            state = np.asarray(options["state"], dtype=np.float64)
            if state.shape != (3,):
                raise ValueError(f"DubinsPoint: options['state'] is (x, y, θ), got shape {state.shape}")
            self.state = state.copy()
        else:
            xy = self.np_random.uniform(-ARENA, ARENA, size=2)
            self.state = np.array([*xy, self.np_random.uniform(-np.pi, np.pi)])
        self._t = 0
        obs = observe(self.state)
        return obs, {"achieved_goal": goal_of(obs)}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        u = np.asarray(action, dtype=np.float64).reshape(-1)
        if u.shape != (1,) or not np.isfinite(u).all():
            raise ValueError(f"DubinsPoint: the action is one finite steering value, got {action!r}")
        self.state = dubins_step(self.state, u[0])
        self._t += 1
        obs = observe(self.state)
        return obs, 0.0, False, self._t >= self.max_episode_steps, {"achieved_goal": goal_of(obs)}


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id)``, registering gymnasium-robotics' tasks (mazes, Fetch) first where it is installed,
    with an error that says what to install when the id is unknown."""
    try:
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
    except ImportError:
        pass
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as err:
        if "doesn't exist" not in str(err) and "not found" not in str(err).lower():
            raise
        raise gym.error.Error(
            f"{err}. The zoo's own task is 'zoo/DubinsPoint-v0'; mazes and Fetch (PointMaze_Medium-v3, FetchPush-v4, "
            "...) need `pip install gymnasium-robotics` (MuJoCo assets included, no download)"
        ) from err


if "zoo/DubinsPoint-v0" not in gym.registry:
    gym.register("zoo/DubinsPoint-v0", entry_point=DubinsPoint, max_episode_steps=100)
