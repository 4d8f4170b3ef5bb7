"""Run inside a venv that has one part of Shoal installed: import its modules, resolve its imports.

    python extras_check.py --modules MODULE... [--scripts FILE...]

Prints JSON: ``{"import_errors": {module: error}, "unresolved": {name: [where]}}``.
Importing a module proves what runs at import time; resolving every
``import`` statement found in the source (inside functions and
``TYPE_CHECKING`` blocks too, without running them) proves the imports a
module makes only later, on the path a user takes. Both must find their
distributions in this venv, which has only the part's own extras.

This file is run by its path with the venv's interpreter; it imports
nothing of Shoal's or the test suite's.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import sys
import traceback
from pathlib import Path


def imported_names(source: Path) -> set[tuple[str, int]]:
    """Top-level names of the absolute imports in a file, with their line numbers."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found.update((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return {(name, line) for name, line in found if name != "__future__"}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", nargs="*", default=[])
    parser.add_argument("--scripts", nargs="*", type=Path, default=[])
    args = parser.parse_args(argv)
    import_errors: dict[str, str] = {}
    sources: list[Path] = list(args.scripts)
    for module in args.modules:
        try:
            imported = importlib.import_module(module)
        except Exception as exc:  # each failure is the finding
            import_errors[module] = "".join(traceback.format_exception_only(exc)).strip()
            continue
        if imported.__file__:
            sources.append(Path(imported.__file__))
    unresolved: dict[str, list[str]] = {}
    for source in sources:
        for name, line in sorted(imported_names(source)):
            if importlib.util.find_spec(name) is None:
                unresolved.setdefault(name, []).append(f"{source.name}:{line}")
    print(json.dumps({"import_errors": import_errors, "unresolved": unresolved}))


if __name__ == "__main__":
    main(sys.argv[1:])
