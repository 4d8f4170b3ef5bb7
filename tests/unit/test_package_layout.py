"""The checkout's folders map onto ``shoal.*`` and none of them shadows Python's own modules.

pyproject.toml maps each component folder onto a subpackage. Python puts the
working directory first on ``sys.path``, so every Python started in the
checkout root (a REPL, ``python -c``, ``python -m``, PySpark's workers) sees
these folders as top-level packages: ``operator/`` must not be one (it would
hide the standard library's ``operator``), and the ``shoal/`` folder must not
hide the installed components.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def env_without_safe_path() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONSAFEPATH", None)
    env.pop("PYTHONPATH", None)
    return env


def folder_of(package: str) -> Path:
    """The folder a package is built from, by pyproject's package-dir."""
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    parent = max((p for p in mapping if package == p or package.startswith(p + ".")), key=len)
    rest = package.removeprefix(parent).strip(".")
    return ROOT / mapping[parent] / rest.replace(".", "/")


def test_every_folder_with_python_files_is_a_listed_package() -> None:
    listed = set(SETUPTOOLS["packages"])
    folders = {folder_of(package) for package in listed}
    for root in SETUPTOOLS["package-dir"].values():
        for path in (ROOT / root).rglob("*.py"):
            assert path.parent in folders, f"{path.parent.relative_to(ROOT)} is not in packages"
    for package in listed:
        assert folder_of(package).is_dir(), f"{package}: no folder {folder_of(package)}"


@pytest.mark.parametrize("folder", sorted(SETUPTOOLS["package-dir"].values()))
def test_no_top_level_folder_is_named_after_a_standard_module(folder: str) -> None:
    if folder in sys.stdlib_module_names:
        assert not (ROOT / folder / "__init__.py").exists(), (
            f"{folder}/__init__.py makes the folder hide the standard library's {folder!r} "
            "from every Python started in the checkout root"
        )


@pytest.mark.parametrize(
    "python",
    [sys.executable, getattr(sys, "_base_executable", sys.executable)],
    ids=["venv", "base"],
)
def test_python_in_the_checkout_root_imports_the_standard_operator(python: str) -> None:
    result = subprocess.run(
        [python, "-c", "import operator, dataclasses, json; print(operator.__file__)"],
        cwd=ROOT,
        env=env_without_safe_path(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).resolve().parent == STDLIB


def test_python_in_the_checkout_root_imports_every_component() -> None:
    code = (
        "import shoal.broker.server, shoal.gateway, shoal.tenancy, shoal.connector, "
        "shoal.operator.handlers, shoal.cli.app, shoal.benchmarks.suite; print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env_without_safe_path(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_python_m_shoal_runs_from_the_checkout_root() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shoal", "--help"],
        cwd=ROOT,
        env=env_without_safe_path(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "operator" in result.stdout
