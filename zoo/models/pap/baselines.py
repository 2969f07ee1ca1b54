"""What PAP is compared with (card §5, §6 and Review notes, the evidence standard):

* the paper's prompt baselines: the pixel-space class-wise additive prompt (:class:`PixelPrompt`, a C-AVP proxy) and
  a class-agnostic additive prompt on the complex spectrum (:class:`SpectrumPrompt`, the card's proxy for "Freq");
* a random prompt of matched norm (:func:`matched_norm_random_prompt`: the control that any input change passes a
  non-adaptive attack);
* the practitioner's first try, a standard input-transformation defence on the same base
  (:class:`InputTransformDefence`: bit-depth reduction, feature squeezing, or a local mean filter).

The prompts take ``(x, labels)`` like :class:`~zoo.models.pap.prompt.PhaseAmplitudePrompt`, so the same
predicted-label selection (:func:`~zoo.models.pap.training.predict_with_prompts`) and the same loss drive them.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.arguments import check_choice, check_range

__all__ = ["InputTransformDefence", "PixelPrompt", "SpectrumPrompt", "matched_norm_random_prompt"]


class PixelPrompt(nn.Module):
    """A class-wise additive visual prompt, x̃ = clamp(x + mask ⊙ δ[k], 0, 1): the C-AVP proxy.

    C-AVP (Chen et al.) has no package; this re-implements its class-wise additive pixel prompt with the same
    label-selection rule as PAP. ``border`` > 0 restricts the prompt to a frame of that width (the visual-prompt
    papers' pad prompt); 0 prompts the whole image. The clamp's gradient is taken as the identity (BPDA): a
    saturated pixel would otherwise block an adaptive attack's gradient and pass gradient masking off as
    robustness; the forward value is the clamp's.

    Example:
        >>> prompt = PixelPrompt(num_classes=3, image_shape=(1, 8, 8), border=2)
        >>> int(prompt.mask.sum())                           # 64 pixels minus the 4 × 4 centre
        48
        >>> x = torch.rand(2, 1, 8, 8)
        >>> torch.equal(prompt(x, torch.tensor([0, 2])), x)  # δ starts at zero
        True
    """

    def __init__(self, num_classes: int, image_shape: tuple[int, int, int], border: int = 0) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")
        c, h, w = (int(s) for s in image_shape)
        if border < 0 or 2 * border >= min(h, w):
            raise ValueError(f"border must be in [0, {min(h, w) // 2}) for {h}×{w} images, got {border}")
        self.num_classes, self.image_shape = int(num_classes), (c, h, w)
        self.delta = nn.Parameter(torch.zeros(self.num_classes, c, h, w))
        mask = torch.ones(1, h, w)
        if border:
            mask[:, border : h - border, border : w - border] = 0
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(
                f"expected images of shape (B, {', '.join(map(str, self.image_shape))}), got {tuple(x.shape)}"
            )
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(f"labels must be in [0, {self.num_classes}): the prompt holds {self.num_classes} classes")
        prompted = x + self.mask * self.delta[labels]
        return prompted + (prompted.clamp(0.0, 1.0) - prompted).detach()


@torch.no_grad()
def matched_norm_random_prompt(prompt: nn.Module, generator: torch.Generator | None = None) -> None:
    """Replace every parameter of ``prompt`` by Gaussian noise with the same Frobenius norm per class (the first
    dimension), in place: a prompt that changes the input as much as the trained one but carries nothing learned.

    >>> from zoo.models.pap.prompt import PhaseAmplitudePrompt
    >>> p = PhaseAmplitudePrompt(2, (1, 4, 4))
    >>> _ = p.init_from_exemplars(torch.rand(2, 1, 4, 4), torch.tensor([0, 1]))
    >>> before = p.amplitude.flatten(1).norm(dim=1)
    >>> matched_norm_random_prompt(p, torch.Generator().manual_seed(0))
    >>> torch.allclose(p.amplitude.flatten(1).norm(dim=1), before)
    True
    """
    for param in prompt.parameters():
        norms = param.flatten(1).norm(dim=1)
        noise = torch.randn(param.shape, generator=generator, dtype=param.dtype).to(param.device)
        scale = norms / noise.flatten(1).norm(dim=1).clamp_min(1e-12)
        param.copy_(noise * scale.view(-1, *([1] * (param.dim() - 1))))


class SpectrumPrompt(nn.Module):
    """One additive prompt on the complex 3-D spectrum for every class, x̃ = Re IFFTN(FFTN(x) + P): the card's proxy
    for the paper's "Freq" baseline (a frequency-domain prompt; the exact method is not verified). The labels are
    accepted and ignored, so the selection rule and the loss are PAP's.

    Example:
        >>> prompt = SpectrumPrompt(num_classes=3, image_shape=(1, 8, 8))
        >>> x = torch.rand(2, 1, 8, 8)
        >>> torch.allclose(prompt(x, torch.tensor([0, 2])), x, atol=1e-6)  # P starts at zero
        True
    """

    def __init__(self, num_classes: int, image_shape: tuple[int, int, int]) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")
        self.num_classes, self.image_shape = int(num_classes), tuple(int(v) for v in image_shape)
        self.real = nn.Parameter(torch.zeros(self.image_shape))
        self.imag = nn.Parameter(torch.zeros(self.image_shape))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(
                f"expected images of shape (B, {', '.join(map(str, self.image_shape))}), got {tuple(x.shape)}"
            )
        spectrum = torch.fft.fftn(x.float(), dim=(-3, -2, -1)) + torch.complex(self.real, self.imag)
        return torch.fft.ifftn(spectrum, dim=(-3, -2, -1)).real


class InputTransformDefence(nn.Module):
    """f(T(x)) for a standard input-transformation defence T on the same base f: ``"squeeze"``, bit-depth reduction
    to ``bits`` bits (feature squeezing, Xu et al. 2018), or ``"mean"``, a 3×3 local mean filter.

    Bit-depth reduction has a zero gradient almost everywhere; its gradient is taken as the identity (BPDA,
    Athalye et al. 2018) so that an adaptive attack sees through it, as it would through PAP's selection.

    Example:
        >>> base = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
        >>> defence = InputTransformDefence(base, "squeeze", bits=1)
        >>> x = torch.tensor([0.2, 0.7]).repeat(32).view(1, 1, 8, 8)
        >>> torch.equal(defence.transform(x), torch.tensor([0.0, 1.0]).repeat(32).view(1, 1, 8, 8))
        True
        >>> x = x.requires_grad_(True)
        >>> defence(x).sum().backward()
        >>> bool(x.grad.abs().sum() > 0)   # the identity's gradient, not the rounding's zero
        True
    """

    def __init__(self, base: nn.Module, kind: str = "squeeze", bits: int = 2) -> None:
        super().__init__()
        check_choice("kind", kind, ("squeeze", "mean"))
        check_range("bits", bits, 1, 16, integer=True)
        self.base, self.kind, self.bits = base, kind, bits

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mean":
            return nn.functional.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
        levels = 2**self.bits - 1
        squeezed = torch.round(x * levels) / levels
        return x + (squeezed - x).detach()  # the value of the rounding, the gradient of the identity (BPDA)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(self.transform(x))
