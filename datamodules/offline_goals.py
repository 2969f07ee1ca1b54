"""Reward-free offline trajectories with hindsight goal relabelling, and the demonstrations to imitate (ZILOT).

* :func:`collect_offline`: roll out piecewise-constant random actions in any gymnasium environment with a ``Box``
  action space (the card's exploration data: each action held for 5-15 steps) and return the buffer in the ``.npz``
  layout below.
* :class:`GoalBuffer`: the flat transition arrays of a buffer, with each transition's episode end.
* :class:`RelabelledTransitions`: a batch per ``__getitems__`` call, each transition given a goal drawn as in the
  official code (``curr`` 0.2: the next state's achieved goal; ``future`` 0.6: a Geom(1 - γ) offset within the
  episode; ``rand`` 0.2: any buffer state), with ``done`` / ``next_done`` = the state / next state within
  ``goal_threshold`` of the goal (the card's toy: exact equality is fragile in continuous spaces).
* :class:`OfflineGoalDataModule`: the embedded default (400 episodes x 100 steps of :class:`~datamodules.envs.
  DubinsPoint`) and the real paths: an ``.npz`` file, or a Minari dataset where ``minari`` and the dataset are
  installed. Its test split is the card's demonstrations (:mod:`datamodules.demos`).

The ``.npz`` layout (one row per environment step; ``episode`` ids are contiguous runs): ``obs [M, obs_dim]``,
``achieved_goal [M, goal_dim]``, ``action [M, act_dim]`` (the action taken at that row; the last row of an episode
has none that counts), ``done [M]`` (the environment's termination flag, kept for reference: the relabelled ``done``
is recomputed) and ``episode [M]``.

Example:
    >>> from datamodules.envs import DubinsPoint
    >>> data = collect_offline(DubinsPoint(), episodes=3, episode_length=10, seed=0)
    >>> buffer = GoalBuffer.from_arrays(data)
    >>> len(buffer), buffer.obs.shape[1], buffer.goal_dim
    (30, 4, 2)
    >>> batch = RelabelledTransitions(buffer, goal_threshold=0.05).__getitems__(list(range(8)))
    >>> sorted(batch), batch["goal"].shape
    (['action', 'done', 'goal', 'next_done', 'next_obs', 'obs'], torch.Size([8, 2]))
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from zoo.datamodules.base import BatchedDataModule, DictBatches

__all__ = [
    "GoalBuffer",
    "OfflineDataError",
    "OfflineGoalDataModule",
    "RelabelledTransitions",
    "check_offline_arrays",
    "collect_offline",
    "load_minari",
    "load_npz",
    "split_obs",
]

NPZ_KEYS = ("obs", "achieved_goal", "action", "episode")
LAYOUT = f"an offline .npz needs the arrays {list(NPZ_KEYS)} (+ optional 'done'), one row per environment step"


class OfflineDataError(ValueError, KeyError):
    """Offline data not in the ``.npz`` layout: a ``ValueError`` (also a ``KeyError``, which a missing array raised
    before), with the file (if known), the bad or missing key(s) and the expected keys in its message."""

    __str__ = ValueError.__str__  # the plain message, not KeyError's quoted repr


def _where(source: str | Path | None) -> str:
    return f"offline data {str(source)!r}" if source is not None else "offline data"


def check_offline_arrays(data: Any, source: str | Path | None = None) -> None:
    """Raise :class:`OfflineDataError` unless ``data`` holds the ``.npz`` layout's arrays: each of ``NPZ_KEYS``
    present, at least one row, ``obs`` / ``achieved_goal`` / ``action`` ``[rows, dim]`` and finite, ``episode`` one
    finite id per row. ``source`` (the file) is named in the message.

    Example:
        >>> try:
        ...     check_offline_arrays({"obs": np.zeros((2, 3)), "action": np.zeros((2, 1)), "episode": [0, 0]}, "b.npz")
        ... except OfflineDataError as err:
        ...     print(str(err).split(";")[0])
        offline data 'b.npz' lacks ['achieved_goal']
    """
    where = _where(source)
    missing = [k for k in NPZ_KEYS if k not in data]
    if missing:
        raise OfflineDataError(f"{where} lacks {missing}; {LAYOUT}")
    episode = np.asarray(data["episode"]).reshape(-1)
    if len(episode) == 0:
        raise OfflineDataError(f"{where} holds zero rows ('episode' is empty); {LAYOUT}")
    if episode.dtype.kind == "f" and not np.isfinite(episode).all():
        raise OfflineDataError(f"{where}: 'episode' holds NaN or inf (row {int(np.argmin(np.isfinite(episode)))})")
    for k in ("obs", "achieved_goal", "action"):
        v = np.asarray(data[k])
        if v.ndim != 2 or len(v) != len(episode) or v.dtype.kind not in "biuf":
            raise OfflineDataError(f"{where}: {k!r} must be numeric [rows, dim] with one row per 'episode' entry, "
                                   f"got {v.dtype} {v.shape} for {len(episode)} rows; {LAYOUT}")  # fmt: skip
        finite = np.isfinite(v).all(1)
        if not finite.all():
            raise OfflineDataError(f"{where}: {k!r} holds NaN or inf (first in row {int(np.argmin(finite))})")


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an offline ``.npz`` file, checked by :func:`check_offline_arrays` (never unpickled)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"No offline data at {file}. Put an .npz with arrays {list(NPZ_KEYS)} (+ 'done'), "
                                "one row per step, there; collect_offline(env) in datamodules.offline_goals writes "
                                "one from any gymnasium env")  # fmt: skip
    try:
        loaded = np.load(file, allow_pickle=False)
        if not hasattr(loaded, "files"):  # a single array (.npy)
            raise OfflineDataError(f"{_where(file)} is one array (.npy), not an .npz of named arrays; {LAYOUT}")
        with loaded as f:
            data = {k: f[k] for k in f.files}
    except (EOFError, OSError, zipfile.BadZipFile, ValueError) as err:  # empty, truncated, pickled, not numpy
        if isinstance(err, OfflineDataError):
            raise
        raise OfflineDataError(f"{_where(file)} is not a readable .npz ({type(err).__name__}: {err}); {LAYOUT}"
                               ) from err  # fmt: skip
    check_offline_arrays(data, file)
    return data


def split_obs(obs: Any, info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(observation, achieved goal) of a step: goal environments give dicts, the zoo's put the goal in ``info``."""
    if isinstance(obs, dict):
        return np.asarray(obs["observation"], np.float32), np.asarray(obs["achieved_goal"], np.float32)
    if "achieved_goal" not in info:
        raise ValueError("collect_offline: the environment gives no achieved goal (a dict observation with "
                         "'achieved_goal', or info['achieved_goal'])")  # fmt: skip
    return np.asarray(obs, np.float32), np.asarray(info["achieved_goal"], np.float32)


