"""PAP's training pieces (card §2.2–§2.4): the loss, the signed-gradient optimiser, the λ update and inference."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zoo.arguments import check_interval, check_range
from zoo.models.pap.prompt import PhaseAmplitudePrompt, check_unit_range

__all__ = [
    "SignSGD",
    "cw_rand_margin",
    "fit_prompt",
    "lambda_counts",
    "lr_drop_milestone",
    "pap_loss",
    "predict_with_prompts",
    "random_wrong_labels",
    "update_lambda",
]


class SignSGD(torch.optim.Optimizer):
    """Signed gradient descent, p ← p − lr·sign(∂L/∂p), the reference script's prompt update (not Adam or SGD).

    torch has no sign-SGD optimiser; this one is an ``Optimizer`` so that Lightning and ``MultiStepLR`` drive it.

    Example:
        >>> p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
        >>> opt = SignSGD([p], lr=0.1)
        >>> (p * torch.tensor([3.0, -0.2, 0.0])).sum().backward()
        >>> opt.step()
        >>> p.data
        tensor([ 0.9000, -1.9000,  0.5000])
    """

    def __init__(self, params, lr: float = 0.1) -> None:
        check_range("lr", lr, 0, low_open=True)
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])
        return loss


def random_wrong_labels(
    labels: torch.Tensor, num_classes: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A uniformly random label y' ≠ y per sample (an offset in 1..K−1, added modulo K).

    >>> y = torch.tensor([0, 1, 2, 2])
    >>> bool((random_wrong_labels(y, 3, torch.Generator().manual_seed(0)) != y).all())
    True
    """
    offset = torch.randint(1, num_classes, labels.shape, generator=generator, device="cpu").to(labels.device)
    return (labels + offset) % num_classes


def cw_rand_margin(
    logits: torch.Tensor, labels: torch.Tensor, wrong: torch.Tensor, margin: float = -0.1
) -> torch.Tensor:
    """L_CW-rand = mean(max(z_{y'} − z_y, margin)) on the logits of x_adv prompted with the wrong class y'.

    >>> z = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    >>> cw_rand_margin(z, torch.tensor([0, 0]), torch.tensor([1, 1]))
    tensor(1.4500)
    """
    z_wrong = logits.gather(1, wrong[:, None]).squeeze(1)
    z_true = logits.gather(1, labels[:, None]).squeeze(1)
    return (z_wrong - z_true).clamp_min(margin).mean()


