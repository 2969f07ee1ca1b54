"""The zoo's entries: one record per loadable name, strings only.

Nothing here imports torch, so ``import zoo`` and ``zoo list`` stay fast. Class paths are imported only
when an entry is created, loaded or trained.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Entry", "Paper", "ENTRIES", "get_entry", "list_models", "import_object", "conf_path", "CONF_DIR"]

# conf/ sits beside the packages in the source tree (the zoo is installed editable, `pip install -e .`).
from zoo._layout import CONF_DIR  # noqa: E402  (inside the package in a wheel, conf/ in a clone)


@dataclass(frozen=True)
class Paper:
    """Where an entry comes from: title, venue and official code."""

    title: str
    venue: str = "ICML 2025"
    code: str | None = None
    arxiv: str | None = None


@dataclass(frozen=True)
class Entry:
    """One loadable name of the zoo.

    Args:
        name: the slug users type (``zoo.load("ra-sae")``).
        module: dotted path of the LightningModule class.
        datamodule: dotted path of the paired LightningDataModule class.
        conf: file name under ``conf/`` that trains this entry (its ``model.init_args`` make the variant).
        paper: the paper the entry implements.
        summary: one line for ``zoo list``.
        reproduce: dotted path of the ``run(quick, out)`` function behind ``zoo reproduce``, if any.
        tags: free-form labels for filtering.
    """

    name: str
    module: str
    datamodule: str
    conf: str
    paper: Paper
    summary: str
    reproduce: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def slug_package(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class _Family:
    """What the entries of one paper share: class, DataModule, paper, reproduction and tags."""

    module: str
    datamodule: str
    paper: Paper
    reproduce: str | None = None
    tags: tuple[str, ...] = ()

    def entry(self, name: str, summary: str, *tags: str) -> Entry:
        # A variant is the same class with another conf: conf/<name>.yaml.
        return Entry(
            name=name,
            module=self.module,
            datamodule=self.datamodule,
            conf=f"{name}.yaml",
            paper=self.paper,
            summary=summary,
            reproduce=self.reproduce,
            tags=(*self.tags, *tags),
        )


_SAE = _Family(
    module="zoo.models.ra_sae.RASAE",
    datamodule="zoo.datamodules.activations.ActivationsDataModule",
    paper=Paper(
        "Archetypal SAE: Adaptive and Stable Dictionary Learning for Concept Extraction in Large Vision Models",
        code="https://github.com/KempnerInstitute/overcomplete",
        arxiv="2502.12892",
    ),
    reproduce="zoo.models.ra_sae.reproduce.run",
    tags=("sae", "interpretability"),
)
_CLUDI = _Family(
    module="zoo.models.cludi.CLUDIModule",
    datamodule="zoo.datamodules.features.FeatureClusteringDataModule",
    paper=Paper(
        "Clustering via Self-Supervised Diffusion", code="https://github.com/BGU-CS-VIL/CLUDI", arxiv="2507.04283"
    ),
    reproduce="zoo.models.cludi.reproduce.run",
    tags=("clustering", "diffusion"),
)
_CV_WINRATE = _Family(
    module="zoo.models.cv_winrate.PairwiseRewardModel",
    datamodule="zoo.datamodules.preferences.PreferenceDataModule",
    paper=Paper(
        "Accelerating Unbiased LLM Evaluation via Synthetic Feedback",
        code="https://github.com/Zanette-Labs/control_variates_evaluation",
        arxiv="2502.10563",
    ),
    reproduce="zoo.models.cv_winrate.reproduce.run",
    tags=("evaluation", "reward-model"),
)

_SEAD = _Family(
    module="zoo.models.sead.SEAD",
    datamodule="zoo.datamodules.streams.StreamDataModule",
    paper=Paper("SEAD: Unsupervised Ensemble of Streaming Anomaly Detectors"),
    reproduce="zoo.models.sead.reproduce.run",
    tags=("anomaly-detection", "streaming"),
)

_DUAL = _Family(
    module="zoo.models.dual.DualClassifier",
    datamodule="zoo.models.dual.data.PrunableImageDataModule",
    paper=Paper(
        "Lightweight Dataset Pruning without Full Training via Example Difficulty and Prediction Uncertainty",
        code="https://github.com/behaapyy/dual-pruning",
        arxiv="2502.06905",
    ),
    reproduce="zoo.models.dual.reproduce.run",
    tags=("dataset-pruning", "classification"),
)
_EFM_PAPER = Paper(
    "Field Matching: an Electrostatic Paradigm to Generate and Transfer Data",
    code="https://github.com/justkolesov/FieldMatching",
    arxiv="2502.02367",
)
_EFM = _Family(
    module="zoo.models.efm.EFM",
    datamodule="zoo.datamodules.pairs.ToyPairDataModule",
    paper=_EFM_PAPER,
    reproduce="zoo.models.efm.reproduce.run",
    tags=("transport", "generative"),
)
_EFM_IMAGES = _Family(
    module="zoo.models.efm.EFM",
    datamodule="zoo.datamodules.pairs.ImagePairDataModule",
    paper=_EFM_PAPER,
    tags=("transport", "generative", "images"),
)
_BACKTRACK_PAPER = Paper(
    "On the Query Complexity of Verifier-Assisted Language Generation",
    code="https://github.com/YuchenLi01/LM_Query_Complexity",
    arxiv="2502.12123",
)
_BACKTRACK = _Family(
    module="zoo.models.backtrack_sampling.DyckLM",
    datamodule="zoo.datamodules.grammar.DyckDataModule",
    paper=_BACKTRACK_PAPER,
    reproduce="zoo.models.backtrack_sampling.reproduce.run",
    tags=("language-model", "sampling", "verifier"),
)
_BACKTRACK_PROBE = _Family(
    module="zoo.models.backtrack_sampling.VerifierProbe",
    datamodule="zoo.models.backtrack_sampling.probe_data.PrefixErrorDataModule",
    paper=_BACKTRACK_PAPER,
    tags=("verifier", "probe"),
)
_TSM_PAPER = Paper(
    "TimeStep Master: Asymmetrical Mixture of Timestep LoRA Experts for Versatile and Efficient Diffusion Models in "
    "Vision",
    arxiv="2503.07416",
)
_TSM = _Family(
    module="zoo.models.tsm.TSMDiffusion",
    datamodule="zoo.datamodules.domains.DomainShiftDataModule",
    paper=_TSM_PAPER,
    reproduce="zoo.models.tsm.reproduce.run",
    tags=("diffusion", "lora", "domain-adaptation"),
)
_SNN_ECL = _Family(
    module="zoo.models.snn_ecl.ECLClassifier",
    datamodule="zoo.datamodules.images.ImageDataModule",
    paper=Paper("Efficient ANN-SNN Conversion with Error Compensation Learning", arxiv="2506.01968"),
    reproduce="zoo.models.snn_ecl.reproduce.run",
    tags=("spiking", "conversion", "classification"),
)
_PAP = _Family(
    module="zoo.models.pap.PAPModule",
    datamodule="zoo.datamodules.images.ImageDataModule",
    paper=Paper("Phase and Amplitude-aware Prompting for Enhancing Adversarial Robustness"),
    reproduce="zoo.models.pap.reproduce.run",
    tags=("adversarial-robustness", "prompting", "classification"),
)
_PAP_BASE = _Family(
    module="zoo.models.pap.AdversarialClassifier",
    datamodule="zoo.datamodules.images.ImageDataModule",
    paper=_PAP.paper,
    reproduce=_PAP.reproduce,
    tags=("adversarial-robustness", "classification"),
)
_RCSC = _Family(
    module="zoo.models.rcsc.RCSCModule",
    datamodule="zoo.datamodules.multiview.MultiViewDataModule",
    paper=Paper("Robust Consensus Anchor Learning for Efficient Multi-view Subspace Clustering"),
    reproduce="zoo.models.rcsc.reproduce.run",
    tags=("clustering", "multi-view", "anchor-graph"),
)

_E2E_PAPER = Paper(
    "An End-to-End Model for Logits-Based Large Language Models Watermarking",
    code="https://github.com/KAHIMWONG/E2E_LLM_WM",
    arxiv="2505.02344",
)
_E2E = _Family(
    module="zoo.models.e2e_wm.E2EWatermark",
    datamodule="zoo.datamodules.synlang.SynLangDataModule",
    paper=_E2E_PAPER,
    reproduce="zoo.models.e2e_wm.reproduce.run",
    tags=("language-model", "watermark"),
)
_E2E_LM = _Family(
    module="zoo.models.e2e_wm.SynLangLM",
    datamodule="zoo.datamodules.synlang.SynLangDataModule",
    paper=_E2E_PAPER,
    tags=("language-model",),
)
_RERD = _Family(
    module="zoo.models.reward_refine.MaskedDiffusion",
    datamodule="zoo.datamodules.dna.MarkovDNADataModule",
    paper=Paper(
        "Reward-Guided Iterative Refinement in Diffusion Models at Test-Time with Applications to Protein and DNA "
        "Design",
        code="https://github.com/masa-ue/ProDifEvo-Refinement",
        arxiv="2502.14944",
    ),
    reproduce="zoo.models.reward_refine.reproduce.run",
    tags=("diffusion", "discrete-diffusion", "sampling", "design"),
)
_PRODIFF = _Family(
    module="zoo.models.prodiff.ProDiff",
    datamodule="zoo.datamodules.trajectories.TrajectoryDataModule",
    paper=Paper(
        "ProDiff: Prototype-Guided Diffusion for Minimal Information Trajectory Imputation",
        code="https://github.com/b010001y/ProDiff",
        arxiv="2505.23048",
    ),
    reproduce="zoo.models.prodiff.reproduce.run",
    tags=("diffusion", "trajectories", "imputation"),
)

_ZILOT = _Family(
    module="zoo.models.zilot.Zilot",
    datamodule="zoo.datamodules.offline_goals.OfflineGoalDataModule",
    paper=Paper(
        "Zero-Shot Offline Imitation Learning via Optimal Transport",
        code="https://github.com/martius-lab/zilot",
        arxiv="2410.08751",
    ),
    reproduce="zoo.models.zilot.reproduce.run",
    tags=("imitation", "optimal-transport", "planning", "offline-rl"),
)

_PAN_SR = _Family(
    module="zoo.models.pan_sr.PanSR",
    datamodule="zoo.datamodules.symbolic.SymbolicDataModule",
    paper=Paper(
        "Ab Initio Nonparametric Variable Selection for Scalable Symbolic Regression with Large p",
        code="https://github.com/mattsheng/Scalable_SR",
        arxiv="2410.13681",
    ),
    reproduce="zoo.models.pan_sr.reproduce.run",
    tags=("symbolic-regression", "variable-selection", "bart"),
)

_TCP_DIFFUSION = _Family(
    module="zoo.models.tcp_diffusion.TCPDiffusion",
    datamodule="zoo.datamodules.cyclone.CycloneDataModule",
    paper=Paper(
        "TCP-Diffusion: A Multi-modal Diffusion Model for Global Tropical Cyclone Precipitation Forecasting with "
        "Change Awareness",
        code="https://github.com/xiaochengfuhuo/TCP-Diffusion",
        arxiv="2410.13175",
    ),
    reproduce="zoo.models.tcp_diffusion.reproduce.run",
    tags=("diffusion", "weather", "forecasting", "precipitation"),
)

_C3 = _Family(
    module="zoo.models.c3.C3Classifier",
    datamodule="zoo.datamodules.multimodal.MultiModalDataModule",
    paper=Paper(
        "Towards the Causal Complete Cause of Multi-Modal Representation Learning",
        code="https://github.com/WangJingyao07/Multi-Modal-Base",
        arxiv="2407.14058",
    ),
    reproduce="zoo.models.c3.reproduce.run",
    tags=("multi-modal", "causality", "regularizer"),
)

_SEGMENT_ANYWORD = _Family(
    module="zoo.models.segment_anyword.SegmentAnyword",
    datamodule="zoo.datamodules.shapes.CaptionedShapesDataModule",
    paper=Paper(
        "Segment Anyword: Mask Prompt Inversion for Open-Set Grounded Segmentation",
        code="https://github.com/ZhihuaLiuEd/Segment-Anyword",
        arxiv="2505.17994",
    ),
    reproduce="zoo.models.segment_anyword.reproduce.run",
    tags=("segmentation", "diffusion", "cross-attention", "training-free"),
)

# Sorted by name.
ENTRIES: tuple[Entry, ...] = (
    _SAE.entry("a-sae", "Archetypal SAE: TopK SAE whose atoms are convex combinations of k-means candidate points."),
    _BACKTRACK.entry(
        "backtrack-sampling",
        "Tiny Dyck-2 transformer LM with verifier-assisted samplers (tokenwise rejection with backtracking).",
    ),
    _BACKTRACK_PROBE.entry(
        "backtrack-sampling-probe",
        "Learned verifier: a probe on the backtrack-sampling LM's hidden state that flags prefixes gone wrong.",
    ),
    _C3.entry(
        "c3",
        "Multi-modal host classifier trained with C³R: counterfactual necessity, IV and intervention terms (reconstruction).",
    ),
    _C3.entry("c3-baseline", "The same multi-modal host classifier trained plainly (CE only): C³R's baseline.", "baseline"),
    _CLUDI.entry(
        "cludi",
        "Clusters features by diffusion over cluster-assignment embeddings with a self-distilling teacher (digits).",
    ),
    _CV_WINRATE.entry(
        "cv-winrate", "Fine-tuned reward model whose synthetic preferences make control-variates win rates cheap."
    ),
    _CV_WINRATE.entry(
        "cv-winrate-offshelf",
        "Off-the-shelf (shifted-population) reward model for control-variates evaluation.",
        "baseline",
    ),
    _DUAL.entry(
        "dual",
        "Digits classifier trained on the half of the data kept by DUAL + Beta sampling (scores from 30 of 200 epochs).",
    ),
    _E2E.entry(
        "e2e-wm",
        "Learned LLM watermark: a context encoder's ±δ top-k logit perturbation and an LSTM detector, end to end.",
    ),
    _E2E_LM.entry(
        "e2e-wm-lm",
        "The frozen tiny GRU LM on SynLang (24 meaning classes × 4 synonyms) that e2e-wm watermarks.",
    ),
    _EFM.entry(
        "efm",
        "Electrostatic Field Matching: transports a 2-D Gaussian to a two-mode mixture along learned field lines.",
    ),
    _EFM_IMAGES.entry(
        "efm-digits", "Electrostatic Field Matching generator: noise -> 8x8 digits along a UNet field's lines."
    ),
    _PAN_SR.entry(
        "pan-sr",
        "PAN+SR: a BART variable screen (20 replicates, rank clustering) then gplearn SR on Feynman I.14.3 with p = 153.",
    ),
    _PAP.entry(
        "pap",
        "Class-wise amplitude and phase prompts in the 3-D Fourier domain on the frozen pap-base photo-patch CNN.",
    ),
    _PAP_BASE.entry(
        "pap-base", "PGD adversarially trained CNN on 8x8 RGB photo patches (eps 8/255, 5 steps): the frozen base of pap.", "base-model"
    ),
    _PRODIFF.entry(
        "prodiff",
        "Trajectory imputation from two endpoints: a 1-D diffusion UNet guided by learned prototypes (street grid).",
    ),
    _SAE.entry("ra-sae", "Relaxed archetypal SAE: atoms stay within delta of the (scaled) convex hull of the data."),
    _RCSC.entry(
        "rcsc",
        "Multi-view anchor-graph clustering with consensus anchors, learned view weights and a one-pass partition.",
    ),
    _RERD.entry(
        "reward-refine",
        "Masked discrete diffusion on synthetic DNA, designed at test time by reward-guided iterative refinement.",
    ),
    _SEAD.entry(
        "sead", "Streaming ensemble of anomaly detectors: multiplicative weights with share over normalised scores."
    ),
    _SEGMENT_ANYWORD.entry(
        "segment-anyword",
        "A toy text-to-image UNet2DConditionModel and the training-free Segment Anyword pipeline over its attention.",
    ),
    _SNN_ECL.entry(
        "snn-ecl",
        "Digits CNN with learned clip-floor thresholds that converts to a dual-threshold spiking network at T = 2-4.",
    ),
    _TCP_DIFFUSION.entry(
        "tcp-diffusion",
        "TCP-Diffusion: 12 h cyclone rain by diffusion over adjacent residuals with environment, scalar and NWP encoders.",
    ),
    _SAE.entry(
        "topk-sae",
        "Baseline TopK SAE with a free, row-normalised dictionary (the archetypal SAE's comparison).",
        "baseline",
    ),
    _TSM.entry(
        "tsm",
        "Digits diffusion UNet adapted to inverted digits 5-9 by LoRA timestep experts at 3 scales with a learned router.",
    ),
    _TSM.entry(
        "tsm-source",
        "The source-domain diffusion UNet (digits 0-4) that the tsm entry adapts; mode pretrain.",
        "base-model",
    ),
    _ZILOT.entry(
        "zilot",
        "Zero-shot imitation of a goal sequence: iCEM matching occupancies by Sinkhorn under a learned value (Dubins car).",
    ),
)

_BY_NAME = {entry.name: entry for entry in ENTRIES}


def get_entry(name: str) -> Entry:
    """Return the entry called ``name``.

    Raises:
        KeyError: the name is unknown; the message lists close matches.

    Example:
        >>> get_entry("ra-sae").module
        'zoo.models.ra_sae.RASAE'
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(_unknown_message(name)) from None


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(name, list(_BY_NAME), n=3, cutoff=0.5)
    if close:
        quoted = [f"'{c}'" for c in close]
        hint = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
        hint = f" Did you mean {hint}?"
    else:
        hint = ""
    return f"Unknown model '{name}'.{hint} Run `zoo list` to see every entry."


