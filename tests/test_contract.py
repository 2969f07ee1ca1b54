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
    if hasattr(model, "fit_views"):  # clustering models fit the batch first (their forward labels fitted clusters)
        model.fit_views(batch[0])
    if hasattr(model, "fit_scaler"):  # imputers that refuse an unset scaler take the batch's raw min and max
        model.fit_scaler(batch[-1])
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
    slug = out.name
    written = out / f"{slug}.json"
    assert written.is_file() and (out / f"{slug}.png").is_file() and (out / f"{slug}.claims.md").is_file()
    assert json.loads((out / f"{slug}.meta.json").read_text())["quick"] is True
    assert json.loads(written.read_text()) == pytest.approx(results, nan_ok=True)
    assert any(k.startswith(("claims/", "reported/")) for k in results), "a reproduction must state a claim"
    failed = verdicts(results)
    assert not failed["no_stand_in"], f"claims without a stand-in arm: {failed['no_stand_in']}"
    assert not failed["stand_ins_passed"], f"stand-ins that pass a claim (the claim shows nothing): {failed}"
    assert not failed["claims"], f"claims that did not hold for the method: {failed['claims']}"
    assert not failed["checks"], f"sanity checks that failed: {failed['checks']}"
    if slug not in PENDING:  # at the evidence standard: the task check ran, the verdict table was written
        assert any(k.startswith("checks/task_needs_the_method") for k in results), "no task_needs_the_method check"
        assert any(k.startswith("headlines/") for k in results) and (out / f"{slug}.verdict.md").is_file()


# Papers whose reproduction is not yet at the evidence standard (issue "The evidence standard"; one issue per paper).
# Their pages say "evidence standard: pending". A paper leaves this set when its issue lands; it never re-enters.
PENDING = {
    "backtrack-sampling", "c3", "cludi", "e2e-wm", "pan-sr", "prodiff",
    "reward-refine", "segment-anyword", "tcp-diffusion", "tsm", "zilot",
}  # fmt: skip
PAPERS = sorted({_package_slug(n) for n in NAMES if get_entry(n).reproduce})


def test_pending_names_only_papers_with_a_reproduction() -> None:
    """Check that the pending set names real papers (a typo would exempt nothing and hide nothing)."""
    assert PENDING <= set(PAPERS), sorted(PENDING - set(PAPERS))


@pytest.mark.parametrize("slug", PAPERS)
def test_reproduction_meets_the_evidence_standard(slug: str) -> None:
    """Check, for a paper at the evidence standard, that every claim names its stand-ins by kind (or says why a kind
    is empty), a task check runs the non-learned heuristics beside the method, its headlines name claims that exist,
    its full run is recorded and still matches the code's claims and bounds, every headline that does not reproduce
    carries a diagnosis, and every model card of the paper opens with the recorded verdict; for a pending paper, that
    its page says so."""
    from zoo.claims import TaskCheck
    from zoo.evidence import PENDING as PENDING_NOTE
    from zoo.evidence import at_standard, load_record, recorded_verdict, reproduction_module
    from zoo.publish import verdict_block

    if slug in PENDING:
        assert not at_standard(slug), f"{slug} defines HEADLINES: take it out of PENDING"
        assert recorded_verdict(slug) == PENDING_NOTE
        return
    module = reproduction_module(slug)
    claims, checks, headlines = module.CLAIMS, module.CHECKS, module.HEADLINES
    assert headlines, f"{slug}: no HEADLINES"
    unclassified = [c.name for c in claims if not c.classified]
    assert not unclassified, f"{slug}: claims without stand-ins by kind: {unclassified}"
    assert any(isinstance(c, TaskCheck) for c in checks), f"{slug}: no TaskCheck (the task needs the method)"
    record = load_record(slug)
    assert record is not None, f"{slug}: no recorded full run (zoo reproduce {slug} --out docs/reproductions/{slug})"
    results, meta = record
    assert meta["quick"] is False, f"{slug}: the recorded run is a quick one"
    for c in [*claims, *checks]:
        for side in ("at_least", "at_most"):
            recorded, now = results.get(f"bounds/{c.name}/{side}"), getattr(c, side)
            assert recorded == (None if now is None else pytest.approx(now)), f"{slug}: {c.name} {side} changed"
    for c in claims:
        assert f"{c.prefix}/{c.name}" in results, f"{slug}: the record has no verdict for {c.name}: re-record"
    for h in headlines:
        assert f"headlines/{h.name}" in results, f"{slug}: the record has no verdict for headline {h.name}"
    verdict = recorded_verdict(slug)
    assert "no diagnosis yet" not in verdict, f"{slug}: a headline that does not reproduce has no diagnosis"
    for name in [n for n in NAMES if _package_slug(n) == slug]:
        assert verdict_block(name).strip() in zoo.card(name), (
            f"{name}: its card's verdict differs from the recorded run: zoo publish {name} --verdict-only"
        )
