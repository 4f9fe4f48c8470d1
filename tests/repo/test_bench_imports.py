"""The benchmarks stand on the package alone: nothing under bench/ imports
from tests/ (what both need lives in gorge_testing)."""

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_benchmark_imports_from_tests():
    scripts = sorted(BENCH.rglob("*.py"))
    assert scripts, "no benchmark found"
    offenders = {
        f"{path.relative_to(BENCH)}: {name}"
        for path in scripts
        for name in _imported_modules(path)
        if name == "tests" or name.startswith("tests.")
    }
    assert offenders == set()
    assert "gorge_testing.mariadb_server" in _imported_modules(BENCH / "daemons.py")
