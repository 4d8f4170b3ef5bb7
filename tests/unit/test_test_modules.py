"""pytest imports test modules by basename (rootdir-relative "prepend" mode):
two test files of one name in tests/unit and tests/integration stop the whole
run at collection, so each name is used once."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_no_test_module_name_is_used_twice() -> None:
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.parent == TESTS:
            continue
        if path.name in seen and path.name not in {"__init__.py", "conftest.py"}:
            clashes.append(f"{path.relative_to(TESTS)} and {seen[path.name].relative_to(TESTS)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of: " + "; ".join(clashes)
