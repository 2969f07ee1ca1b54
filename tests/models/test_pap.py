"""PAP's prompting operator and training pieces against the card's formulas, worked by hand or with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.models.pap import (
    PhaseAmplitudePrompt,
    SignSGD,
    cw_rand_margin,
    pap_loss,
    predict_with_prompts,
    random_wrong_labels,
    update_lambda,
)


def _prompt(k: int = 3, shape: tuple[int, int, int] = (3, 4, 5), seed: int = 0) -> PhaseAmplitudePrompt:
    g = torch.Generator().manual_seed(seed)
    prompt = PhaseAmplitudePrompt(k, shape, lambda_amp=0.7)
    with torch.no_grad():
        prompt.amplitude.copy_(torch.rand(k, *shape, generator=g))
        prompt.phase.copy_(torch.randn(k, *shape, generator=g))
    return prompt


def test_prompted_image_is_the_cards_formula_with_a_3d_fft_over_c_h_w() -> None:
    prompt = _prompt()
    x = torch.rand(4, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([2, 0, 1, 2])
    X = np.fft.fftn(x.double().numpy(), axes=(1, 2, 3))
    A, phi = np.abs(X), np.angle(X)
    pa, pp = prompt.amplitude.detach().double().numpy()[y], prompt.phase.detach().double().numpy()[y]
    expected = np.fft.ifftn((A + 0.7 * pa) * np.exp(1j * (phi + pp)), axes=(1, 2, 3)).real
    np.testing.assert_allclose(prompt(x, y).detach().numpy(), expected, atol=1e-5)
    # a per-channel 2-D FFT gives another image: the card's operator mixes channels through the spectrum
    per_channel = np.fft.ifft2(
        (np.abs(np.fft.fft2(x.numpy())) + 0.7 * pa) * np.exp(1j * (np.angle(np.fft.fft2(x.numpy())) + pp))
    ).real
    assert np.abs(per_channel - expected).max() > 1e-2


def test_amplitude_only_and_phase_only_prompt_one_part_of_the_spectrum() -> None:
    prompt = _prompt()
    x = torch.rand(2, 3, 4, 5)
    y = torch.tensor([1, 2])
    X = np.fft.fftn(x.double().numpy(), axes=(1, 2, 3))
    A, phi = np.abs(X), np.angle(X)
    pa, pp = prompt.amplitude.detach().double().numpy()[y], prompt.phase.detach().double().numpy()[y]
    amp_only = np.fft.ifftn((A + 0.7 * pa) * np.exp(1j * phi), axes=(1, 2, 3)).real
    phase_only = np.fft.ifftn(A * np.exp(1j * (phi + pp)), axes=(1, 2, 3)).real
    np.testing.assert_allclose(prompt.amplitude_only(x, y).detach().numpy(), amp_only, atol=1e-5)
    np.testing.assert_allclose(prompt.phase_only(x, y).detach().numpy(), phase_only, atol=1e-5)


def test_exemplar_initialisation_takes_the_first_image_of_each_class() -> None:
    prompt = PhaseAmplitudePrompt(3, (1, 8, 8))
    images = torch.rand(5, 1, 8, 8)
    labels = torch.tensor([1, 0, 1, 2, 0])
    prompt.init_from_exemplars(images, labels)
    for k, first in ((0, 1), (1, 0), (2, 3)):
        spectrum = torch.fft.fftn(images[first], dim=(0, 1, 2))
        torch.testing.assert_close(prompt.amplitude[k].detach(), spectrum.abs())
        torch.testing.assert_close(prompt.phase[k].detach(), spectrum.angle())
    # at λ = 1 the exemplar's own spectrum doubles: x̃ = Re IFFT(2A e^{2iΦ}) for x = the exemplar
    own = prompt(images[:1], labels[:1])
    X = torch.fft.fftn(images[0], dim=(0, 1, 2))
    torch.testing.assert_close(
        own[0], torch.fft.ifftn(torch.polar(2 * X.abs(), 2 * X.angle()), dim=(0, 1, 2)).real, atol=1e-5, rtol=1e-5
    )
    with pytest.raises(ValueError, match=r"no exemplar for classes \[2\]"):
        prompt.init_from_exemplars(images[:3], labels[:3])


def test_the_operators_gradients_equal_finite_differences_where_the_prompted_amplitude_is_negative() -> None:
    """The prompted amplitude A + λ·P_A is unconstrained and goes negative in training (a π phase flip). The gradient
    that sign-SGD steps on and that adaptive attacks follow must then still be the derivative of the forward map:
    checked against central finite differences in float64 (torch.polar, used before, flips its sign there)."""
    prompt = PhaseAmplitudePrompt(2, (1, 3, 4)).double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        prompt.amplitude.copy_(torch.randn(2, 1, 3, 4, generator=g, dtype=torch.float64) * 3)  # many entries < -A
        prompt.phase.copy_(torch.randn(2, 1, 3, 4, generator=g, dtype=torch.float64))
    x = torch.rand(3, 1, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 0])
    spectrum = torch.fft.fftn(x.detach(), dim=(1, 2, 3))
    assert bool((spectrum.abs() + prompt.amplitude[labels].detach() < 0).any()), "the case needs negative amplitudes"

    def forward(x, amplitude, phase):  # the module's own forward, as a function of the image and both prompts
        return torch.func.functional_call(prompt, {"amplitude": amplitude, "phase": phase}, (x, labels))

    amplitude = prompt.amplitude.detach().clone().requires_grad_(True)
    phase = prompt.phase.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(forward, (x, amplitude, phase), eps=1e-6, atol=1e-6)


def test_gradients_reach_both_prompts_and_only_the_selected_class() -> None:
    prompt = _prompt()
    x = torch.rand(2, 3, 4, 5)
    prompt(x, torch.tensor([0, 0])).square().sum().backward()
    assert prompt.amplitude.grad[0].abs().sum() > 0 and prompt.phase.grad[0].abs().sum() > 0
    assert prompt.amplitude.grad[1:].abs().sum() == 0 and prompt.phase.grad[1:].abs().sum() == 0


def test_sign_sgd_moves_each_entry_by_lr_against_its_gradient_sign() -> None:
    p = nn.Parameter(torch.tensor([[0.3, -0.1], [2.0, 5.0]]))
    opt = SignSGD([p], lr=0.25)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1], gamma=0.1)
    (p * torch.tensor([[1e-6, -3.0], [0.0, 7.0]])).sum().backward()
    opt.step()
    torch.testing.assert_close(p.data, torch.tensor([[0.05, 0.15], [2.0, 4.75]]))
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)


def test_random_wrong_labels_are_never_the_true_label_and_cover_the_others() -> None:
    y = torch.zeros(3000, dtype=torch.long)
    wrong = random_wrong_labels(y, 4, torch.Generator().manual_seed(0))
    assert (wrong != y).all()
    counts = torch.bincount(wrong, minlength=4)
    assert counts[0] == 0 and (counts[1:] > 900).all()


def test_cw_rand_margin_and_loss_terms_by_hand() -> None:
    z = torch.tensor([[1.0, 4.0, 0.0], [3.0, 0.0, 2.95]])
    assert cw_rand_margin(z, torch.tensor([0, 0]), torch.tensor([1, 2])) == pytest.approx((3.0 + -0.05) / 2)

    base = nn.Sequential(nn.Flatten(), nn.Linear(60, 3)).eval()
    prompt = _prompt()
    x, y = torch.rand(4, 3, 4, 5), torch.tensor([0, 1, 2, 1])
    x_adv = (x + 0.05 * torch.randn_like(x)).clamp(0, 1)
    loss, terms = pap_loss(base, prompt, x, x_adv, y, exp_l1_weight=26.0, generator=torch.Generator().manual_seed(3))
    wrong = random_wrong_labels(y, 3, torch.Generator().manual_seed(3))
    ce = nn.functional.cross_entropy
    expected = {
        "ce_adv": ce(base(prompt(x_adv, y)), y),
        "exp_l1": torch.exp((prompt(x_adv, y) - x).abs()).mean(),
        "cw_rand": cw_rand_margin(base(prompt(x_adv, wrong)), y, wrong),
        "ce_nat": ce(base(prompt(x, y)), y),
    }
    for name, value in expected.items():
        torch.testing.assert_close(terms[name], value)
    torch.testing.assert_close(
        loss, expected["ce_adv"] + 26 * expected["exp_l1"] + 4 * expected["cw_rand"] + expected["ce_nat"]
    )


def test_lambda_update_compounds_clamps_and_skips_an_undefined_ratio() -> None:
    lam = 1.0
    for correct_a, correct_p in ((50, 40), (50, 40), (50, 40)):
        lam, done = update_lambda(lam, correct_a, correct_p)
        assert done
    assert lam == pytest.approx(1.25**3)
    assert update_lambda(0.2, 10, 100) == (0.1, True)
    assert update_lambda(0.2, 10, 100, clamp=None)[0] == pytest.approx(0.02)
    assert update_lambda(3.0, 7, 0) == (3.0, False)
    with pytest.raises(ValueError, match="non-negative"):
        update_lambda(1.0, -1, 3)


def test_prediction_selects_the_prompt_of_the_predicted_label() -> None:
    torch.manual_seed(0)
    base = nn.Sequential(nn.Flatten(), nn.Linear(60, 3)).eval()
    prompt = _prompt()
    x = torch.rand(6, 3, 4, 5)
    got = predict_with_prompts(base, prompt, x)
    torch.testing.assert_close(got, base(prompt(x, base(x).argmax(1))))


def test_bad_inputs_fail_with_one_clear_error_each() -> None:
    prompt = _prompt()
    base = nn.Sequential(nn.Flatten(), nn.Linear(60, 3))
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        predict_with_prompts(base, prompt, torch.rand(2, 3, 4, 5) * 255)
    with pytest.raises(ValueError, match="outputs .* but the prompt holds 3 classes"):
        predict_with_prompts(nn.Sequential(nn.Flatten(), nn.Linear(60, 5)), prompt, torch.rand(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        prompt(torch.rand(2, 3, 4, 5), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="expected images of shape"):
        prompt(torch.rand(2, 1, 4, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="one label per image"):
        prompt(torch.rand(2, 3, 4, 5), torch.tensor([0]))


def test_pixel_prompt_adds_the_selected_class_delta_inside_its_mask_and_clamps() -> None:
    from zoo.models.pap import PixelPrompt

    prompt = PixelPrompt(3, (1, 6, 6), border=1)
    with torch.no_grad():
        prompt.delta.copy_(torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 6, 6) * 0.2)
    x = torch.full((2, 1, 6, 6), 0.5)
    out = prompt(x, torch.tensor([1, 2]))
    assert torch.allclose(out[0, 0, 0], torch.full((6,), 0.7)) and torch.allclose(out[1, 0, 0], torch.full((6,), 0.9))
    assert torch.equal(out[:, :, 1:5, 1:5], x[:, :, 1:5, 1:5])  # the centre is not prompted
    with torch.no_grad():
        prompt.delta.fill_(3.0)
    assert out.max() <= 1 and prompt(x, torch.tensor([0, 0])).max() == 1.0
    with pytest.raises(ValueError, match="border must be"):
        PixelPrompt(3, (1, 6, 6), border=3)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        prompt(x, torch.tensor([0, 5]))


def test_matched_norm_random_prompt_keeps_each_class_norm_and_forgets_the_prompt() -> None:
    from zoo.models.pap import matched_norm_random_prompt

    prompt = _prompt()
    before = {n: p.detach().clone() for n, p in prompt.named_parameters()}
    matched_norm_random_prompt(prompt, torch.Generator().manual_seed(0))
    for name, param in prompt.named_parameters():
        torch.testing.assert_close(param.flatten(1).norm(dim=1), before[name].flatten(1).norm(dim=1))
        cosine = nn.functional.cosine_similarity(param.flatten(1), before[name].flatten(1), dim=1)
        assert cosine.abs().max() < 0.7


def test_pixel_prompt_clamp_passes_the_gradient_straight_through() -> None:
    """A saturated pixel must not block an adaptive attack's gradient (BPDA on the clamp); the value is clamped."""
    from zoo.models.pap import PixelPrompt

    prompt = PixelPrompt(2, (1, 4, 4))
    with torch.no_grad():
        prompt.delta.fill_(2.0)
    x = torch.rand(3, 1, 4, 4, requires_grad=True)
    out = prompt(x, torch.tensor([0, 1, 0]))
    assert torch.equal(out, torch.ones_like(out))
    (out * torch.arange(16.0).view(1, 1, 4, 4)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(16.0).view(1, 1, 4, 4).expand(3, 1, 4, 4))


