"""Lightning callbacks that work with any zoo module exposing the documented properties."""

from callbacks.sae_stability import SAEStability

__all__ = ["SAEStability"]
