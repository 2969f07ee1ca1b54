"""The `zoo` command: Lightning CLI fit/test with --pretrained, the zoo's own list/info, NaN stop, DDP on CPU."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from safetensors.torch import load_file

import zoo
from zoo.cli import main
from zoo.datamodules.activations import ActivationsDataModule
from zoo.hub import BUNDLED
from zoo.lightning_cli import ZooCLI
from zoo.models.ra_sae import RASAE
from zoo.registry import conf_path

ROOT = Path(__file__).resolve().parents[1]
CONF = str(conf_path("ra-sae"))
# A few steps, one validation; train/loss logged every step so it reaches metrics.csv.
FAST = [
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "3",
    "--trainer.limit_val_batches",
    "2",
    "--trainer.check_val_every_n_epoch",
    "1",
    "--trainer.log_every_n_steps",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]
VAL_KEYS = {"val/r2", "val/l0", "val/dead_fraction", "val/loss", "train/loss"}


def _dirs(root: Path) -> list[str]:
    return ["--trainer.default_root_dir", str(root / "run"), "--trainer.logger.init_args.save_dir", str(root / "logs")]


def _read_metrics(root: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of the single metrics.csv the CSVLogger wrote under ``root``."""
    (path,) = sorted((root / "logs").rglob("metrics.csv"))
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _last(rows: list[dict[str, str]], key: str) -> float:
    return float([row[key] for row in rows if row.get(key)][-1])


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`zoo fit -c conf/ra-sae.yaml` for three steps, in-process (shared by the fit and DDP tests)."""
    root = tmp_path_factory.mktemp("single")
    main(["fit", "-c", CONF, *FAST, *_dirs(root)])
    return root


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """The same fit under `--trainer.strategy ddp --trainer.devices 2` on CPU (gloo), as a user runs it."""
    root = tmp_path_factory.mktemp("ddp")
    script = Path(sys.executable).with_name("zoo")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "zoo.cli"]
    command += [
        "fit",
        "-c",
        CONF,
        *FAST,
        "--trainer.limit_train_batches",
        "4",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
        *_dirs(root),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300)
    return result, root


def test_fit_logs_validation_metrics_to_csv(single_run: Path) -> None:
    """Check that `zoo fit -c conf/ra-sae.yaml` for a few steps completes and its CSV log holds val/r2."""
    header, rows = _read_metrics(single_run)
    assert VAL_KEYS <= set(header)
    assert math.isfinite(_last(rows, "val/r2"))
    assert list((single_run / "logs").rglob("*.ckpt")), "the conf's ModelCheckpoint wrote no checkpoint"


def test_test_with_pretrained_reproduces_card_metric(tmp_path: Path) -> None:
    """Check that `zoo test --pretrained ra-sae` on the full test split measures the test/r2 recorded in the entry."""
    main(["test", "-c", CONF, "--pretrained", "ra-sae", "--trainer.enable_progress_bar", "false", *_dirs(tmp_path)])
    _, rows = _read_metrics(tmp_path)
    recorded = json.loads((BUNDLED / "ra-sae" / "config.json").read_text())["zoo"]["metrics"]
    assert _last(rows, "test/r2") == pytest.approx(recorded["test/r2"], abs=1e-4)


def test_fit_with_pretrained_starts_from_hub_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that --pretrained loads the hub weights exactly, keeps its candidates (no k-means), then fine-tunes."""

    def no_kmeans(self: ActivationsDataModule, *args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("candidate points were recomputed for a pretrained model")

    monkeypatch.setattr(ActivationsDataModule, "candidate_points", no_kmeans)
    cli = ZooCLI(args=["-c", CONF, "--pretrained", "ra-sae", *FAST, *_dirs(tmp_path)], run=False)
    hub_weights = load_file(str(BUNDLED / "ra-sae" / "model.safetensors"))
    state = cli.model.state_dict()
    assert set(state) == set(hub_weights)
    for key, value in hub_weights.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
    assert bool(cli.model.candidates_ready)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 3
    tuned = cli.model.state_dict()
    torch.testing.assert_close(tuned["sae.dictionary.C"], hub_weights["sae.dictionary.C"], rtol=0, atol=0)
    assert not torch.equal(tuned["sae.encoder.linear.weight"], hub_weights["sae.encoder.linear.weight"])


def test_fit_raises_when_pretrained_name_is_unknown(tmp_path: Path) -> None:
    """Check that --pretrained with an unknown name fails before training, saying 'Unknown model'."""
    with pytest.raises((SystemExit, KeyError), match="Unknown model 'no-such'"):
        main(["fit", "-c", CONF, "--pretrained", "no-such", *FAST, *_dirs(tmp_path)])
    assert not (tmp_path / "logs").exists()


def test_fit_exits_when_conf_value_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Check that a value outside a Literal (model.dictionary=bogus) is refused by the parser."""
    with pytest.raises(SystemExit) as info:
        main(["fit", "-c", CONF, "--model.init_args.dictionary", "bogus", *_dirs(tmp_path)])
    assert info.value.code != 0
    assert "Got value: bogus" in capsys.readouterr().err


def test_list_prints_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """Check that `zoo list` prints the three entry names with their summaries."""
    main(["list"])
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert {"a-sae", "ra-sae", "topk-sae"} <= set(lines)
    assert "Relaxed archetypal SAE" in lines["ra-sae"]


def test_info_prints_card(capsys: pytest.CaptureFixture[str]) -> None:
    """Check that `zoo info ra-sae` prints the entry's model card."""
    main(["info", "ra-sae"])
    out = capsys.readouterr().out
    assert zoo.card("ra-sae") in out
    assert "module: zoo.models.ra_sae.RASAE" in out


def test_info_exits_with_close_matches_when_name_is_misspelt() -> None:
    """Check that `zoo info ra-sea` exits with a message suggesting 'ra-sae'."""
    with pytest.raises(SystemExit, match="zoo info: Unknown model 'ra-sea'. Did you mean 'ra-sae'"):
        main(["info", "ra-sea"])


def test_fit_stops_with_step_number_when_loss_is_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that a NaN training loss stops Trainer.fit with FloatingPointError naming the step and the remedy."""
    torch.manual_seed(0)
    dm = ActivationsDataModule(n_samples=1000, batch_size=64, center=True)
    model = RASAE(dim=32, num_atoms=16, top_k=3, num_candidates=16)
    training_step = model.training_step
    seen: list[int] = []

    def nan_at_third_step(batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        seen.append(batch_idx)
        loss = training_step(batch, batch_idx)
        return torch.tensor(float("nan"), requires_grad=True) if batch_idx == 2 else loss

    monkeypatch.setattr(model, "training_step", nan_at_third_step)
    trainer = Trainer(
        max_epochs=1,
        limit_train_batches=6,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(FloatingPointError, match=r"Loss became nan at step 2 \(epoch 0\)\. Lower model\.lr"):
        trainer.fit(model, datamodule=dm)
    assert seen == [0, 1, 2]
    # Stopped before backward: no NaN reached the weights.
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fit_refuses_corrupt_checkpoint_with_one_clear_message(tmp_path: Path) -> None:
    """Check that --ckpt_path pointing at a corrupt file exits with one line naming the file, before any training."""
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match=r"zoo fit: .*bad\.ckpt is not a readable checkpoint"):
        main(["fit", "-c", CONF, "--ckpt_path", str(bad), *FAST, *_dirs(tmp_path)])
    assert not (tmp_path / "logs").exists()


def test_fit_under_ddp_logs_same_metrics_as_single_process(ddp_run: tuple, single_run: Path) -> None:
    """Check that a 2-process CPU DDP fit writes metrics.csv with the same metric names as a 1-process fit."""
    result, root = ddp_run
    assert "MEMBER: 2/2" in result.stdout + result.stderr, "the run did not start two processes"
    header, rows = _read_metrics(root)
    single_header, _ = _read_metrics(single_run)
    assert VAL_KEYS <= set(header), result.stderr[-3000:]
    assert set(header) == set(single_header)
    assert math.isfinite(_last(rows, "val/r2"))


def test_fit_under_ddp_exits_cleanly(ddp_run: tuple) -> None:
    """Check that the 2-process CPU DDP `zoo fit` returns exit code 0."""
    result, _ = ddp_run
    assert result.returncode == 0, result.stderr[-3000:]


def test_test_under_ddp_measures_the_same_values_as_one_process(tmp_path: Path) -> None:
    """Check that `zoo test --pretrained ra-sae` on 2 DDP processes gives the card's one-process test metrics: the
    torchmetrics states are synchronised across processes, not averaged per process or taken from rank 0."""
    script = Path(sys.executable).with_name("zoo")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "zoo.cli"]
    command += ["test", "-c", CONF, "--pretrained", "ra-sae", "--trainer.enable_progress_bar", "false"]
    command += ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu", *_dirs(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    _, rows = _read_metrics(tmp_path)
    recorded = json.loads((BUNDLED / "ra-sae" / "config.json").read_text())["zoo"]["metrics"]
    assert recorded
    for key, value in recorded.items():
        assert _last(rows, key) == pytest.approx(value, abs=1e-4), key


def test_config_names_resolve_to_installed_confs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.cli import _resolve_confs
    from zoo.registry import CONF_DIR

    monkeypatch.chdir(tmp_path)  # no conf/ here: only the installed set can answer
    argv = ["fit", "-c", "ra-sae", "--config", "logger/wandb", "--config=topk-sae", "-c", "mine.yaml", "--x", "ra-sae"]
    wandb = str(CONF_DIR / "logger/wandb.yaml")
    topk = f"--config={conf_path('topk-sae')}"
    assert _resolve_confs(argv) == ["fit", "-c", str(conf_path("ra-sae")), "--config", wandb, topk, "-c", "mine.yaml",
                                    "--x", "ra-sae"]  # fmt: skip
    (tmp_path / "ra-sae").write_text("trainer: {}\n")  # a file of that name is the user's, and wins
    assert _resolve_confs(["fit", "-c", "ra-sae"]) == ["fit", "-c", "ra-sae"]


def test_conf_prints_the_entry_conf(capsys: pytest.CaptureFixture[str]) -> None:
    main(["conf", "ra-sae"])
    assert capsys.readouterr().out == conf_path("ra-sae").read_text()
    with pytest.raises(SystemExit, match="ra-sae"):
        main(["conf", "ra-sea"])  # close matches in the one-line message
