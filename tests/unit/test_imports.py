"""The package's imports point one way, down the layers that docs/LAYERS.md lists: no
module of src/torch_tpu imports a module of a layer above its own, nor, directly or through
others, a module that imports it back; and the runtime never imports its tools
(src/torch_tpu_tools), which stand above it all.

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

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
LAYERS_MD = ROOT / "docs" / "LAYERS.md"
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


# ---------------------------------------------------------------- the layers of docs/LAYERS.md
def layers(doc: str) -> list[list[str]]:
    """The layers that the first fenced block of docs/LAYERS.md lists, top first: each line
    that starts in column 0 is one layer, its names (`x.py`, `dir/`, `dir/x.py`, comma
    separated) run up to the first gap of two spaces; the rest, and indented lines, are prose."""
    block = doc.split("```", 2)[1]
    found = []
    for line in block.splitlines()[1:]:
        if line[:1].strip():
            found.append([n.strip() for n in line.split("  ")[0].split(",") if n.strip()])
    return found


def _covers(name: str, module: str, package: str) -> int:
    """How specifically layer name `name` covers `module` (0: not at all)."""
    rel = module[len(package):].lstrip(".").split(".") if module != package else []
    if name.endswith("/"):
        parts = name.rstrip("/").split("/")
        return len(parts) if rel[:len(parts)] == parts else 0
    parts = name[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return len(parts) + 1 if rel == parts else 0


def layer_of(graph: dict, doc_layers: list, package: str) -> dict:
    """module -> the index of its layer (the most specific name that covers it)."""
    out, unlisted = {}, []
    for module in graph:
        best = max(((_covers(n, module, package), i) for i, names in enumerate(doc_layers)
                    for n in names), default=(0, None))
        if best[0]:
            out[module] = best[1]
        else:
            unlisted.append(module)
    assert not unlisted, f"docs/LAYERS.md lists no layer for {sorted(unlisted)}"
    return out


def upward(graph: dict, level: dict) -> list[str]:
    """Every import of a module from a layer above the importer's own."""
    return sorted(f"{m} (layer {level[m]}) imports {d} (layer {level[d]})"
                  for m, deps in graph.items() for d in deps if level[d] < level[m])


def test_imports_point_down_the_layers_of_the_doc():
    graph = import_graph(SRC, "torch_tpu")
    doc_layers = layers(LAYERS_MD.read_text())
    assert len(doc_layers) > 10, doc_layers
    problems = upward(graph, layer_of(graph, doc_layers, "torch_tpu"))
    assert not problems, ("imports that point up docs/LAYERS.md (move the service down, or "
                          "the module, and say so in the doc):\n  " + "\n  ".join(problems))


def _imported_names(path: pathlib.Path):
    """Every absolute module name a file imports, with import_module("...") calls."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            yield str(node.args[0].value)


def test_the_runtime_never_imports_its_tools():
    offenders = sorted(f"{p.relative_to(SRC)} imports {n}" for p in (SRC / "torch_tpu").rglob("*.py")
                       for n in _imported_names(p) if n.split(".")[0] == "torch_tpu_tools")
    assert not offenders, offenders
    tools = list((SRC / "torch_tpu_tools").rglob("*.py"))
    assert any("torch_tpu" in _imported_names(p) or any(n.startswith("torch_tpu.") for n in _imported_names(p))
               for p in tools)  # read the real tools


def test_no_module_derives_a_checkout_path_from_its_file():
    """Output folders are arguments; a path climbed from `__file__` (`parents[3]`,
    `dirname(dirname(__file__))`) would break in an installed wheel."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Subscript) and getattr(node.value, "attr", "") == "parents":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} .parents[...]")
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "dirname"
                    and node.args and isinstance(node.args[0], ast.Call)
                    and getattr(node.args[0].func, "attr", "") == "dirname"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} dirname(dirname(...))")
    assert not offenders, offenders


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


def test_an_upward_import_in_a_scratch_copy_fails(tmp_path):
    """The layer check itself: a copy of the package with one import added that points up
    docs/LAYERS.md (the storage layer asking the executors) is caught, naming both."""
    import shutil

    shutil.copytree(SRC / "torch_tpu", tmp_path / "torch_tpu",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "csrc"))
    storage = tmp_path / "torch_tpu" / "_storage.py"
    storage.write_text(storage.read_text() + "\n\ndef _upward():\n    from .eager import strict\n")
    graph = import_graph(tmp_path, "torch_tpu")
    level = layer_of(graph, layers(LAYERS_MD.read_text()), "torch_tpu")
    problems = upward(graph, level)
    assert len(problems) == 1 and problems[0].startswith("torch_tpu._storage ") and \
        "imports torch_tpu.eager.strict" in problems[0], problems
    assert not upward(import_graph(SRC, "torch_tpu"), level)  # the real tree, same doc: clean


def test_layer_names_cover_modules_most_specifically_first():
    doc = "intro\n```\ntop.py, fam/     prose\n   more prose\nfam/low.py  x\n```\n"
    assert layers(doc) == [["top.py", "fam/"], ["fam/low.py"]]
    graph = {"p.top": set(), "p.fam": set(), "p.fam.mid": set(), "p.fam.low": set()}
    assert layer_of(graph, layers(doc), "p") == {"p.top": 0, "p.fam": 0, "p.fam.mid": 0, "p.fam.low": 1}
    assert upward({"p.fam.low": {"p.fam.mid"}, "p.fam.mid": {"p.fam.low"}, "p.top": set(), "p.fam": set()},
                  {"p.top": 0, "p.fam": 0, "p.fam.mid": 0, "p.fam.low": 1}) == \
        ["p.fam.low (layer 1) imports p.fam.mid (layer 0)"]
