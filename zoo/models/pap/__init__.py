"""PAP: phase- and amplitude-aware prompting for adversarial robustness (Xu, Zhou, Liu & Wang, ICML 2025).

* :class:`PhaseAmplitudePrompt`: the prompting operator (card §2.1), :mod:`~zoo.models.pap.training` its loss, the
  sign-SGD optimiser, the λ update and the predicted-label inference;
* :class:`AdversarialClassifier` (the ``pap-base`` entry) and :class:`PAPModule` (``pap``), the Lightning modules;
* :class:`PromptedPipeline`, the defended classifier as one module for adaptive attacks;
* :class:`PixelPrompt` (the C-AVP proxy) and :func:`matched_norm_random_prompt`, the compared prompts.
"""

from zoo.models.pap.attacks import ExpectationOverPrompts, PromptedPipeline
from zoo.models.pap.baselines import (
    InputTransformDefence,
    PixelPrompt,
    SpectrumPrompt,
    matched_norm_random_prompt,
)
from zoo.models.pap.module import AdversarialClassifier, PAPModule, build_base_net
from zoo.models.pap.prompt import PhaseAmplitudePrompt, check_unit_range
from zoo.models.pap.training import (
    SignSGD,
    cw_rand_margin,
    fit_prompt,
    lambda_counts,
    pap_loss,
    predict_with_prompts,
    random_wrong_labels,
    update_lambda,
)

__all__ = [
    "AdversarialClassifier",
    "ExpectationOverPrompts",
    "InputTransformDefence",
    "PAPModule",
    "PhaseAmplitudePrompt",
    "PixelPrompt",
    "PromptedPipeline",
    "SignSGD",
    "SpectrumPrompt",
    "build_base_net",
    "check_unit_range",
    "cw_rand_margin",
    "fit_prompt",
    "lambda_counts",
    "matched_norm_random_prompt",
    "pap_loss",
    "predict_with_prompts",
    "random_wrong_labels",
    "update_lambda",
]
