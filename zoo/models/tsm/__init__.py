"""TimeStep Master: asymmetric mixtures of timestep LoRA experts for diffusion models (Zhuang et al., ICML 2025)."""

from zoo.models.tsm.module import TSMDiffusion, eval_grid

__all__ = ["TSMDiffusion", "eval_grid"]
