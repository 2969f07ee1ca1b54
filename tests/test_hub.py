"""The hub: offline loading, checksums, search order, clear errors, and atomic entry writes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

import zoo
import zoo.hub
from zoo.models.ra_sae import RASAE
from zoo.registry import import_object

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_user_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without ZOO_HUB, so only the locations it sets are searched."""
    monkeypatch.delenv("ZOO_HUB", raising=False)


def _copy_entry(name: str, hub: Path) -> Path:
    """Copy the bundled entry ``name`` to ``hub/name`` and return the copy."""
    return Path(shutil.copytree(zoo.hub.BUNDLED / name, hub / name))


def _small_model(seed: int = 0) -> RASAE:
    torch.manual_seed(seed)
    model = RASAE(dim=8, num_atoms=16, top_k=2, num_candidates=16)
    model.set_candidates(torch.randn(16, 8))
    with torch.no_grad():  # move away from the init, so a reload that ignored the weights would show
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def test_load_returns_eval_module_when_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that zoo.load('ra-sae') gives an RASAE in eval mode with HF_HUB_OFFLINE=1 and ZOO_HUB unset."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = zoo.load("ra-sae")
    assert isinstance(model, RASAE)
    assert not model.training and not any(m.training for m in model.modules())
    assert bool(model.candidates_ready)
    codes = model(torch.randn(4, model.hparams.dim, generator=torch.Generator().manual_seed(0)))
    assert codes.shape == (4, model.hparams.num_atoms) and torch.isfinite(codes).all()


def test_load_raises_checksum_error_when_weights_are_tampered(tmp_path: Path) -> None:
    """Check that a flipped byte in model.safetensors is refused with ChecksumError naming the file."""
    folder = _copy_entry("ra-sae", tmp_path / "hub")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # inside the tensor data: the file still parses, only the checksum can tell
    weights.write_bytes(bytes(data))
    with pytest.raises(zoo.hub.ChecksumError, match="ra-sae/model.safetensors"):
        zoo.load("ra-sae", hub=str(tmp_path / "hub"))


def test_find_prefers_zoo_hub_over_bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that an entry under ZOO_HUB is found before the bundled one, and loads from there."""
    copy = _copy_entry("ra-sae", tmp_path / "user-hub")
    monkeypatch.setenv("ZOO_HUB", str(tmp_path / "user-hub"))
    assert zoo.hub.find("ra-sae") == copy
    assert zoo.hub.find("a-sae") == zoo.hub.BUNDLED / "a-sae"  # absent from ZOO_HUB: falls through


def test_find_prefers_hub_argument_over_zoo_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that the hub= argument is searched before ZOO_HUB, and several folders are split on os.pathsep."""
    _copy_entry("ra-sae", tmp_path / "env-hub")
    first = _copy_entry("ra-sae", tmp_path / "arg-hub")
    monkeypatch.setenv("ZOO_HUB", str(tmp_path / "env-hub"))
    assert zoo.hub.find("ra-sae", hub=str(tmp_path / "arg-hub")) == first
    both = os.pathsep.join([str(tmp_path / "empty"), str(tmp_path / "arg-hub")])
    assert zoo.hub.find("ra-sae", hub=both) == first


def test_load_raises_with_close_matches_when_name_is_unknown() -> None:
    """Check that an unknown name raises KeyError with the close matches."""
    with pytest.raises(KeyError, match="Did you mean 'ra-sae'"):
        zoo.load("ra-sea")


def test_load_raises_when_folder_has_no_config(tmp_path: Path) -> None:
    """Check that a folder without config.json is refused with FileNotFoundError (huggingface_hub only warns)."""
    folder = tmp_path / "no-config"
    folder.mkdir()
    shutil.copy(zoo.hub.BUNDLED / "ra-sae" / "model.safetensors", folder)
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        zoo.load(folder)


