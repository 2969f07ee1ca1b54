"""ZILOT: zero-shot offline imitation by occupancy matching with optimal transport (Rupf et al., ICML 2025)."""

from zoo.models.zilot.icem import ICEM, coloured_noise
from zoo.models.zilot.module import Zilot
from zoo.models.zilot.networks import GoalGoalValue, GoalQ, TwoStreamValue, WorldModel, td_target
from zoo.models.zilot.planners import (
    MpcCls,
    PiCls,
    PurePursuit,
    ZilotCls,
    ZilotPlanner,
    check_demo,
    check_obs,
    run_episode,
)

__all__ = [
    "ICEM",
    "GoalGoalValue",
    "GoalQ",
    "MpcCls",
    "PiCls",
    "PurePursuit",
    "TwoStreamValue",
    "WorldModel",
    "Zilot",
    "ZilotCls",
    "ZilotPlanner",
    "check_demo",
    "check_obs",
    "coloured_noise",
    "run_episode",
    "td_target",
]
