"""The repository's dependency rule, checked on the source: data and callbacks never import a paper package.

``zoo/models/<pkg>`` may use ``datamodules/`` and ``callbacks/``; the reverse would make the shared data and callbacks
depend on one paper (ARCHITECTURE.md, "Dependencies point one way"). Imports inside functions count too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = sorted(p for folder in ("datamodules", "callbacks") for p in (ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", SHARED, ids=[str(p.relative_to(ROOT)) for p in SHARED])
def test_shared_code_imports_no_paper_package(path: Path) -> None:
    """Check that a file of datamodules/ or callbacks/ imports nothing from zoo.models."""
    bad = [name for name in _imports(path) if name == "zoo.models" or name.startswith("zoo.models.")]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: move what both sides need below zoo/models"


def test_zoo_parts_are_the_top_level_modules_in_a_clone() -> None:
    """``zoo.datamodules.X`` and ``datamodules.X`` are one module object in a source tree (zoo/_layout.py), so classes
    compare equal whichever spelling imported them; a wheel ships only the ``zoo.`` spelling (tests/test_packaging)."""
    import importlib

    import zoo
    from zoo import _layout

    assert _layout.in_clone()
    for part, sub in (("datamodules", "shapes"), ("callbacks", "images")):
        assert importlib.import_module(f"zoo.{part}.{sub}") is importlib.import_module(f"{part}.{sub}")
        assert importlib.import_module(f"zoo.{part}") is importlib.import_module(part)
    assert zoo.registry.import_object("zoo.datamodules.shapes.CaptionedShapesDataModule") is zoo.registry.import_object(
        "zoo.datamodules.shapes.CaptionedShapesDataModule")  # fmt: skip
    with pytest.raises(ImportError, match="Cannot import"):
        zoo.registry.import_object("zoo.datamodules.nothing_here.X")


def test_the_code_imports_datamodules_and_callbacks_through_zoo() -> None:
    """Inside the zoo the shared parts are imported as ``zoo.datamodules`` / ``zoo.callbacks``: the top-level names
    do not exist in a wheel (they would clash with unrelated distributions on the index)."""
    files = [p for folder in ("zoo", "datamodules", "callbacks") for p in (ROOT / folder).rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)}: {name}" for p in files for name in _imports(p)
           if name.split(".")[0] in ("datamodules", "callbacks")]  # fmt: skip
    assert not bad, bad


def test_the_docs_import_datamodules_and_callbacks_through_zoo() -> None:
    """The README's and the papers' pages' code runs for wheel users too: no top-level datamodules / callbacks."""
    pattern = re.compile(r"(?:from|import)\s+(?:datamodules|callbacks)\b")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in pattern.finditer(p.read_text())]
    assert not bad, bad
