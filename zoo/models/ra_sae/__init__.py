"""Archetypal SAE (A-SAE) and Relaxed Archetypal SAE (RA-SAE), Fel et al., ICML 2025."""

from zoo.models.ra_sae.dictionary import FreeDictionary, RelaxedArchetypalDictionary
from zoo.models.ra_sae.encoder import BatchTopKEncoder, JumpReLUEncoder, ReLUEncoder, TopKEncoder
from zoo.models.ra_sae.module import RASAE
from zoo.models.ra_sae.sae import SparseAutoencoder, sae_loss

__all__ = [
    "RASAE",
    "BatchTopKEncoder",
    "FreeDictionary",
    "JumpReLUEncoder",
    "ReLUEncoder",
    "RelaxedArchetypalDictionary",
    "SparseAutoencoder",
    "TopKEncoder",
    "sae_loss",
]
