"""ECL: ANN-to-SNN conversion with error compensation learning (Liu et al., ICML 2025)."""

from zoo.models.snn_ecl.activation import ClipQuantActivation, floor_ste
from zoo.models.snn_ecl.backbones import BACKBONES, build_backbone
from zoo.models.snn_ecl.convert import SpikingNetwork, activation_percentiles, convert, naive_convert
from zoo.models.snn_ecl.module import ECLClassifier
from zoo.models.snn_ecl.neuron import DualThresholdIFNeuron

__all__ = [
    "BACKBONES",
    "ClipQuantActivation",
    "DualThresholdIFNeuron",
    "ECLClassifier",
    "SpikingNetwork",
    "activation_percentiles",
    "build_backbone",
    "convert",
    "floor_ste",
    "naive_convert",
]
