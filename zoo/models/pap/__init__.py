"""PAP: phase- and amplitude-aware prompting for adversarial robustness (Xu, Zhou, Liu & Wang, ICML 2025).

Work in progress (issue 18): the prompting operator, the training pieces and the compared prompts (the C-AVP proxy,
a matched-norm random prompt) are here and tested; the Lightning modules, the attacks, the robust-evaluation
callback, the entries and the reproduction are not yet.
"""

from zoo.models.pap.baselines import PixelPrompt, matched_norm_random_prompt
from zoo.models.pap.prompt import PhaseAmplitudePrompt, check_unit_range
from zoo.models.pap.training import (
    SignSGD,
    cw_rand_margin,
    pap_loss,
    predict_with_prompts,
    random_wrong_labels,
    update_lambda,
)

__all__ = [
    "PhaseAmplitudePrompt",
    "PixelPrompt",
    "SignSGD",
    "check_unit_range",
    "cw_rand_margin",
    "matched_norm_random_prompt",
    "pap_loss",
    "predict_with_prompts",
    "random_wrong_labels",
    "update_lambda",
]