def collect_offline(
    env: Any, episodes: int = 400, episode_length: int = 100, hold: tuple[int, int] = (5, 15), seed: int = 0
) -> dict[str, np.ndarray]:
    """Reward-free exploration data: ``episodes`` rollouts of ``episode_length`` steps from the environment's random
    initial states, each action uniform in the action space and held for ``hold`` (inclusive) steps.

    ``env`` is a gymnasium environment or its id (``"zoo/DubinsPoint-v0"``, a gymnasium-robotics maze, ...). Returns
    the ``.npz`` layout of this module (``np.savez(path, **data)`` writes a file :class:`OfflineGoalDataModule` reads).
    """
    import gymnasium as gym

    from zoo.datamodules.envs import make_env

    if isinstance(env, str):
        env = make_env(env, max_episode_steps=episode_length + 1)
    space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"collect_offline: needs a Box action space, got {space}")
    rng = np.random.default_rng(seed)
    space.seed(seed)
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "achieved_goal", "action", "done", "episode")}
    for episode in range(episodes):
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        left, action = 0, space.sample()
        for t in range(episode_length + 1):
            o, g = split_obs(obs, info)
            if left == 0:
                left, action = int(rng.integers(hold[0], hold[1] + 1)), space.sample()
            rows["obs"].append(o)
            rows["achieved_goal"].append(g)
            rows["action"].append(np.asarray(action, np.float32))
            rows["episode"].append(np.asarray(episode))
            terminated = False
            if t < episode_length:
                obs, _, terminated, _, info = env.step(action)
                left -= 1
            rows["done"].append(np.asarray(terminated))
            if terminated:
                break
    return {k: np.stack(v) for k, v in rows.items()}


def load_minari(dataset_id: str) -> dict[str, np.ndarray]:
    """A Minari offline dataset (``"D4RL/pointmaze/medium-v2"``, ...) in this module's ``.npz`` layout.

    Needs ``pip install minari`` and the dataset already downloaded (``minari download DATASET_ID``): nothing is
    fetched here.
    """
    try:
        import minari
    except ImportError as err:
        raise ImportError(
            f"load_minari({dataset_id!r}) needs the `minari` package: pip install minari, then "
            f"`minari download {dataset_id}` where a network exists (or export the data to the .npz layout of "
            "zoo.datamodules.offline_goals and pass path=...)"
        ) from err
    try:
        dataset = minari.load_dataset(dataset_id)
    except Exception as err:  # minari raises several types for a dataset that is not on disk
        raise FileNotFoundError(
            f"Minari dataset {dataset_id!r} is not on this machine ({err}); run `minari download {dataset_id}` "
            "where a network exists"
        ) from err
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "achieved_goal", "action", "done", "episode")}
    for i, ep in enumerate(dataset.iterate_episodes()):
        obs = ep.observations
        o, g = (np.asarray(obs["observation"]), np.asarray(obs["achieved_goal"])) if isinstance(obs, dict) else (
            np.asarray(obs), np.asarray(obs)[:, :2])  # fmt: skip
        n = len(o)  # one more observation than actions
        rows["obs"].append(o.astype(np.float32))
        rows["achieved_goal"].append(g.astype(np.float32))
        actions = np.asarray(ep.actions, np.float32)
        rows["action"].append(np.concatenate([actions, actions[-1:]]))
        rows["done"].append(np.concatenate([[False], np.asarray(ep.terminations, bool)]))
        rows["episode"].append(np.full(n, i))
    return {k: np.concatenate(v) for k, v in rows.items()}


