"""The package layout, read statically (nothing is imported): the layer contracts of pyproject.toml's
[tool.importlinter] (import-linter: the layers between and inside packages, no import cycle anywhere, imports inside
functions included), no private names across packages nor imported from another module, tvm only in mlc.compiler,
package __init__ files that only re-export, and no function over MAX_FUNCTION_LINES lines (#38)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

MLC = Path(__file__).resolve().parent.parent / "mlc"
# mlc's packages (private names may not cross them); a module belongs to the first one that prefixes it.
PACKAGES = ("mlc.api", "mlc.cli", "mlc.pipeline", "mlc.frontends", "mlc.passes", "mlc.compiler", "mlc.tuning",
            "mlc.bench", "mlc.check", "mlc.artifacts", "mlc.targets", "mlc.models", "mlc.runtime", "mlc.errors",
            "mlc.child_process")

# Known violations, each with its reason (none today). Entries name
# the file and the thing (no line numbers), so a new violation is never hidden behind an old one.
ALLOWED_PRIVATE: set[str] = set()
# The thin runtime imports tvm only where it is installed and the artifact calls relax.run.* (TVM registers those
# names when imported and fails if they are taken); artifacts still run with tvm_ffi alone.
ALLOWED_TVM: set[str] = {"mlc/runtime/runner.py"}
# #38: a function longer than this is split by meaning (each piece one named thing).
MAX_FUNCTION_LINES = 60
# Functions allowed over it, "file:function" (none now); the test fails when a listed one is within the limit.
ALLOWED_LONG_FUNCTIONS: set[str] = set()


def _unit(module: str) -> str:
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return "mlc"  # mlc/__init__.py, mlc/__main__.py


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(MLC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(MLC.rglob("*.py"))}


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, with relative imports resolved against the importing module."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    path = MLC.parent / name.replace(".", "/")
    return name.startswith("mlc.") and (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())


def _imports(module: str, path: Path, tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """Every import in the file, at module level or inside functions: (line, module, names imported from it).
    `from mlc import api` is an import of mlc.api."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, path, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if _is_module(sub):
                    found.append((node.lineno, sub, []))  # a submodule, not a name
                else:
                    found.append((node.lineno, target, [alias.name]))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def lint_imports(root: Path, *config: str) -> subprocess.CompletedProcess:
    """import-linter's `lint-imports` (the venv's, beside this Python) run in `root` on its config."""
    tool = Path(sys.executable).with_name("lint-imports")
    assert tool.is_file(), f"{tool} is missing: `make setup` installs the dev extra (import-linter)"
    return subprocess.run([str(tool), "--no-cache", "--no-logo", *config], cwd=root, capture_output=True, text=True)