def test_fit_prompt_starts_from_exemplars_updates_lambda_and_lowers_the_loss() -> None:
    from zoo.models.pap import PixelPrompt, fit_prompt, lambda_counts

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(60, 1, 4, 4, generator=g), torch.arange(60) % 3
    base = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    calls = []

    def attack(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        calls.append(len(xb))
        return (xb + 0.05 * torch.randn(xb.shape, generator=g)).clamp(0, 1)

    prompt = PhaseAmplitudePrompt(3, (1, 4, 4))
    history = fit_prompt(base, prompt, x, y, attack, epochs=4, batch_size=20, lr=0.05, lambda_every=2,
                         lambda_images=30, exemplar_init=True)  # fmt: skip
    assert len(history["loss"]) == len(history["lambda"]) == 4
    assert history["loss"][-1] < history["loss"][0]
    # 3 batches per epoch, and a 30-image attack for each of the two λ updates
    assert calls.count(20) == 12 and calls.count(30) == 2
    assert history["lambda"][0] == 1.0 and 0.1 <= history["lambda"][-1] <= 10
    correct_a, correct_p = lambda_counts(base, prompt, x[:30], y[:30])
    assert 0 <= correct_a <= 30 and 0 <= correct_p <= 30
    for p in base.parameters():
        assert not p.requires_grad
    pixel = PixelPrompt(3, (1, 4, 4))
    pixel_history = fit_prompt(base, pixel, x, y, attack, epochs=2, batch_size=20, lr=0.01, lambda_every=5,
                               exemplar_init=False)  # fmt: skip
    assert pixel.delta.abs().sum() > 0 and all(np.isnan(pixel_history["lambda"]))  # no λ: nothing updated
