"""The defended PAP pipeline as one module, the target of adaptive attacks (attacks themselves: :mod:`zoo.attacks`)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PromptedPipeline"]


class PromptedPipeline(nn.Module):
    """The defended classifier as one module, x ↦ f(prompt(x, ŷ₀)), for adaptive attacks.

    With ``fixed_class=None`` the prompt is selected by ŷ₀ = argmax f(x), computed without gradient: the selection is
    piecewise constant, so BPDA with the identity on it (straight-through) is its exact gradient almost everywhere,
    and the attack's gradient flows through the prompt operator, its FFTs and f. ``fixed_class=k`` applies class k's
    prompt to every image: attacking each k and keeping the worst case is the second adaptive number.

    Example:
        >>> from zoo.models.pap.prompt import PhaseAmplitudePrompt
        >>> base = nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).eval()
        >>> pipe = PromptedPipeline(base, PhaseAmplitudePrompt(3, (1, 8, 8)))
        >>> x = torch.rand(2, 1, 8, 8, requires_grad=True)
        >>> pipe(x).sum().backward()
        >>> x.grad.shape
        torch.Size([2, 1, 8, 8])
    """

    def __init__(self, base: nn.Module, prompt: nn.Module, fixed_class: int | None = None) -> None:
        super().__init__()
        self.base, self.prompt, self.fixed_class = base, prompt, fixed_class

    def adaptive_candidates(self) -> list[PromptedPipeline]:
        """The pipeline with each class's prompt forced: attacking each and keeping the worst case is the second
        adaptive number (:func:`callbacks.robust_eval.robust_accuracies`)."""
        return [PromptedPipeline(self.base, self.prompt, k) for k in range(self.prompt.num_classes)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_class is not None:
            labels = torch.full((len(x),), self.fixed_class, dtype=torch.long, device=x.device)
        else:
            with torch.no_grad():
                labels = self.base(x).argmax(1)
        return self.base(self.prompt(x, labels))