def list_models(pattern: str | None = None) -> list[str]:
    """Names of all entries, sorted, optionally filtered by a shell-style wildcard.

    Example:
        >>> list_models("*sae")
        ['a-sae', 'ra-sae', 'topk-sae']
    """
    names = sorted(_BY_NAME)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def import_object(path: str) -> Any:
    """Import ``package.module.Name`` and return ``Name``.

    Class paths written before the parts moved under ``zoo`` (``datamodules.X``, ``callbacks.X``, as older hub entries
    store them) resolve to ``zoo.datamodules.X`` / ``zoo.callbacks.X`` where the top-level names are not installed.
    """
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        if path.split(".", 1)[0] in ("datamodules", "callbacks"):
            try:
                return import_object(f"zoo.{path}")
            except ImportError:
                pass
        raise ImportError(f"Cannot import '{path}': {err}") from err


def conf_path(name: str) -> Path:
    """The Lightning CLI config that trains entry ``name``.

    Raises:
        FileNotFoundError: the conf is not there (a broken install: the wheel ships every conf in ``zoo/conf``).
    """
    path = CONF_DIR / get_entry(name).conf
    if not path.is_file():
        raise FileNotFoundError(
            f"No config at {path}: this install of the zoo lacks its confs (a clone keeps them in conf/, a wheel in "
            "zoo/conf/); reinstall it, or pass your own conf file with -c."
        )
    return path
