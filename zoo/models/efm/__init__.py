"""EFM: Electrostatic Field Matching, to generate and transfer data (Kolesov et al., ICML 2025)."""

from zoo.models.efm.field import FieldTarget, coulomb_field, lift, plate_sums
from zoo.models.efm.module import EFM
from zoo.models.efm.networks import MLPFieldNet, UNetFieldNet, build_field_net
from zoo.models.efm.ode import Transport, transport
from zoo.models.efm.samplers import PlatePointSampler

__all__ = [
    "EFM",
    "FieldTarget",
    "MLPFieldNet",
    "PlatePointSampler",
    "Transport",
    "UNetFieldNet",
    "build_field_net",
    "coulomb_field",
    "lift",
    "plate_sums",
    "transport",
]
