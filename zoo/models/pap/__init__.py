"""PAP: phase- and amplitude-aware prompting for adversarial robustness (Xu, Zhou, Liu & Wang, ICML 2025).

Work in progress (issue 18): the prompting operator and the training pieces are here and tested; the Lightning
modules, the robust-evaluation callback, the entries and the reproduction are not yet.
"""

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
    "SignSGD",
    "check_unit_range",
    "cw_rand_margin",
    "pap_loss",
    "predict_with_prompts",
    "random_wrong_labels",
    "update_lambda",
]
