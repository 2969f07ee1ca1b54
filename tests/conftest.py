"""Shared test setup."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, give each worker its share of the cores: torch's default (every core per process)
    oversubscribes the machine and its threads spin against each other. Subprocesses (the CLI, notebook kernels,
    DDP ranks) inherit the share through OMP_NUM_THREADS."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)


@pytest.fixture(autouse=True)
def _shell_argv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run LightningCLI as from a shell: it warns when pytest's own argv sits beside the args it is given."""
    monkeypatch.setattr(sys, "argv", ["zoo"])
    yield
