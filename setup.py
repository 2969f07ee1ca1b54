"""Build hook: a wheel carries ``datamodules/``, ``callbacks/`` and ``conf/`` inside the ``zoo`` package.

The source tree keeps them at its top (every paper's layout). Installed as top-level packages, ``callbacks`` and
``datamodules`` would clash with unrelated distributions of those names, and ``conf/`` would not be installed at all;
so a non-editable build moves the two packages to ``zoo/datamodules`` and ``zoo/callbacks`` and copies the confs to
``zoo/conf``. ``zoo/_layout.py`` finds them in either place. Editable installs (``pip install -e .``) keep the tree
as it is. Everything else is in ``setup.cfg``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent


class build_py(_build_py):
    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        if not editable:  # start from an empty build/lib: a module deleted from the tree must not linger in a wheel
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        if editable:
            return
        package = Path(self.build_lib) / "zoo"
        for part in ("datamodules", "callbacks"):
            built = Path(self.build_lib) / part
            if built.is_dir():
                shutil.rmtree(package / part, ignore_errors=True)
                shutil.move(str(built), str(package / part))
        confs = package / "conf"
        for path in sorted((HERE / "conf").rglob("*.yaml")):  # with conf/logger/ and any other sub-folder
            target = confs / path.relative_to(HERE / "conf")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


setup(cmdclass={"build_py": build_py})
