"""The benchmark scripts are not run by CI, so a renamed mlc function breaks them silently: check their imports."""

import ast
import importlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _scripts() -> list[Path]:
    """The benchmark scripts git tracks or would track (not ignored scratch such as work-gpu/)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "benchmarks"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    return [ROOT / p for p in sorted(listed) if p.endswith(".py")]


def _mlc_imports() -> list[tuple[str, str, str]]:
    """(script, module, name) for every `from mlc... import name` in benchmarks/, at any depth."""
    found = []
    for script in _scripts():
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlc":
                found += [(str(script.relative_to(BENCHMARKS)), node.module, a.name) for a in node.names]
    return found


def test_every_mlc_name_a_benchmark_imports_exists():
    missing = []
    for script, module, name in _mlc_imports():
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script}: from {module} import {name}")
    assert not missing, "benchmarks import names mlc no longer has:\n" + "\n".join(missing)

