"""Contract tests driven by the registry: every entry of ``zoo.list_models()`` gets them by registering.

For each entry: it builds and runs on a batch of its own data, saves and reloads to equal outputs, its conf fits a
few steps through the CLI, its hub entry loads offline and re-measures the card's test metrics, its notebook
executes, and its ``reproduce --quick`` runs with every claim holding for the method and failing for
each of its stand-in arms.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch

import zoo
from zoo import hub
from zoo.claims import verdicts
from zoo.registry import get_entry

ROOT = Path(__file__).resolve().parent.parent
NAMES = zoo.list_models()
# Same machine, same seed: metrics agree to float noise; a looser bound covers other BLAS builds.
CARD_TOLERANCE = 2e-3


def _package_slug(name: str) -> str:
    return get_entry(name).module.split(".")[2].replace("_", "-")


NOTEBOOKS = sorted({f"{_package_slug(n)}.ipynb" for n in NAMES} | {"quickstart.ipynb"})
REPRODUCTIONS = sorted({get_entry(n).reproduce for n in NAMES if get_entry(n).reproduce})


@lru_cache(maxsize=None)
def _batch(name: str) -> torch.Tensor:
    dm = zoo.datamodule(name)
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize("name", NAMES)
def test_entry_creates_and_runs_on_its_data(name: str) -> None:
    """Check that a fresh module runs forward on a batch of its paired DataModule."""
    torch.manual_seed(0)
    model = zoo.create(name)
    batch = _batch(name)
    if hasattr(model, "set_candidates"):  # archetypal dictionaries need their candidate points first
        model.set_candidates(batch[: model.hparams.num_candidates])
    out = model.eval()(batch)
    outputs = out.values() if isinstance(out, dict) else [out]
    assert all(torch.isfinite(o).all() for o in outputs)


@pytest.mark.parametrize("name", NAMES)
def test_entry_save_and_load_give_equal_outputs(name: str, tmp_path: Path) -> None:
    """Check that a hub entry written from a module reloads (eval mode) to identical outputs."""
    model = zoo.load(name)
    batch = _batch(name)
    hub.write_entry(model, tmp_path / name, zoo_meta={"name": name}, card_text=f"# {name}\n")
    again = zoo.load(tmp_path / name)
    assert not again.training
    torch.testing.assert_close(again(batch), model(batch), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_entry_conf_fits_a_few_steps(name: str, tmp_path: Path) -> None:
    """Check that ``zoo fit -c conf/<entry>`` parses and runs a fast_dev_run."""
    from zoo.lightning_cli import ZooCLI

    cli = ZooCLI(
        args=[
            "-c",
            str(hub.conf_path(name)),
            "--trainer.fast_dev_run",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_progress_bar",
            "false",
        ],
        run=False,
    )
    assert type(cli.model).__name__ == get_entry(name).module.rsplit(".", 1)[1]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.state.finished


@pytest.mark.parametrize("name", NAMES)
def test_entry_loads_offline_and_remeasures_card_metrics(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that the bundled entry loads with HF_HUB_OFFLINE=1 and its test metrics match those on its card."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("ZOO_HUB", raising=False)
    from zoo.lightning_cli import ZooCLI

    model = zoo.load(name)
    assert not model.training
    config = hub.read_config(hub.find(name))
    data = config["zoo"]["datamodule"]
    assert data["class_path"] == get_entry(name).datamodule
    # The conf's trainer (its callbacks compute some papers' metrics) with the hub weights, as `zoo test` runs it.
    args = [
        "-c",
        str(hub.conf_path(name)),
        "--pretrained",
        name,
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    ]
    cli = ZooCLI(
        args=args
        + [f"--data.init_args.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in data["init_args"].items()],
        run=False,
    )
    measured = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    recorded = config["zoo"]["metrics"]
    assert recorded, f"{name}: the card records no test metrics"
    for key, value in recorded.items():
        assert measured[key] == pytest.approx(value, abs=CARD_TOLERANCE), f"{name}: {key}"
        assert f"`{key}` | {value:.4f}" in zoo.card(name), f"{name}: the card does not show {key}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_executes(notebook: str, docs_cache: Path) -> None:
    """Check that the notebook runs top to bottom on a fresh kernel, offline; the executed copy goes to the session's
    docs cache, where the documentation-site test reads it."""
    from zoo.docs import execute_notebook

    path = ROOT / "notebooks" / notebook
    dest = docs_cache / "notebooks" / notebook
    try:
        assert path.is_file(), f"missing notebook {path}"
        execute_notebook(path, dest)
    except BaseException:
        dest.with_name(f"{notebook}.failed").touch()  # the site test stops waiting for it
        raise


@pytest.mark.parametrize("function", REPRODUCTIONS)
def test_reproduce_quick_runs_and_its_claims_hold(function: str, docs_cache: Path) -> None:
    """Check that ``zoo reproduce --quick`` runs and writes its JSON, plot and claims table, and, from that one run,
    that every claim holds for the method and fails for each of its stand-in arms, and every sanity check passes."""
    from zoo.docs import run_quick_reproduction

    out = docs_cache / "reproduce" / function.split(".")[2].replace("_", "-")
    try:
        results = run_quick_reproduction(function, out)
    except BaseException:
        out.with_name(f"{out.name}.failed").touch()
        raise
    written = list(out.glob("*.json"))
    assert written and list(out.glob("*.png")) and list(out.glob("*.claims.md"))
    assert json.loads(written[0].read_text()) == pytest.approx(results, nan_ok=True)
    assert any(k.startswith(("claims/", "reported/")) for k in results), "a reproduction must state a claim"
    failed = verdicts(results)
    assert not failed["no_stand_in"], f"claims without a stand-in arm: {failed['no_stand_in']}"
    assert not failed["stand_ins_passed"], f"stand-ins that pass a claim (the claim shows nothing): {failed}"
    assert not failed["claims"], f"claims that did not hold for the method: {failed['claims']}"
    assert not failed["checks"], f"sanity checks that failed: {failed['checks']}"
