"""Shared test setup."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
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


# The contract tests that run a whole notebook, a quick reproduction, a card's test or a few training steps take
# seconds to minutes each; the rest take milliseconds. Collected last (tests/test_contract.py sorts late), they ended
# up queued on one worker while the other idled for the final ~25 minutes. Collected first, and with setup.cfg's
# --dist worksteal, the workers share them and the short tests fill in at the end.
_LONG = {"test_notebook_executes", "test_reproduce_quick_runs_and_its_claims_hold",
         "test_entry_loads_offline_and_remeasures_card_metrics", "test_entry_conf_fits_a_few_steps",
         "test_installed_wheel_runs_outside_the_clone"}  # fmt: skip


def _long(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)
    return name in _LONG or re.search(r"(^|_)ddp(_|$)", name) is not None  # DDP tests spawn processes (not "ddpm")


# The documentation-site test builds from the notebooks and quick reproductions that the contract tests execute
# (into the session's `docs_cache`), so it runs last and waits for the ones collected in this session.
SITE_TEST = "test_site_builds_and_every_page_loads_in_chromium"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # stable: the long ones first, each group in collection order; the site test after everything
    items.sort(key=lambda item: (getattr(item, "originalname", item.name) == SITE_TEST, not _long(item)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Work stealing that hands out the site test only when no test is left to hand out or steal.

    Dealt out with the rest, the site test would sit at the end of one worker's queue, start as soon as that worker
    ran out, and wait there for the other worker's notebooks, while the waiting worker could not steal any of them.
    """
    if config.getoption("dist", None) != "worksteal":
        return None
    from xdist.scheduler.worksteal import MIN_PENDING, WorkStealingScheduling

    class SiteTestLast(WorkStealingScheduling):
        held: list[int] | None = None

        def check_schedule(self) -> None:
            if self.collection is not None:
                if self.held is None:
                    self.held = [i for i in self.pending if SITE_TEST in self.collection[i]]
                    self.pending[:] = [i for i in self.pending if i not in self.held]
                if self.held and not self.pending and self.steal_requested_from_node is None:
                    queues = [len(p) for node, p in self.node2pending.items() if not node.shutting_down]
                    longest = max(queues, default=0)
                    if min(longest // 2, max(0, longest - MIN_PENDING)) == 0:  # nothing left to steal
                        self.pending.extend(self.held)
                        self.held = []
            super().check_schedule()

    return SiteTestLast(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Record which notebooks and reproductions this session runs (after -k / -m deselection) for the site test."""
    inputs: dict[str, list[str]] = {"notebooks": [], "reproductions": []}
    for item in session.items:
        params, name = getattr(getattr(item, "callspec", None), "params", {}), getattr(item, "originalname", "")
        if name == "test_notebook_executes":
            inputs["notebooks"].append(params["notebook"])
        if name == "test_reproduce_quick_runs_and_its_claims_hold":
            inputs["reproductions"].append(params["function"])
    session.config.zoo_docs_inputs = inputs  # type: ignore[attr-defined]  # read by tests/test_docs.py


@pytest.fixture(scope="session")
def docs_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per session, shared by the pytest-xdist workers: executed notebooks under ``notebooks/``, quick
    reproductions under ``reproduce/<slug>/`` (``zoo.docs``'s cache layout), and ``<name>.failed`` markers."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # workers' basetemps sit in the session's
    path = root / "docs-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def reference():
    """Load a reference fixture: ``reference(slug, name) -> {array name: numpy array}`` from
    ``tests/fixtures/reference/<slug>/<name>.npz``, arrays the official implementation's core functions produced (its
    JSON note beside it names repository, commit, function and command; tests/test_evidence.py checks every note)."""
    import numpy as np

    folder = Path(__file__).resolve().parent / "fixtures" / "reference"

    def load(slug: str, name: str) -> dict:
        path = folder / slug / f"{name}.npz"
        if not path.is_file():
            raise FileNotFoundError(f"No reference fixture {path}: make it with the command in its JSON note.")
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

    return load
