"""The helm binary that `make helm` installs (.venv/bin/helm, Helm 4), run
against the test control plane (control_plane.py) through its environment."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml


class Helm:
    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path = path
        self.env = env

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs helm; with ``check``, a failure fails the test with helm's own words."""
        result = subprocess.run(
            [str(self.path), *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if check:
            assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result

    def manifest(self, release: str, namespace: str) -> list[dict[str, Any]]:
        """What the release installed, as `helm get manifest` renders it."""
        text = self("get", "manifest", release, "-n", namespace).stdout
        return [doc for doc in yaml.safe_load_all(text) if doc]
