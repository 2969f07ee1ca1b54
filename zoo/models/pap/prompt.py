"""PAP's prompting operator: class-wise amplitude and phase prompts in the 3-D Fourier domain (card §2.1).

For an image x ∈ [0, 1]^{C×H×W} with X = FFTN(x) over (C, H, W), amplitude A = |X| and phase Φ = angle(X), the
prompted image for class k is

    x̃ = Re IFFTN( (A + λ·P_A[k]) · exp(i·(Φ + P_Φ[k])) )

with λ the adaptive amplitude weight (the phase weight is 1). Nothing is clamped: a negative "amplitude" acts as a
phase flip, and the real part drops the imaginary residue, as the reference script does.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PhaseAmplitudePrompt", "check_unit_range"]

_DIMS = (-3, -2, -1)  # (C, H, W): one 3-D FFT per image, not a 2-D FFT per channel


def check_unit_range(x: torch.Tensor, name: str = "images") -> None:
    """Refuse empty batches, NaN or infinite pixels and inputs outside [0, 1]: the attacks' ε and the prompts assume
    unnormalised images.

    >>> check_unit_range(torch.rand(2, 1, 8, 8))
    >>> check_unit_range(torch.full((1, 1, 2, 2), 2.0))
    Traceback (most recent call last):
    ...
    ValueError: images must lie in [0, 1] (got min 2, max 2): ...
    >>> check_unit_range(torch.full((1, 1, 2, 2), float("nan")))
    Traceback (most recent call last):
    ...
    ValueError: images hold 4 NaN or infinite values: ...
    """
    if not x.numel():
        raise ValueError(f"{name} is an empty batch (shape {tuple(x.shape)}): nothing to classify")
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"{name} hold {bad} NaN or infinite values: PAP needs finite pixels in [0, 1]")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            f"{name} must lie in [0, 1] (got min {lo:.3g}, max {hi:.3g}): PAP's prompts and attacks work on "
            "unnormalised images; put any normalisation inside the model"
        )


class PhaseAmplitudePrompt(nn.Module):
    """One amplitude prompt and one phase prompt per class, each of the image's shape, and the weight λ.

    Args:
        num_classes: K, the number of prompt pairs (one per class of the base classifier).
        image_shape: (C, H, W) of the images.
        lambda_amp: the initial amplitude weight λ (the card starts it at 1).
        use_amplitude, use_phase: which prompts the forward applies (both for PAP; one off: the card's phase-only
            and amplitude-only ablations, whose other prompt then gets no gradient and never moves).

    Example:
        >>> prompt = PhaseAmplitudePrompt(num_classes=3, image_shape=(1, 8, 8))
        >>> x = torch.rand(4, 1, 8, 8)
        >>> torch.allclose(prompt(x, torch.tensor([0, 1, 2, 0])), x, atol=1e-6)   # zero prompts: the identity
        True
        >>> prompt.init_from_exemplars(torch.rand(3, 1, 8, 8), torch.tensor([2, 0, 1]))
        [0, 1, 2]
        >>> prompt(x, torch.tensor([0, 1, 2, 0])).shape
        torch.Size([4, 1, 8, 8])
    """

    def __init__(
        self,
        num_classes: int,
        image_shape: tuple[int, int, int],
        lambda_amp: float = 1.0,
        use_amplitude: bool = True,
        use_phase: bool = True,
    ) -> None:
        super().__init__()
        if not (use_amplitude or use_phase):
            raise ValueError("use_amplitude and use_phase are both False: the prompt would be the identity")
        self.use_amplitude, self.use_phase = bool(use_amplitude), bool(use_phase)
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")
        self.num_classes, self.image_shape = int(num_classes), tuple(int(s) for s in image_shape)
        self.amplitude = nn.Parameter(torch.zeros(self.num_classes, *self.image_shape))
        self.phase = nn.Parameter(torch.zeros(self.num_classes, *self.image_shape))
        self.register_buffer("lambda_amp", torch.tensor(float(lambda_amp)))

    def _check(self, x: torch.Tensor, labels: torch.Tensor) -> None:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(
                f"expected images of shape (B, {', '.join(map(str, self.image_shape))}), got {tuple(x.shape)}"
            )
        if labels.shape != (x.shape[0],):
            raise ValueError(f"expected one label per image ({x.shape[0]}), got labels of shape {tuple(labels.shape)}")
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(
                f"labels must be in [0, {self.num_classes}), got {int(labels.min())}..{int(labels.max())}"
                f": the prompt holds {self.num_classes} classes"
            )

    @torch.no_grad()
    def init_from_exemplars(
        self, images: torch.Tensor, labels: torch.Tensor, classes: list[int] | None = None
    ) -> list[int]:
        """Set each class's prompts to the amplitude and phase of the first image of that class in ``images``
        (the reference script takes the first one met in the shuffled, augmented loader). ``classes`` limits it to
        those classes and skips the ones ``images`` lacks; by default every class must be present. Returns the
        classes set."""
        self._check(images, labels)
        spectrum = torch.fft.fftn(images.float(), dim=_DIMS)
        missing, done = [], []
        for k in range(self.num_classes) if classes is None else classes:
            where = (labels == k).nonzero()
            if not len(where):
                missing.append(k)
                continue
            first = int(where[0])
            self.amplitude[k] = spectrum[first].abs()
            self.phase[k] = spectrum[first].angle()
            done.append(k)
        if missing and classes is None:
            raise ValueError(
                f"no exemplar for classes {missing}: pass images that cover all {self.num_classes} classes"
            )
        return done

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor, amplitude: bool | None = None, phase: bool | None = None
    ) -> torch.Tensor:
        """Apply the prompts of ``labels`` (one class per image) to ``x``; ``amplitude=False`` or ``phase=False``
        leaves that part of the spectrum unprompted (the amplitude-only and phase-only images of λ's update); by
        default the parts this prompt uses (``use_amplitude``, ``use_phase``)."""
        self._check(x, labels)
        amplitude = self.use_amplitude if amplitude is None else amplitude
        phase = self.use_phase if phase is None else phase
        spectrum = torch.fft.fftn(x.to(self.amplitude.dtype), dim=_DIMS)  # the prompt's precision
        amp, ang = spectrum.abs(), spectrum.angle()
        if amplitude:
            amp = amp + self.lambda_amp * self.amplitude[labels]
        if phase:
            ang = ang + self.phase[labels]
        # amp · e^{i·ang}, not torch.polar: amp goes negative (no constraint keeps A + λP_A ≥ 0), where torch.polar
        # is undefined and its gradient with respect to amp has the wrong sign
        return torch.fft.ifftn(amp * torch.exp(1j * ang), dim=_DIMS).real

    def amplitude_only(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Re IFFTN((A + λ P_A[y]) e^{iΦ}): the image λ's update scores the amplitude prompt on."""
        return self(x, labels, amplitude=True, phase=False)

    def phase_only(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Re IFFTN(A e^{i(Φ + P_Φ[y])}): the image λ's update scores the phase prompt on."""
        return self(x, labels, amplitude=False, phase=True)