@dataclass
class GoalBuffer:
    """Flat transitions ``obs -> next_obs`` under ``action``, their achieved goals, and each one's episode end.

    ``last[i]`` is the index of the last transition of transition ``i``'s episode (for ``future`` goals).
    """

    obs: Tensor
    action: Tensor
    next_obs: Tensor
    achieved: Tensor
    next_achieved: Tensor
    last: Tensor

    @property
    def goal_dim(self) -> int:
        return self.achieved.shape[1]

    def __len__(self) -> int:
        return len(self.obs)

    @classmethod
    def from_arrays(cls, data: dict[str, np.ndarray], episodes: Sequence[int] | None = None,
                    source: str | Path | None = None) -> GoalBuffer:  # fmt: skip
        """Transitions of the ``.npz`` layout (optionally of some episode ids only); ``source`` (the file, if any) is
        named in the :class:`OfflineDataError` of :func:`check_offline_arrays`."""
        check_offline_arrays(data, source)
        episode = np.asarray(data["episode"]).reshape(-1)
        arrays = {k: np.asarray(data[k], np.float32) for k in ("obs", "achieved_goal", "action")}
        for k, v in arrays.items():  # finite as given, but float64 beyond float32's range is not
            if not np.isfinite(v).all():
                raise OfflineDataError(f"{_where(source)}: {k!r} overflows float32")
        same = episode[1:] == episode[:-1]  # row i -> i + 1 is a transition within one episode
        keep = same if episodes is None else same & np.isin(episode[:-1], np.asarray(episodes))
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            raise OfflineDataError(f"{_where(source)} holds no transition (every episode has one row, or none was "
                                   "selected)")  # fmt: skip
        # the last transition of each run of consecutive transitions
        ends = np.flatnonzero(np.diff(np.r_[idx, -10]) != 1)
        last = np.repeat(np.arange(len(ends)), np.diff(np.r_[-1, ends]))
        last = ends[last]
        t = {k: torch.from_numpy(v) for k, v in arrays.items()}
        i = torch.from_numpy(idx)
        return cls(t["obs"][i], t["action"][i], t["obs"][i + 1], t["achieved_goal"][i], t["achieved_goal"][i + 1],
                   torch.from_numpy(last))  # fmt: skip


class RelabelledTransitions(Dataset):
    """Transitions of a :class:`GoalBuffer` with goals relabelled per batch (``curr`` / ``future`` / ``rand``).

    ``future`` draws the offset k ~ Geom(1 - ``gamma``) (k ≥ 1) and takes the achieved goal k - 1 transitions on,
    clipped to the episode's end. Random draws come from the global torch RNG (the zoo's checkpoints keep it), or
    from ``generator``.
    """

    def __init__(self, buffer: GoalBuffer, p_curr: float = 0.2, p_future: float = 0.6, p_rand: float = 0.2,
                 gamma: float = 0.96, goal_threshold: float = 0.05) -> None:  # fmt: skip
        total = p_curr + p_future + p_rand
        if min(p_curr, p_future, p_rand) < 0 or abs(total - 1) > 1e-6:
            raise ValueError(f"p_curr + p_future + p_rand must be 1 (each ≥ 0), got {p_curr}, {p_future}, {p_rand}")
        if not 0 <= gamma < 1:
            raise ValueError(f"gamma is in [0, 1), got {gamma}")
        self.buffer, self.gamma, self.threshold = buffer, gamma, goal_threshold
        self.cut = torch.tensor([p_curr, p_curr + p_future])

    def __len__(self) -> int:
        return len(self.buffer)

    def relabel(self, idx: Tensor, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        b, n = self.buffer, len(idx)
        kind = torch.bucketize(torch.rand(n, generator=generator), self.cut, right=True)  # 0 curr, 1 future, 2 rand
        u = torch.rand(n, generator=generator).clamp_min(1e-12)
        offset = (torch.log(u) / np.log(self.gamma)).floor().long() if self.gamma > 0 else torch.zeros(n).long()
        future = torch.minimum(idx + offset, b.last[idx])  # Geom(1 - γ) on {1, 2, ...}, minus one
        rand = torch.randint(len(b), (n,), generator=generator)
        source = torch.where(kind == 0, idx, torch.where(kind == 1, future, rand))
        goal = b.next_achieved[source]
        return {
            "obs": b.obs[idx],
            "action": b.action[idx],
            "next_obs": b.next_obs[idx],
            "goal": goal,
            "done": (b.achieved[idx] - goal).norm(dim=-1) <= self.threshold,
            "next_done": (b.next_achieved[idx] - goal).norm(dim=-1) <= self.threshold,
        }

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Tensor]:
        return self.relabel(torch.as_tensor(indices, dtype=torch.long))


