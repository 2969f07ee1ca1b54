"""zoo: a PyTorch Lightning model zoo of ICML 2025 papers.

>>> import zoo
>>> zoo.list_models("ra-*")
['ra-sae']

``load``, ``create`` and ``datamodule`` import torch only when called, so ``import zoo`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zoo import _layout

_layout.install()  # zoo.datamodules / zoo.callbacks in a clone (see zoo/_layout.py); before anything imports them

from zoo.registry import list_models  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from lightning import LightningDataModule, LightningModule

__all__ = ["list_models", "load", "create", "datamodule", "card", "ZooModule"]
__version__ = "0.1.0"


def load(name: str, hub: str | None = None, **overrides: Any) -> "LightningModule":
    """Load the pretrained entry ``name`` (or a hub folder path) in eval mode, offline.

    Args:
        name: an entry of ``zoo.list_models()``, or the path of a hub entry folder.
        hub: where to look first: a folder of entries, or ``hf:ORG``; several separated by ``os.pathsep``.
        overrides: init arguments that replace the stored ones (for example ``map_location="cuda"``).

    Raises:
        KeyError: unknown name (with close matches).
        zoo.hub.ChecksumError: a weight file does not match the sha256 recorded in ``config.json``.
    """
    from zoo import hub as _hub

    return _hub.load(name, hub=hub, **overrides)


def create(name: str, **init_args: Any) -> "LightningModule":
    """A freshly initialised (untrained) module for ``name``, with the init args of its conf plus ``init_args``."""
    from zoo import hub as _hub

    return _hub.create(name, **init_args)


def datamodule(name: str, **overrides: Any) -> "LightningDataModule":
    """The DataModule that ``name`` trains on, configured as in its conf (embedded default data) plus overrides."""
    from zoo import hub as _hub

    return _hub.datamodule(name, **overrides)


def card(name: str, hub: str | None = None) -> str:
    """The model card (README.md) of the published entry ``name``."""
    from zoo import hub as _hub

    return _hub.card(name, hub=hub)


def __getattr__(attr: str) -> Any:
    if attr == "ZooModule":
        from zoo.module import ZooModule

        return ZooModule
    if attr == "hub":
        import importlib

        return importlib.import_module("zoo.hub")
    raise AttributeError(f"module 'zoo' has no attribute '{attr}'")
