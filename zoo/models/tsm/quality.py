"""Sample quality for the TSM reproduction: the Fréchet distance of generated digits in a small classifier's features.

The TSM card's secondary metric (§6): a tiny CNN trained on inverted digits 0–9 (the target's look, every class)
gives the feature space, as Inception-v3 does for FID; the Fréchet distance between the features of generated and
held-out target images is computed by torchmetrics' ``FrechetInceptionDistance`` with this network as its feature
extractor, and the classifier's own reading gives the share of samples that are target digits (5–9). The denoising
MSE alone cannot tell a model of digits from a Gaussian with their mean and covariance; sampling can.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DigitClassifier", "SampleQuality"]


class DigitClassifier(nn.Module):
    """A small CNN for 8×8 digits in [−1, 1]: ``features`` (``num_features`` wide) then a linear head.

    ``forward`` takes images in [0, 1] (what torchmetrics' FID hands a custom feature extractor with
    ``normalize=True``) and returns the features; ``logits`` takes images in [−1, 1].

    Example:
        >>> net = DigitClassifier()
        >>> net(torch.rand(2, 1, 8, 8)).shape, net.logits(torch.rand(2, 1, 8, 8) * 2 - 1).shape
        (torch.Size([2, 32]), torch.Size([2, 10]))
    """

    num_features = 32

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, self.num_features),
            nn.ReLU(),
        )
        self.head = nn.Linear(self.num_features, classes)

    def features(self, x: Tensor) -> Tensor:
        return self.body(x)

    def logits(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x.float() * 2 - 1)


class SampleQuality:
    """Train the classifier once, then score sets of generated images against the held-out target images.

    Args:
        images: training images in [−1, 1] ``(N, 1, 8, 8)`` of every class, in the target's look.
        labels: their digits ``(N,)``.
        reference: held-out target images, the real set of the Fréchet distance.
        target_classes: the digits of the target domain.
        steps: classifier training steps (AdamW, batch 128).
        seed: seed of the classifier's initialisation and batches.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x, y = torch.rand(64, 1, 8, 8, generator=g) * 2 - 1, torch.arange(64) % 10
        >>> quality = SampleQuality(x, y, x[:32], target_classes=range(5, 10), steps=5)
        >>> sorted(quality(x[32:]))
        ['fd', 'target_share']
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        reference: Tensor,
        target_classes: range | list[int] = range(5, 10),
        steps: int = 400,
        seed: int = 0,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.net = DigitClassifier()
        optimizer = torch.optim.AdamW(self.net.parameters(), lr=3e-3)
        for _ in range(steps):
            batch = torch.randint(len(images), (128,), generator=generator)
            loss = nn.functional.cross_entropy(self.net.logits(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        self.net.eval().requires_grad_(False)
        self.reference = reference
        self.target_classes = torch.as_tensor(list(target_classes))

    def accuracy(self, images: Tensor, labels: Tensor) -> float:
        """The classifier's accuracy on ``images`` in [−1, 1] (to check it reads digits)."""
        with torch.no_grad():
            return float((self.net.logits(images).argmax(1) == labels).float().mean())

    def __call__(self, samples: Tensor) -> dict[str, float]:
        """``fd``: the Fréchet distance of ``samples`` (in [−1, 1]) to the reference in the classifier's features;
        ``target_share``: the share of samples read as a target digit."""
        from torchmetrics.image.fid import FrechetInceptionDistance

        fid = FrechetInceptionDistance(feature=self.net, normalize=True, input_img_size=(1, 8, 8))
        fid.update((self.reference + 1) / 2, real=True)
        fid.update((samples.clamp(-1, 1) + 1) / 2, real=False)
        with torch.no_grad():
            share = torch.isin(self.net.logits(samples).argmax(1), self.target_classes).float().mean()
        return {"fd": float(fid.compute()), "target_share": float(share)}
