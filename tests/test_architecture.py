"""The shape of the code base, as the issues ask it to stay: no module over 800 lines, no import
circle between dpproxy's modules (module-level imports, those under TYPE_CHECKING included), and no
heavy library loaded by every process that is not needed by every process."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "dpproxy"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The dpproxy modules `name` imports at module level (in if/try blocks too, not in functions);
    `from package import submodule` is an edge to the submodule, not to the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
                found.update(subs)
                if base in modules and len(subs) < len(node.names):
                    found.add(base)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found


def test_no_module_is_over_800_lines() -> None:
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 800}
    assert not long, long


def test_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_starting_dpproxy_loads_neither_opendps_extras_nor_scipy() -> None:
    # Every command of the CLI and every spawned server worker imports these modules: opendp.prelude's
    # extras (scikit-learn, Polars, SciPy bindings) and SciPy took about half a second of CPU from
    # each start (dpproxy/privacy/opendp_names.py; SciPy is imported where distinct counts and
    # variance spans need it).
    code = (
        "import sys, dpproxy.cli, dpproxy.wire, dpproxy.engine; "
        "print(sorted({m.split('.')[0] if m.startswith('scipy') else m for m in sys.modules "
        "if m.startswith(('scipy', 'opendp.extras', 'polars', 'sklearn'))}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
