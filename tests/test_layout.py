"""The repository's dependency rule, checked on the source: data and callbacks never import a paper package.

``zoo/models/<pkg>`` may use ``datamodules/`` and ``callbacks/``; the reverse would make the shared data and callbacks
depend on one paper (ARCHITECTURE.md, "Dependencies point one way"). Imports inside functions count too.
"""

from __future__ import annotations

import ast
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