def pap_loss(
    base: nn.Module,
    prompt: PhaseAmplitudePrompt,
    x: torch.Tensor,
    x_adv: torch.Tensor,
    labels: torch.Tensor,
    exp_l1_weight: float = 5000.0,
    cw_weight: float = 4.0,
    cw_margin: float = -0.1,
    nat_weight: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The card's §2.2 loss, with the true label's prompts on both the adversarial and the natural image:

        CE(f(x̃_adv), y) + w_exp·mean(exp|x̃_adv − x|) + w_cw·L_CW-rand + w_nat·CE(f(x̃_nat), y)

    ``exp_l1_weight`` is 5000 at CIFAR scale; the card's toys scale it by element count (26 for digits, 78.125 for the
    photo patches; its Review notes: with sign updates
    only the balance of the terms matters, so the value is tuned, not derived). Returns the loss and its terms.
    """
    wrong = random_wrong_labels(labels, prompt.num_classes, generator)
    prompted_adv = prompt(x_adv, labels)
    terms = {
        "ce_adv": F.cross_entropy(base(prompted_adv), labels),
        "exp_l1": torch.exp((prompted_adv - x).abs()).mean(),
        "cw_rand": cw_rand_margin(base(prompt(x_adv, wrong)), labels, wrong, cw_margin),
        "ce_nat": F.cross_entropy(base(prompt(x, labels)), labels),
    }
    loss = (
        terms["ce_adv"] + exp_l1_weight * terms["exp_l1"] + cw_weight * terms["cw_rand"] + nat_weight * terms["ce_nat"]
    )
    return loss, terms


def update_lambda(
    lambda_amp: float, correct_amplitude: int, correct_phase: int, clamp: tuple[float, float] | None = (0.1, 10.0)
) -> tuple[float, bool]:
    """λ ← λ·acc_A/acc_Φ (card §2.3; compounding, λ starts at 1), from the counts of correct robust predictions under
    the amplitude-only and the phase-only prompts on the same images. When the phase prompt gets nothing right the
    ratio is undefined and the update is skipped (returned flag False), as the card's Review notes advise; the
    result is clamped to ``clamp`` (the card's documented deviation, [0.1, 10]; ``None`` for the raw update).

    >>> update_lambda(1.0, 60, 40)
    (1.5, True)
    >>> update_lambda(8.0, 60, 20)
    (10.0, True)
    >>> update_lambda(2.0, 5, 0)
    (2.0, False)
    """
    if correct_amplitude < 0 or correct_phase < 0:
        raise ValueError(f"counts must be non-negative, got {correct_amplitude} and {correct_phase}")
    if correct_phase == 0:
        return float(lambda_amp), False
    new = float(lambda_amp) * correct_amplitude / correct_phase
    if clamp is not None:
        new = min(max(new, clamp[0]), clamp[1])
    return new, True


@torch.no_grad()
def lambda_counts(
    base: nn.Module, prompt: PhaseAmplitudePrompt, x_adv: torch.Tensor, labels: torch.Tensor
) -> tuple[int, int]:
    """The numbers of adversarial images the base gets right under the amplitude-only and under the phase-only
    prompt of the true label: acc_A and acc_Φ of λ's update (card §2.3), as counts on the same images."""
    correct_a = int((base(prompt.amplitude_only(x_adv, labels)).argmax(1) == labels).sum())
    correct_p = int((base(prompt.phase_only(x_adv, labels)).argmax(1) == labels).sum())
    return correct_a, correct_p


def predict_with_prompts(base: nn.Module, prompt: PhaseAmplitudePrompt, x: torch.Tensor) -> torch.Tensor:
    """Inference (card §2.4): ŷ₀ = argmax f(x), then the logits f(prompt(x, ŷ₀)).

    The images must have the prompt's shape, be finite and lie in [0, 1], and the base's output width must be the
    prompt's class count: the predicted label picks the prompt.

    >>> from zoo.models.pap.prompt import PhaseAmplitudePrompt
    >>> base = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    >>> predict_with_prompts(base, PhaseAmplitudePrompt(3, (1, 8, 8)), torch.rand(2, 1, 8, 8)).shape
    torch.Size([2, 3])
    >>> predict_with_prompts(base, PhaseAmplitudePrompt(3, (1, 8, 8)), torch.rand(2, 3, 32, 32))
    Traceback (most recent call last):
    ...
    ValueError: expected images of shape (B, 1, 8, 8), got (2, 3, 32, 32)
    """
    shape = tuple(getattr(prompt, "image_shape", x.shape[1:]))
    if x.dim() != 4 or tuple(x.shape[1:]) != shape:  # before the base runs: its error would be a raw conv traceback
        raise ValueError(f"expected images of shape (B, {', '.join(map(str, shape))}), got {tuple(x.shape)}")
    check_unit_range(x)
    logits = base(x)
    if logits.dim() != 2 or logits.shape[1] != prompt.num_classes:
        raise ValueError(
            f"the base classifier outputs {tuple(logits.shape)} but the prompt holds {prompt.num_classes} classes: "
            "PAP needs one prompt pair per class of the base"
        )
    return base(prompt(x, logits.argmax(1)))


def lr_drop_milestone(lr_drop_at: float, epochs: int) -> int:
    """``MultiStepLR``'s milestone: the reference script trains at lr/10 once epoch ≥ 75 of 100 counting from 1, so
    the scheduler (stepped after each epoch) drops after 74 steps.

    >>> lr_drop_milestone(0.75, 100), lr_drop_milestone(0.75, 20), lr_drop_milestone(0.75, 1)
    (74, 14, 1)
    """
    return max(1, round(lr_drop_at * epochs) - 1)


def fit_prompt(
    base: nn.Module,
    prompt: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    attack: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    epochs: int = 20,
    batch_size: int = 128,
    lr: float = 0.3,
    lr_drop_at: float = 0.75,
    exp_l1_weight: float = 26.0,
    cw_weight: float = 4.0,
    cw_margin: float = -0.1,
    nat_weight: float = 1.0,
    lambda_every: int | None = 5,
    lambda_clamp: tuple[float, float] | None = (0.1, 10.0),
    lambda_images: int = 512,
    exemplar_init: bool = True,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train ``prompt`` on the frozen ``base`` with PAP's recipe in a plain loop, the pure-torch twin of
    :class:`~zoo.models.pap.module.PAPModule` for grids of runs (``zoo reproduce pap``).

    Each shuffled batch is attacked on the bare base (``attack(x, y)``, e.g. :func:`zoo.attacks.make_attack`'s PGD), the prompts take
    one signed step on :func:`pap_loss`, the learning rate drops tenfold after ``lr_drop_at`` of the epochs, and every
    ``lambda_every`` epochs λ ← λ·acc_A/acc_Φ on fresh attacks of the first ``lambda_images`` training images
    (``None``: λ stays fixed; prompts without an ``amplitude_only`` part, the pixel prompt, never update it). With
    ``exemplar_init`` the prompts start from the first image of each class of the first shuffled batches that hold
    it. Returns the per-epoch mean loss and λ.
    """
    check_range("epochs", epochs, 1, integer=True)
    check_range("batch_size", batch_size, 1, integer=True)
    check_range("lambda_every", lambda_every, 1, integer=True, optional=True)
    if lambda_clamp is not None:
        check_interval("lambda_clamp", lambda_clamp, low=0)
    base.requires_grad_(False).eval()
    g = torch.Generator().manual_seed(seed)
    opt = SignSGD(prompt.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[lr_drop_milestone(lr_drop_at, epochs)], gamma=0.1)
    order = torch.randperm(len(x), generator=g)
    if exemplar_init:  # the first image of each class in the shuffled order (the reference script's loader)
        prompt.init_from_exemplars(x[order], y[order])
    has_lambda = lambda_every is not None and hasattr(prompt, "amplitude_only")
    sub_x, sub_y = x[order[:lambda_images]], y[order[:lambda_images]]
    history: dict[str, list[float]] = {"loss": [], "lambda": []}
    for epoch in range(1, epochs + 1):
        total, batches = torch.zeros((), device=x.device), 0  # summed on the device: no host sync per step
        for start in range(0, len(x), batch_size):
            rows = order[start : start + batch_size]
            xb, yb = x[rows], y[rows]
            loss, _ = pap_loss(
                base, prompt, xb, attack(xb, yb), yb, exp_l1_weight, cw_weight, cw_margin, nat_weight, generator=g
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, batches = total + loss.detach(), batches + 1
        sched.step()
        if has_lambda and epoch % lambda_every == 0:
            new, _ = update_lambda(float(prompt.lambda_amp), *lambda_counts(base, prompt, attack(sub_x, sub_y), sub_y),
                                   lambda_clamp)  # fmt: skip
            prompt.lambda_amp.fill_(new)
        history["loss"].append(float(total) / max(batches, 1))
        history["lambda"].append(float(getattr(prompt, "lambda_amp", torch.tensor(float("nan")))))
        order = torch.randperm(len(x), generator=g)
    return history
