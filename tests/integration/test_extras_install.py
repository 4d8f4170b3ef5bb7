"""Each part of Shoal runs with just what its own extra installs.

The suite itself runs in a venv with every extra, where an import that
escapes its extra goes unnoticed (``httpx`` was only in the ``test`` and
``bench`` extras while the gateway imported it, so ``make dev`` failed on a
fresh machine and CI stayed green). Here the package is built as a wheel,
as a user or the image gets it, and installed into one venv per part with
only that part's extras:

* ``base``: ``shoal[dev]``, what README's ``make dev`` installs: every module
  but the connector's and the benchmarks';
* ``spark``: ``shoal[spark]``, what a Spark job's image installs: the
  connector and the jobs of ``spark-operator-jobs/``;
* ``bench``: ``shoal[bench]``, what ``make bench`` installs: the benchmarks.

Each venv imports every module of its part and resolves every import
statement in their sources (see ``extras_check.py``). The venvs are kept in
``~/.cache/shoal/extras-venvs``, keyed by the dependencies pyproject.toml
declares, so a warm run only reinstalls the wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shoal" / "extras-venvs"
CHECK = Path(__file__).resolve().parent / "extras_check.py"


@dataclass(frozen=True)
class Part:
    extras: str
    packages: tuple[str, ...]
    scripts: tuple[Path, ...] = ()


def owned_by_extra(module: str) -> bool:
    return module.startswith(("shoal.connector", "shoal.benchmarks"))


PARTS = {
    "base": Part("dev", ("shoal",)),
    "spark": Part("spark", ("shoal.connector",), tuple(ROOT.glob("spark-operator-jobs/jobs/*.py"))),
    "bench": Part("bench", ("shoal.benchmarks",)),
}


def pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
        check=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shoal wheel, built from what the Dockerfile copies: pyproject, README, packages."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    pip(Path(sys.executable), "wheel", "--no-deps", "--wheel-dir", str(out), str(source))
    (built,) = out.glob("shoal-*.whl")
    return built


def modules_in(wheel: Path, prefix: str) -> list[str]:
    names = []
    for name in zipfile.ZipFile(wheel).namelist():
        if name.endswith(".py") and name.startswith("shoal/"):
            module = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            if (module == prefix or module.startswith(prefix + ".")) and not module.endswith(
                "__main__"
            ):
                names.append(module)
    return sorted(names)


def venv_for(extras: str, wheel: Path) -> Path:
    """A venv with the wheel and its extras; made once per set of declared dependencies."""
    project = PYPROJECT["project"]
    declared = json.dumps(
        [sys.version, project["dependencies"], project["optional-dependencies"]], sort_keys=True
    )
    key = hashlib.sha256(declared.encode()).hexdigest()[:16]
    venv = CACHE / f"{extras}-{key}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.exists():
        pip(python, "install", "--no-deps", "--force-reinstall", str(wheel))
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(python, "install", f"{wheel}[{extras}]")
    ready.touch()
    return python


def test_the_wheel_carries_every_module_of_the_checkout(wheel: Path) -> None:
    packaged = set(zipfile.ZipFile(wheel).namelist())
    mapping: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package, folder in mapping.items():
        for path in (ROOT / folder).rglob("*.py"):
            inside = path.relative_to(ROOT / folder).as_posix()
            assert f"{package.replace('.', '/')}/{inside}" in packaged


@pytest.mark.parametrize("part", list(PARTS))
def test_a_part_imports_with_only_its_own_extras(part: str, wheel: Path, tmp_path: Path) -> None:
    spec = PARTS[part]
    python = venv_for(spec.extras, wheel)
    modules = [
        module
        for package in spec.packages
        for module in modules_in(wheel, package)
        if part != "base" or not owned_by_extra(module)
    ]
    assert modules, f"no modules found for {part}"
    result = subprocess.run(
        [str(python), "-I", str(CHECK), "--modules", *modules,
         "--scripts", *map(str, spec.scripts)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["import_errors"] == {}, f"shoal[{spec.extras}] cannot import"
    assert found["unresolved"] == {}, f"imports that shoal[{spec.extras}] does not install"


def test_the_base_install_runs_the_shoal_command(wheel: Path, tmp_path: Path) -> None:
    python = venv_for(PARTS["base"].extras, wheel)
    for command in (["--help"], ["dev", "--help"], ["gateway", "--help"], ["bench", "--help"]):
        result = subprocess.run(
            [str(python.parent / "shoal"), *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"shoal {' '.join(command)}: {result.stderr}"