class OfflineGoalDataModule(BatchedDataModule):
    """Offline goal-relabelled transitions for training, demonstrations for testing (ZILOT's data).

    Args:
        env: the gymnasium id of the environment (collected from, and where the demonstrations are rolled out).
        path: an ``.npz`` file in this module's layout (the real path); ``None`` collects the embedded default.
        minari: a Minari dataset id (needs ``minari`` and the downloaded dataset), instead of ``path``.
        episodes / episode_length / hold: the embedded default's exploration data (the card: 400 x 100, held 5-15).
        val_episodes: the last episodes, held out for the validation losses.
        p_curr / p_future / p_rand / gamma / goal_threshold: the relabelling (card: 0.2 / 0.6 / 0.2, γ 0.96, 0.05).
        demos: the demonstration set of :func:`datamodules.demos.demo_set` for the test split (``"card"``: the six
            of the card's §5; ``"quick"``: one per shape).
        seed: seeds the collection and the validation relabelling.

    Example:
        >>> dm = OfflineGoalDataModule(episodes=6, episode_length=20, val_episodes=2, batch_size=16, demos="quick")
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch["obs"].shape, batch["goal"].shape, len(dm.val_set)
        (torch.Size([16, 4]), torch.Size([16, 2]), 40)
        >>> dm.setup("test")
        >>> [d["name"] for d in dm.test_set]
        ['zigzag-sparse', 'zigzag-dense', 'u-sparse']
    """

    def __init__(
        self,
        env: str = "zoo/DubinsPoint-v0",
        path: str | None = None,
        minari: str | None = None,
        episodes: int = 400,
        episode_length: int = 100,
        hold: tuple[int, int] = (5, 15),
        val_episodes: int = 40,
        p_curr: float = 0.2,
        p_future: float = 0.6,
        p_rand: float = 0.2,
        gamma: float = 0.96,
        goal_threshold: float = 0.05,
        demos: str = "card",
        batch_size: int = 512,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.data: dict[str, np.ndarray] | None = None

    def _arrays(self) -> dict[str, np.ndarray]:
        h = self.hparams
        if self.data is not None:
            return self.data
        if h.path is not None:
            self.data = load_npz(h.path)
        elif h.minari is not None:
            self.data = load_minari(h.minari)
        else:
            self.data = collect_offline(h.env, h.episodes, h.episode_length, tuple(h.hold), seed=h.seed)
        return self.data

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if stage in (None, "fit", "validate") and self.train_set is None:
            data = self._arrays()
            source = h.path if h.path is not None else h.minari
            check_offline_arrays(data, source)
            ids = np.unique(data["episode"])
            if not 0 <= h.val_episodes < len(ids):
                raise ValueError(f"val_episodes={h.val_episodes} must leave training episodes (there are {len(ids)})")
            cut = len(ids) - h.val_episodes
            kw = dict(p_curr=h.p_curr, p_future=h.p_future, p_rand=h.p_rand, gamma=h.gamma,
                      goal_threshold=h.goal_threshold)  # fmt: skip
            self.buffer = GoalBuffer.from_arrays(data, ids[:cut], source)
            self.train_set = RelabelledTransitions(self.buffer, **kw)
            if h.val_episodes:
                val = RelabelledTransitions(GoalBuffer.from_arrays(data, ids[cut:], source), **kw)
                gen = torch.Generator().manual_seed(h.seed + 1)
                self.val_set = DictBatches(val.relabel(torch.arange(len(val)), generator=gen))
        if stage in (None, "test", "predict") and self.test_set is None:
            from zoo.datamodules.demos import demo_set

            self.test_set = demo_set(h.demos)

    def val_dataloader(self) -> DataLoader | list:
        return [] if self.val_set is None else super().val_dataloader()

    def test_dataloader(self) -> DataLoader:
        if self.test_set is None:
            raise RuntimeError("Call OfflineGoalDataModule.setup('test') before asking for the test loader.")
        return DataLoader(self.test_set, batch_size=None, collate_fn=lambda demo: demo)  # one demonstration per step

    predict_dataloader = test_dataloader
