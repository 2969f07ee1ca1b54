"""Where the zoo's parts live: ``zoo.datamodules``, ``zoo.callbacks`` and the confs, in a clone and in a wheel.

The source tree keeps ``datamodules/``, ``callbacks/`` and ``conf/`` at its top (the layout every paper follows). A
wheel ships them inside the package (``zoo/datamodules``, ``zoo/callbacks``, ``zoo/conf``; see ``setup.py``), because
top-level ``callbacks`` and ``datamodules`` would clash with unrelated packages of those names on the index. The code
imports ``zoo.datamodules`` and ``zoo.callbacks`` everywhere; in a clone, where those folders are not inside the
package, an import hook makes ``zoo.datamodules.X`` *the same module object* as the top-level ``datamodules.X`` (not a
second copy: classes compare equal, isinstance holds), so both import paths keep working there.

Hand-written because no library aliases a package to another one: ``importlib`` offers the hooks, not the alias.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["CONF_DIR", "PACKAGE_DIR", "REPO_DIR", "in_clone"]

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
_PARTS = ("datamodules", "callbacks")


def in_clone() -> bool:
    """Whether this zoo runs from a source tree (an editable install or a clone on the path), not from a wheel."""
    return not (PACKAGE_DIR / "datamodules" / "__init__.py").is_file() and (REPO_DIR / "conf").is_dir()


# The confs: inside the package in a wheel, the source tree's conf/ in a clone.
CONF_DIR = PACKAGE_DIR / "conf" if (PACKAGE_DIR / "conf").is_dir() else REPO_DIR / "conf"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # importlib keeps the returned module's own __name__ / __spec__ (it only fills in missing ones)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the target module ran when it was imported


class _AliasFinder(importlib.abc.MetaPathFinder):
    """``zoo.<part>[.sub]`` → ``<part>[.sub]`` for the parts that are not inside the package."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        self.prefixes = {f"zoo.{p}": p for p in parts}

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        for alias, real in self.prefixes.items():
            if fullname == alias or fullname.startswith(alias + "."):
                real_name = real + fullname[len(alias) :]
                if importlib.util.find_spec(real_name) is None:
                    return None
                return importlib.util.spec_from_loader(fullname, _AliasLoader(real_name),
                                                       is_package=fullname == alias)  # fmt: skip
        return None


def _top_level_available(part: str) -> bool:
    # A clone run without an editable install has the repo root on sys.path only when started from it; put it there
    # so that `zoo.datamodules` resolves from anywhere (the clone's own parts, not an unrelated package of that name).
    if (REPO_DIR / part / "__init__.py").is_file():
        if str(REPO_DIR) not in sys.path and importlib.util.find_spec(part) is None:
            sys.path.append(str(REPO_DIR))
        return True
    return False


def install() -> None:
    """Alias the parts that live at the top of a source tree (idempotent)."""
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return
    parts = tuple(p for p in _PARTS if not (PACKAGE_DIR / p / "__init__.py").is_file() and _top_level_available(p))
    if parts:
        sys.meta_path.insert(0, _AliasFinder(parts))
