"""The wheel a user installs from an index: built from this tree, installed with pip into a folder of its own, used
from a folder outside the clone (the README's Python example, ``zoo fit -c ra-sae``, ``zoo conf``, ``zoo publish``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_python_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The wheel built with pip (no build isolation: the index may be out of reach) and installed into ``site``."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, cwd=tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(tmp / "site"), str(wheel)], check=True, cwd=tmp)
    # The wheel's zoo must win over this environment's editable install of the clone (and no clone on the path).
    env = {**os.environ, "PYTHONPATH": str(tmp / "site"), "ZOO_HUB": ""}
    return tmp, env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_installed_wheel_runs_outside_the_clone(installed: tuple[Path, dict[str, str]]) -> None:
    tmp, env = installed
    (wheel,) = (tmp / "dist").glob("*.whl")
    assert wheel.name.startswith("icml25_zoo-")  # a distribution name that is free on the index
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"zoo", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                                                + ".dist-info"}  # fmt: skip
    confs = {n[len("zoo/conf/") :] for n in names if n.startswith("zoo/conf/")}
    assert confs == {str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")} and confs
    assert "zoo/datamodules/shapes.py" in names and "zoo/callbacks/images.py" in names

    work = tmp / "elsewhere"
    work.mkdir()
    where = _run(["-c", "import zoo, sys; print(zoo.__file__); print('datamodules' in sys.modules)"], work, env)
    assert where.returncode == 0, where.stderr
    assert where.stdout.splitlines()[0].startswith(str(tmp / "site")), where.stdout

    example = _readme_python_example().replace("max_epochs=5", "max_epochs=1")
    example += "\nimport sys\nassert type(dm).__module__.startswith('zoo.datamodules.'), type(dm).__module__\n"
    example += "assert 'datamodules' not in sys.modules and 'callbacks' not in sys.modules\n"
    result = _run(["-c", example], work, env)
    assert result.returncode == 0, result.stderr[-3000:]

    fit = _run(["-m", "zoo.cli", "fit", "-c", "ra-sae", "--trainer.max_epochs", "1"], work, env)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (work / "runs" / "ra-sae").is_dir()

    conf = _run(["-m", "zoo.cli", "conf", "ra-sae"], work, env)
    assert conf.returncode == 0 and conf.stdout == (ROOT / "conf" / "ra-sae.yaml").read_text()

    publish = _run(["-m", "zoo.cli", "publish", "ra-sae"], work, env)
    assert publish.returncode != 0 and "--dest DIR" in publish.stderr, publish.stderr[-2000:]
    site = tmp / "site" / "zoo" / "pretrained"
    assert sorted(p.name for p in site.iterdir()) == sorted(p.name for p in (ROOT / "zoo" / "pretrained").iterdir())
