"""The card's synthetic views live with the DataModule (``datamodules.multiview``); re-exported here."""

from datamodules.multiview import synthetic_views

__all__ = ["synthetic_views"]