def test_load_raises_when_config_records_no_checksums(tmp_path: Path) -> None:
    """Check that a config.json without its 'zoo' section is refused: the weights cannot be verified."""
    folder = _copy_entry("ra-sae", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["zoo"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="records no checksums"):
        zoo.load(folder)


def test_load_raises_when_config_is_corrupt(tmp_path: Path) -> None:
    """Check that a config.json that is not JSON raises ValueError saying it is corrupt."""
    folder = _copy_entry("ra-sae", tmp_path)
    (folder / "config.json").write_text('{"dim": 32, "zoo": {')
    with pytest.raises(ValueError, match="corrupt"):
        zoo.load(folder)


def test_load_raises_when_weights_do_not_fit_overrides(tmp_path: Path) -> None:
    """Check that an override changing parameter shapes gives ValueError saying the weights do not fit."""
    folder = _copy_entry("ra-sae", tmp_path)
    with pytest.raises(ValueError, match="do not fit RASAE"):
        zoo.load(folder, num_atoms=32)


def test_write_entry_round_trips_outputs_config_and_card(tmp_path: Path) -> None:
    """Check that write_entry then zoo.load gives identical outputs, with init args, sha256 and our card on disk."""
    model = _small_model()
    dest = zoo.hub.write_entry(
        model, tmp_path / "e", zoo_meta={"name": "tiny", "metrics": {"test/r2": 0.5}}, card_text="# card"
    )
    loaded = zoo.load(tmp_path / "e")
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(loaded.reconstruct(x), model.reconstruct(x), rtol=0, atol=0)
    config = json.loads((dest / "config.json").read_text())
    assert {k: config[k] for k in ("dim", "num_atoms", "top_k", "num_candidates")} == {
        "dim": 8,
        "num_atoms": 16,
        "top_k": 2,
        "num_candidates": 16,
    }
    assert config["zoo"]["sha256"] == {"model.safetensors": zoo.hub.sha256(dest / "model.safetensors")}
    assert config["zoo"]["name"] == "tiny" and config["zoo"]["metrics"] == {"test/r2": 0.5}
    assert (dest / "README.md").read_text() == "# card"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_write_entry_leaves_nothing_when_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that a write failing midway leaves neither the entry nor a temporary folder behind."""

    def fail(path: Path, chunk: int = 0) -> str:
        raise RuntimeError("disk full")

    monkeypatch.setattr(zoo.hub, "sha256", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        zoo.hub.write_entry(_small_model(), tmp_path / "e", zoo_meta={}, card_text="# card")
    assert list(tmp_path.iterdir()) == []


def test_write_entry_keeps_old_entry_when_overwrite_is_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check that a failed overwrite keeps the previous entry intact and loadable, with no temporary folders."""
    old = _small_model(seed=0)
    dest = zoo.hub.write_entry(old, tmp_path / "e", zoo_meta={}, card_text="# old")
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    def fail(self: RASAE, save_directory: Path) -> None:
        (Path(save_directory) / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed while saving")

    with monkeypatch.context() as patch:
        patch.setattr(RASAE, "_save_pretrained", fail)
        with pytest.raises(RuntimeError, match="killed while saving"):
            zoo.hub.write_entry(_small_model(seed=1), dest, zoo_meta={}, card_text="# new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(zoo.load(dest)(x), old(x), rtol=0, atol=0)


def test_card_holds_test_metrics() -> None:
    """Check that the bundled ra-sae card reports its test metrics, test/r2 among them."""
    text = zoo.card("ra-sae")
    assert "Test metrics" in text and "test/r2" in text


def test_find_falls_back_to_bundled_when_hf_location_is_offline(tmp_path: Path) -> None:
    """Check that with HF_HUB_OFFLINE=1 an `hf:ORG` location in ZOO_HUB is skipped and the bundled entry is found.

    A fresh interpreter: huggingface_hub reads HF_HUB_OFFLINE once, at import.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ZOO_HUB": "hf:some-org", "HF_HOME": str(tmp_path / "hf")}
    code = "import zoo.hub; print(zoo.hub.find('ra-sae'))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == zoo.hub.BUNDLED / "ra-sae"


def test_locations_keeps_hf_namespace_whole() -> None:
    """Check that an `hf:ORG` location survives the os.pathsep split as one location."""
    assert zoo.hub.locations("hf:some-org") == ["hf:some-org", str(zoo.hub.BUNDLED)]


def test_find_resolves_hf_namespace_when_given_hf_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check that `hf:ORG` asks the Hub for repo ORG/<name> and returns its snapshot folder."""
    snapshot = _copy_entry("ra-sae", tmp_path / "snapshot")
    asked: list[str] = []

    def fake_snapshot(repo_id: str, **kwargs: object) -> Path:
        asked.append(repo_id)
        return snapshot

    monkeypatch.setattr(zoo.hub, "_hf_snapshot", fake_snapshot)
    assert zoo.hub.find("ra-sae", hub="hf:some-org") == snapshot
    assert asked == ["some-org/ra-sae"]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`zoo.publish.publish("ra-sae")` for three steps into a temporary hub (never the bundled folder)."""
    from zoo.publish import publish

    root = tmp_path_factory.mktemp("publish")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["zoo"])  # LightningCLI warns when pytest's own argv is there too
        dest = publish(
            "ra-sae",
            dest=root / "hub" / "ra-sae",
            max_epochs=1,
            extra_args=[
                "--trainer.limit_train_batches",
                "3",
                "--trainer.limit_val_batches",
                "0",
                "--trainer.limit_test_batches",
                "2",
                "--trainer.logger",
                "false",
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.enable_model_summary",
                "false",
                "--trainer.default_root_dir",
                str(root / "run"),
            ],
        )
    yield dest


def test_publish_writes_entry_that_loads_with_its_metrics_and_data(published: Path) -> None:
    """Check that publish writes a loadable entry with its test metrics (also in the card) and its datamodule."""
    assert sorted(p.name for p in published.parent.iterdir()) == ["ra-sae"]
    assert zoo.hub.find("ra-sae", hub=str(published.parent)) == published
    model = zoo.load("ra-sae", hub=str(published.parent))
    assert isinstance(model, RASAE) and not model.training and bool(model.candidates_ready)
    meta = json.loads((published / "config.json").read_text())["zoo"]
    metrics = meta["metrics"]
    assert set(metrics) == {"test/r2", "test/l0", "test/dead_fraction", "test/loss"}
    assert all(math.isfinite(v) for v in metrics.values())
    assert f"| `test/r2` | {metrics['test/r2']:.4f} |" in (published / "README.md").read_text()
    data = meta["datamodule"]
    dm = import_object(data["class_path"])(**data["init_args"])
    assert dm.hparams.n_samples == 20000 and dm.hparams.center is True


def test_publish_card_lists_only_init_arguments(published: Path) -> None:
    """Check that the card's 'Init arguments' list holds the model's init arguments, not LightningCLI's private keys."""
    card = (published / "README.md").read_text()
    assert "- `num_atoms`: `64`" in card
    assert "_class_path" not in card and "_instantiator" not in card


def test_loaded_sae_rejects_activations_of_the_wrong_width() -> None:
    """Check that a hub SAE given activations of another width says both shapes and which setting to change."""
    model = zoo.load("ra-sae")
    with pytest.raises(ValueError, match=r"activations of shape \(N, 32\), got \(4, 64\)\. Set model\.dim"):
        model(torch.randn(4, 64))


def _entry_naming(tmp_path: Path, module: str, **extra: object) -> Path:
    """A copy of the bundled ra-sae entry whose config.json names ``module`` (and has ``extra`` keys)."""
    folder = _copy_entry("ra-sae", tmp_path / "hub")
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["zoo"]["module"] = module
    config.update(extra)
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "module",
    [
        "os.system",  # a callable that would run a shell command
        "zoo_probe_entry.Payload",  # a class of some other importable module (the probe below)
        "zoo.module.ImageClassifier",  # a ZooModule subclass that no entry registers
        "builtins.eval",
    ],
)
def test_load_refuses_a_config_naming_an_unregistered_class_before_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """Check that a folder whose config names any class but a registered entry's is refused, and nothing imported."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "zoo_probe_entry.py").write_text(
        "import os\nos.environ['ZOO_PROBE_IMPORTED'] = '1'\n\nclass Payload:\n"
        "    @classmethod\n    def from_pretrained(cls, *a, **k):\n        os.environ['ZOO_PROBE_CALLED'] = '1'\n"
    )
    monkeypatch.syspath_prepend(str(probe))
    monkeypatch.delenv("ZOO_PROBE_IMPORTED", raising=False)
    folder = _entry_naming(tmp_path, module)
    with pytest.raises(zoo.hub.UntrustedEntryError, match="no zoo entry registers") as err:
        zoo.load(folder)
    assert "zoo.models.ra_sae.RASAE" in str(err.value)  # the message lists what can be loaded
    assert "zoo_probe_entry" not in sys.modules and "ZOO_PROBE_IMPORTED" not in os.environ


def test_load_refuses_a_named_entry_whose_config_names_another_registered_class(tmp_path: Path) -> None:
    """Check that entry 'ra-sae' found in a hub folder must hold an RASAE, not another entry's class."""
    _entry_naming(tmp_path, "zoo.models.sead.SEAD")
    with pytest.raises(zoo.hub.UntrustedEntryError, match="entry 'ra-sae' is a zoo.models.ra_sae.RASAE"):
        zoo.load("ra-sae", hub=str(tmp_path / "hub"))


def test_load_accepts_the_defining_file_path_of_a_registered_class(tmp_path: Path) -> None:
    """Check that 'zoo.models.ra_sae.module.RASAE' (the class's own module) still loads the registered RASAE."""
    assert isinstance(zoo.load(_entry_naming(tmp_path, "zoo.models.ra_sae.module.RASAE")), RASAE)
    assert zoo.hub.class_path(RASAE) == "zoo.models.ra_sae.RASAE"


def test_load_refuses_config_keys_that_are_not_init_arguments(tmp_path: Path) -> None:
    """Check that an unknown config key is refused with a close match, not silently dropped by huggingface_hub."""
    folder = _entry_naming(tmp_path, "zoo.models.ra_sae.RASAE", num_atom=3, payload="x")
    with pytest.raises(zoo.hub.UntrustedEntryError, match=r"'num_atom' \(did you mean 'num_atoms'\?\), 'payload'"):
        zoo.load(folder)
    with pytest.raises(zoo.hub.UntrustedEntryError, match="not init arguments of RASAE"):
        RASAE.from_pretrained(str(folder))  # the class's own from_pretrained checks too
