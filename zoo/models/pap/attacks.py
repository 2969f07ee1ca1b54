"""The defended PAP pipeline as one module, the target of adaptive attacks, and the differentiable surrogates an
adaptive attacker uses on its label-driven prompt selection (attacks themselves: :mod:`zoo.attacks`)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ExpectationOverPrompts", "PromptedPipeline"]


class PromptedPipeline(nn.Module):
    """The defended classifier as one module, x ↦ f(prompt(x, ŷ₀)), for adaptive attacks.

    With ``fixed_class=None`` the prompt is selected by ŷ₀ = argmax f(x), computed without gradient: the selection is
    piecewise constant, so BPDA with the identity on it (straight-through) is its exact gradient almost everywhere,
    and the attack's gradient flows through the prompt operator, its FFTs and f. ``fixed_class=k`` applies class k's
    prompt to every image. Any prompt taking ``(x, labels)`` and holding ``num_classes`` works (PAP's, the pixel
    prompt).

    Example:
        >>> from zoo.models.pap.prompt import PhaseAmplitudePrompt
        >>> base = nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).eval()
        >>> pipe = PromptedPipeline(base, PhaseAmplitudePrompt(3, (1, 8, 8)))
        >>> x = torch.rand(2, 1, 8, 8, requires_grad=True)
        >>> pipe(x).sum().backward()
        >>> x.grad.shape
        torch.Size([2, 1, 8, 8])
        >>> sorted(pipe.attack_views())
        ['eot', 'true_prompt']
    """

    def __init__(self, base: nn.Module, prompt: nn.Module, fixed_class: int | None = None) -> None:
        super().__init__()
        self.base, self.prompt, self.fixed_class = base, prompt, fixed_class

    def attack_views(self) -> dict[str, nn.Module | list[nn.Module]]:
        """The surrogates of the selection an adaptive attacker differentiates
        (:func:`callbacks.robust_eval.robust_accuracies`): ``true_prompt``, one pipeline per class with that class's
        prompt fixed (an image of class k is attacked through prompt k, the one selected while the attack has not
        yet succeeded: BPDA on the selection); ``eot``, the expectation over every class's prompt."""
        return {
            "true_prompt": [PromptedPipeline(self.base, self.prompt, k) for k in range(self.prompt.num_classes)],
            "eot": ExpectationOverPrompts(self.base, self.prompt),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_class is not None:
            labels = torch.full((len(x),), self.fixed_class, dtype=torch.long, device=x.device)
        else:
            with torch.no_grad():
                labels = self.base(x).argmax(1)
        return self.base(self.prompt(x, labels))


class ExpectationOverPrompts(nn.Module):
    """log E_k softmax f(prompt(x, k)) over every class's prompt k, uniformly: the expectation-over-transformation
    surrogate of the selection (its cross-entropy is −log of the mean probability of the true class).

    Example:
        >>> from zoo.models.pap.prompt import PhaseAmplitudePrompt
        >>> base = nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).eval()
        >>> eot = ExpectationOverPrompts(base, PhaseAmplitudePrompt(3, (1, 8, 8)))
        >>> x = torch.rand(2, 1, 8, 8)
        >>> torch.allclose(eot(x), base(x).log_softmax(1), atol=1e-5)   # zero prompts: every k is the identity
        True
    """

    def __init__(self, base: nn.Module, prompt: nn.Module) -> None:
        super().__init__()
        self.base, self.prompt = base, prompt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.prompt.num_classes
        labels = torch.arange(k, device=x.device).repeat_interleave(len(x))
        logits = self.base(self.prompt(x.repeat(k, *([1] * (x.dim() - 1))), labels))  # [k·B, K], class-major
        log_p = logits.log_softmax(1).view(k, len(x), -1)
        return torch.logsumexp(log_p, dim=0) - torch.log(torch.tensor(float(k), device=x.device))
