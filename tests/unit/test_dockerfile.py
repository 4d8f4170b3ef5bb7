"""The Dockerfiles build from what pyproject.toml needs, and the image runs as the chart expects.

No Docker engine runs here (e2e/run.sh builds the image); these checks read
the Dockerfiles: a package folder missing from their COPY lines would only
show as a failed `pip install` at build time.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "Dockerfile"
DOCKERFILES = [IMAGE, ROOT / "spark-operator-jobs" / "Dockerfile"]


def package_folders() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["tool"]["setuptools"]["package-dir"].values())


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines)
        if word and not word.startswith("#")
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_folder_is_copied_into_the_build(dockerfile: Path) -> None:
    sources = {
        source
        for instruction, args in instructions(dockerfile)
        if instruction == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert package_folders() | {"pyproject.toml", "README.md"} <= sources


def test_image_runs_shoal_as_uid_10001_from_a_pinned_base() -> None:
    steps = instructions(IMAGE)
    (base_arg,) = [args for i, args in steps if i == "ARG" and args.startswith("PYTHON_IMAGE=")]
    base = base_arg.split("=", 1)[1]
    # An exact Python patch release and Debian release, never a moving tag.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base)
    froms = [args for i, args in steps if i == "FROM"]
    assert len(froms) == 2, "a build stage and a runtime stage"
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    users = [args for i, args in steps if i == "USER"]
    assert users[-1] == "10001:10001"
    assert ("ENTRYPOINT", '["shoal"]') in steps
    assert ("CMD", '["--help"]') in steps


def test_build_context_leaves_local_state_out() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".shoal", ".git", "build"} <= ignored