def test_import_layers_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: the layers between mlc's packages and inside each, and no
    import cycle between the modules or packages inside any package."""
    result = lint_imports(MLC.parent)
    assert result.returncode == 0, "import-linter: broken layer contracts\n" + result.stdout + result.stderr


def test_no_private_name_imported_from_another_module():
    """`from mlc.x import _name` only in mlc.x itself: a helper two modules share is public where it lives."""
    found = [f"{path.relative_to(MLC.parent)}:{line}: {target}.{name}"
             for module, (path, tree) in _sources().items()
             for line, target, names in _imports(module, path, tree)
             for name in names if target.split(".")[0] == "mlc" and target != module and _private(name)]
    assert not found, "private names imported from another module:\n" + "\n".join(sorted(found))


def test_no_private_names_across_packages():
    """No `from mlc.x import _name`, no `mlc.x._module`, no `x._name` on a module imported from another package."""
    found = []
    for module, (path, tree) in _sources().items():
        where = path.relative_to(MLC.parent)
        unit = _unit(module)
        aliases: dict[str, str] = {}  # local name -> mlc module it is bound to
        for line, target, names in _imports(module, path, tree):
            if not target.startswith("mlc.") or _unit(target) == unit:
                continue
            inner = target[len(_unit(target)):].split(".")
            if any(_private(part) for part in inner):
                found.append((f"{where}: {target}", line))
            found += [(f"{where}: {target}.{n}", line) for n in names if _private(n)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.startswith("mlc."):
                        aliases[alias.asname] = alias.name
                    elif alias.name == "mlc" or alias.name.startswith("mlc."):
                        aliases["mlc"] = "mlc"  # `import mlc.x` binds mlc: mlc.x._name is spelled in full
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node)
                for alias in node.names:
                    if _is_module(f"{target}.{alias.name}"):
                        aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, value = [], node.value  # x.y.z._name -> ["x", "y", "z"]
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                if not isinstance(value, ast.Name) or value.id not in aliases:
                    continue
                target = ".".join([aliases[value.id], *chain])
                if _is_module(target) and _unit(target) != unit:
                    found.append((f"{where}: {target}.{node.attr}", node.lineno))
    new = sorted({f"{key} (line {line})" for key, line in found if key not in ALLOWED_PRIVATE})
    assert not new, "private names used across packages:\n" + "\n".join(new)
    stale = ALLOWED_PRIVATE - {key for key, _ in found}
    assert not stale, f"fixed, so remove from ALLOWED_PRIVATE: {sorted(stale)}"


def test_only_the_compiler_imports_tvm():
    """TVM loads only in mlc.compiler (its worker processes); the thin runtime needs tvm_ffi alone."""
    found = []
    for module, (path, tree) in _sources().items():
        for line, target, _ in _imports(module, path, tree):
            where = str(path.relative_to(MLC.parent))
            if (target == "tvm" or target.startswith("tvm.")) and _unit(module) != "mlc.compiler" \
                    and where not in ALLOWED_TVM:
                found.append(f"{where}:{line} imports {target}")
            if _unit(module) == "mlc.runtime" and target.split(".")[0] not in _RUNTIME_IMPORTS \
                    and not (where in ALLOWED_TVM and target.split(".")[0] == "tvm"):
                found.append(f"{path.relative_to(MLC.parent)}:{line} (thin runtime) imports {target}")
    assert not found, "\n".join(sorted(set(found)))
    stale = {f for f in ALLOWED_TVM if not re.search(r"^\s*(import|from) tvm\b", (MLC.parent / f).read_text(), re.M)}
    assert not stale, f"fixed, so remove from ALLOWED_TVM: {sorted(stale)}"


# What the thin runtime (copied into artifacts, run where only numpy and apache-tvm-ffi are installed) may import.
# ml_dtypes: optional (bf16 arrays where installed); mlc_compare, mlc_gate: mlc.check's modules an artifact ships
# beside the runtime for `run.py --check`; mlc_host_ops: mlc.runtime.host_ops, shipped by artifacts with string ops.
_RUNTIME_IMPORTS = {"numpy", "tvm_ffi", "mlc_runtime", "__future__", "argparse", "ctypes", "hashlib", "importlib",
                    "json", "math", "os", "platform", "re", "shutil", "subprocess", "sys", "tempfile", "time",
                    "pathlib", "typing", "zipfile", "mlc", "ml_dtypes", "mlc_compare", "mlc_gate", "mlc_host_ops"}


def _init_files() -> list[Path]:
    return sorted(p for p in MLC.glob("*/__init__.py"))


@pytest.mark.parametrize("path", _init_files(), ids=lambda p: p.parent.name)
def test_package_init_only_reexports(path):
    """mlc/<package>/__init__.py: a docstring, imports and __all__ (the root mlc/__init__.py is the lazy public API)."""
    body = ast.parse(path.read_text()).body
    extra = []
    for i, node in enumerate(body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if [getattr(t, "id", None) for t in targets] == ["__all__"]:
                continue
        extra.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    assert not extra, f"{path.relative_to(MLC.parent)} holds more than re-exports:\n" + "\n".join(extra)


def long_functions(root: Path = MLC, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """{"file:function": its lines} for every function (nested ones too) of more than `limit` lines."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found[f"{path.relative_to(root.parent).as_posix()}:{node.name}"] = length
    return found


def test_no_function_over_the_length_limit():
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in ALLOWED_LONG_FUNCTIONS}
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines (split them by meaning):\n"
                     + "\n".join(f"{k}: {v} lines" for k, v in sorted(new.items())))
    fixed = ALLOWED_LONG_FUNCTIONS - set(found)
    assert not fixed, "now within the limit, drop from ALLOWED_LONG_FUNCTIONS: " + ", ".join(sorted(fixed))


# -- the checks themselves, on made-up graphs: they must see what they are for

def test_import_linter_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "high.py").write_text("from pkg import low\n")
    (tmp_path / "pkg" / "low.py").write_text("def f():\n    from pkg import high\n    return high\n")
    (tmp_path / "layers.toml").write_text('[tool.importlinter]\nroot_package = "pkg"\n\n'
                                          '[[tool.importlinter.contracts]]\nname = "layers"\ntype = "layers"\n'
                                          'containers = ["pkg"]\nlayers = ["high", "low"]\n')
    result = lint_imports(tmp_path, "layers.toml")
    assert result.returncode == 1 and "pkg.low is not allowed to import pkg.high" in result.stdout, result.stdout


def test_long_function_finder_reports_one(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 4)
    assert long_functions(package, limit=4) == {"pkg/m.py:long": 5}
