"""Shared test setup."""

from __future__ import annotations

import sys
from typing import Iterator

import pytest


@pytest.fixture(autouse=True)
def _shell_argv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run LightningCLI as from a shell: it warns when pytest's own argv sits beside the args it is given."""
    monkeypatch.setattr(sys, "argv", ["zoo"])
    yield
