"""The registry: names, wildcards, close matches, importable class paths, and a torch-free `import zoo`."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zoo
from zoo.registry import ENTRIES, conf_path, get_entry, import_object, list_models

NAMES = ["a-sae", "ra-sae", "topk-sae"]


def _zoo_command() -> list[str]:
    """The installed console script beside this interpreter, else the module entry point."""
    script = Path(sys.executable).with_name("zoo")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "zoo.cli"]


def test_list_models_returns_sorted_names() -> None:
    """Check that list_models returns every entry name, sorted, and that ENTRIES itself is kept sorted."""
    assert list_models() == sorted(list_models())
    assert set(NAMES) <= set(list_models())
    assert [e.name for e in ENTRIES] == sorted(e.name for e in ENTRIES)
    assert zoo.list_models() == list_models()


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [("*sae", NAMES), ("ra-*", ["ra-sae"]), ("topk-*", ["topk-sae"]), ("?-sae", ["a-sae"]), ("no-such*", [])],
)
def test_list_models_filters_by_wildcard(pattern: str, expected: list[str]) -> None:
    """Check that list_models applies a shell-style wildcard and keeps the result sorted."""
    assert list_models(pattern) == expected


def test_get_entry_raises_with_close_matches_when_name_is_misspelt() -> None:
    """Check that a misspelt name raises KeyError naming the unknown name, the close match and `zoo list`."""
    with pytest.raises(KeyError, match="Did you mean 'ra-sae'") as info:
        get_entry("ra-sea")
    message = info.value.args[0]
    assert "Unknown model 'ra-sea'" in message and "zoo list" in message


def test_get_entry_raises_without_suggestion_when_nothing_is_close() -> None:
    """Check that a name with no close match still raises KeyError, without a 'Did you mean'."""
    with pytest.raises(KeyError, match="Unknown model 'resnet50'") as info:
        get_entry("resnet50")
    assert "Did you mean" not in info.value.args[0]


@pytest.mark.parametrize("name", list_models())
def test_entry_class_paths_import_and_conf_exists(name: str) -> None:
    """Check that an entry's module, datamodule and reproduce paths import, and its conf names the same classes."""
    from lightning import LightningDataModule

    from zoo.hub import conf_section
    from zoo.module import ZooModule

    entry = get_entry(name)
    assert issubclass(import_object(entry.module), ZooModule)
    assert issubclass(import_object(entry.datamodule), LightningDataModule)
    if entry.reproduce is not None:
        assert callable(import_object(entry.reproduce))
    assert conf_path(name).is_file()
    assert conf_section(name, "model")["class_path"] == entry.module
    assert conf_section(name, "data")["class_path"] == entry.datamodule


def test_import_object_raises_when_path_is_wrong() -> None:
    """Check that a class path that does not resolve raises ImportError naming the path."""
    with pytest.raises(ImportError, match="Cannot import 'zoo.models.ra_sae.NoSuchSAE'"):
        import_object("zoo.models.ra_sae.NoSuchSAE")
    with pytest.raises(ImportError, match="Cannot import 'zoo.no_such_module.X'"):
        import_object("zoo.no_such_module.X")


def test_import_zoo_does_not_import_torch(tmp_path: Path) -> None:
    """Check that `import zoo` plus list_models() leaves torch (and lightning) unimported, in a fresh interpreter."""
    code = "import sys, zoo; zoo.list_models(); print('torch' in sys.modules, 'lightning' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_zoo_list_command_is_fast(tmp_path: Path) -> None:
    """Check that `zoo list` prints every entry and takes under 0.5 s wall time (median of 3 warm runs)."""
    command = _zoo_command() + ["list"]
    subprocess.run(command, capture_output=True, cwd=tmp_path, timeout=60, check=True)  # warm the file cache
    seconds, outputs = [], []
    for _ in range(3):
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        seconds.append(time.perf_counter() - start)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert all(name in outputs[0] for name in NAMES)
    assert statistics.median(seconds) < 0.5, f"`zoo list` took {seconds} s"
