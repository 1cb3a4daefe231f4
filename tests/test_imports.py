"""The package's imports point one way: no module of src/torch_tpu imports, directly or
through others, a module that imports it back.

The graph is read from the source with `ast`, so it holds every import statement wherever it
stands, inside functions included: a lazy import still ties the two modules into one knot
for whoever has to change them. Relative imports are resolved, `from pkg import name`
counts as an import of the submodule `pkg.name` when there is one (else of `pkg` itself),
and compiled extensions (`from . import _C`) are leaves.
"""
from __future__ import annotations

import ast
import pathlib
import textwrap

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
_EXTENSIONS = ("*.so", "*.pyd")


def _modules(src: pathlib.Path, package: str) -> dict:
    """module name -> (source path, the package its relative imports start from)."""
    mods = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            base = parts
        else:
            base = parts[:-1]
        mods[".".join(parts)] = (path, base)
    return mods


def _extensions(src: pathlib.Path, package: str) -> set:
    """The compiled modules (`_C.cpython-311-x86_64-linux-gnu.so` -> `torch_tpu._C`)."""
    found = set()
    for pattern in _EXTENSIONS:
        for path in (src / package).rglob(pattern):
            parts = list(path.relative_to(src).parts)
            parts[-1] = parts[-1].split(".")[0]
            found.add(".".join(parts))
    return found


def import_graph(src: pathlib.Path, package: str) -> dict:
    """module -> the set of the package's modules it imports (edges into leaves omitted)."""
    mods = _modules(src, package)
    leaves = _extensions(src, package) | {package + "._C"}
    inside = (package, package + ".")
    graph = {}
    for name, (path, base) in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith(inside))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith(inside):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods or sub in leaves else target)
        unknown = deps - set(mods) - leaves
        assert not unknown, f"{name} imports {sorted(unknown)}, which are not in {package}"
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: dict, comp: list) -> str:
    members = set(comp)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in comp)


def test_no_import_cycle_in_the_package():
    graph = import_graph(SRC, "torch_tpu")
    assert len(graph) > 50 and "torch_tpu.lowering.pointwise" in graph  # read the real tree
    found = cycles(graph)
    assert not found, "import cycles (each module -> the members of its cycle it imports):\n" \
        + "\n\n".join(_describe(graph, c) for c in found)


# ---------------------------------------------------------------- the check itself
def _write(root: pathlib.Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_graph_sees_lazy_relative_and_submodule_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from . import _C, core\n",
        "pkg/_C.cpython-311-x86_64-linux-gnu.so": "",
        "pkg/core.py": "from .fam import helpers\nfrom .fam.helpers import x\n",
        "pkg/fam/__init__.py": "from .. import core\n",
        "pkg/fam/helpers.py": "import os\n\ndef f():\n    from ..core import g\n    import pkg.tool\n",
        "pkg/tool.py": "from pkg import fam\nfrom pkg.fam import VALUE\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.core"},                            # _C is a leaf
        "pkg.core": {"pkg.fam.helpers"},                # the submodule, not the package
        "pkg.fam": {"pkg.core"},                        # `from .. import core`
        "pkg.fam.helpers": {"pkg.core", "pkg.tool"},    # imports inside a function
        "pkg.tool": {"pkg.fam"},                        # `from pkg.fam import VALUE`
    }
    assert cycles(graph) == [["pkg.core", "pkg.fam", "pkg.fam.helpers", "pkg.tool"]]
    assert "pkg.fam.helpers -> pkg.core, pkg.tool" in _describe(graph, cycles(graph)[0])


def test_a_one_way_graph_has_no_cycle():
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
