"""End-to-end logits-perturbation LLM watermark (Wong, Zhou, Zhou and Si, ICML 2025)."""

from zoo.models.e2e_wm.lm import GRULM, SynLangLM, load_generator
from zoo.models.e2e_wm.metrics import detection_metrics
from zoo.models.e2e_wm.mgda import mgda_two_task
from zoo.models.e2e_wm.module import E2EWatermark
from zoo.models.e2e_wm.nets import PerturbationEncoder, WatermarkDecoder
from zoo.models.e2e_wm.watermarks import (
    E2ELogitsProcessor,
    EXPWatermark,
    KGWWatermark,
    UnigramWatermark,
)

__all__ = [
    "GRULM",
    "E2ELogitsProcessor",
    "E2EWatermark",
    "EXPWatermark",
    "KGWWatermark",
    "PerturbationEncoder",
    "SynLangLM",
    "UnigramWatermark",
    "WatermarkDecoder",
    "detection_metrics",
    "load_generator",
    "mgda_two_task",
]
