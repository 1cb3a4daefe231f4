"""torch_tpu/_jax_internals.py is the one home of every private JAX piece: no other module
of the runtime or its tools imports a private JAX module (found with `ast`, imports inside
functions included), every piece it exposes resolves on the installed JAX, and the
installed JAX is the version they were read in."""
import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import torch_tpu  # noqa: F401  (x64 on, as the package runs)
from torch_tpu import _cache, _jax_internals as ji

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
HOME = SRC / "torch_tpu" / "_jax_internals.py"


def _private(module: str) -> bool:
    """jax._src and any other jax module part that starts with "_", jax.lib, and every
    jaxlib submodule (jaxlib itself is public: its version)."""
    parts = module.split(".")
    if parts[0] == "jaxlib":
        return len(parts) > 1
    return parts[0] == "jax" and (parts[1:2] == ["lib"] or any(p.startswith("_") for p in parts))


def private_imports(path: pathlib.Path) -> list[str]:
    """`line module` for each private JAX module that `path` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [f"{node.lineno} {n}" for n in names if _private(n)]
    return found


def test_only_jax_internals_imports_private_jax():
    files = [p for pkg in ("torch_tpu", "torch_tpu_tools")
             for p in sorted((SRC / pkg).rglob("*.py"))]
    assert HOME in files and len(files) > 100
    offenders = [f"{p.relative_to(SRC)}:{hit}" for p in files if p != HOME
                 for hit in private_imports(p)]
    assert not offenders, "take private JAX pieces from torch_tpu/_jax_internals.py:\n  " \
        + "\n  ".join(offenders)
    assert private_imports(HOME)  # the scan sees the real ones


def test_the_scan_catches_every_spelling(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import jax.numpy\nfrom jax import lax\nimport jaxlib\nfrom . import _jax\n"
                 "from jax._src import array\nfrom jax import _src\nfrom jaxlib import _jax\n"
                 "def g():\n    import jax._src.dispatch\n    from jax.lib import xla_client\n")
    assert sorted({hit.split()[1] for hit in private_imports(f)}) == [
        "jax._src", "jax._src.array", "jax._src.dispatch", "jax.lib", "jax.lib.xla_client",
        "jaxlib._jax"]


def test_every_piece_resolves_on_the_installed_jax(tmp_path):
    x = jnp.arange(4.0)
    assert type(x) is ji.ArrayImpl
    weak = ji.convert_element_type(2, jnp.dtype(jnp.float64), weak_type=True)
    assert weak.weak_type and (x * weak).dtype == x.dtype
    executable, kept, handlers = ji.plain_call(jax.jit(lambda a, b: a * 2).lower(x, x).compile())
    assert kept == (0,) and len(handlers) == 1
    assert callable(executable.execute_sharded)  # what csrc/direct.cpp calls
    assert ji.compile_events() == ("/jax/compilation_cache/cache_hits",
                                   "/jax/core/compile/backend_compile_duration")
    assert ji.backends_are_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):  # its pieces resolved first
        ji.gloo_cpu_client("127.0.0.1")

    before = _cache.cache_dir()  # set_persistent_cache: a new program lands on disk
    try:
        _cache.setup(tmp_path)
        jax.jit(lambda a: a * 3.25 + 1).lower(np.zeros(3, np.float32)).compile()
        assert list(tmp_path.glob("*.xla"))
    finally:
        _cache.setup(before) if before is not None else _cache.disable()


def test_the_installed_jax_is_the_version_the_pieces_were_read_in(monkeypatch):
    assert ji.JAX_VERSION == "0.10.2"
    ji.check_version()
    monkeypatch.setattr(jax, "__version__", "0.11.0")
    with pytest.raises(RuntimeError, match=r"0\.10\.2.*'jax': '0\.11\.0'"):
        ji.check_version()


def test_lowerings_share_a_thread_s_ir_context_and_renew_it():
    """reuse_ir_contexts: jit's lowerings on one thread build their modules in one MLIR
    context until IR_CONTEXT_MODULES of them have, then in a new one; another thread has
    its own; the programs compute what they did."""
    import threading

    contexts = []

    def lower_many(out, n):
        for i in range(n):
            lowered = jax.jit(lambda x, i=i: x * 2 + i).lower(jnp.ones(3))
            out.append(lowered.compiler_ir().context)

    lower_many(contexts, ji.IR_CONTEXT_MODULES + 2)
    ids = [id(c) for c in contexts]
    assert len(set(ids)) in (2, 3)  # (the first may continue a context already in use)
    assert ids[-1] == ids[-2] and ids[-1] != ids[-2 - ji.IR_CONTEXT_MODULES]
    other = []
    t = threading.Thread(target=lower_many, args=(other, 2))
    t.start()
    t.join()
    assert other[0] is other[1] and other[0] is not contexts[-1]
    np.testing.assert_array_equal(jax.jit(lambda x: x * 2 + 5)(jnp.ones(3)), np.full(3, 7.0))
    ji.reuse_ir_contexts()  # idempotent: still one wrapper
    from jax._src.interpreters import mlir  # (the test may read the private piece)
    assert mlir.ModuleContext.__init__.torch_tpu_shared


def test_jax_tracebacks_follow_the_setting():
    """set_tracebacks: off (TORCH_TPU_JAX_TRACEBACKS's default) a result array and a traced
    equation carry no Python stack; on, they do again; jit computes the same either way."""
    from jax._src import source_info_util  # (the test may read the private piece)

    def stack_of_a_traced_equation():
        eqn = jax.make_jaxpr(lambda x: x * 2)(1.0).jaxpr.eqns[0]
        return eqn.source_info.traceback

    assert stack_of_a_traced_equation() is None  # torch_tpu set it at import
    try:
        ji.set_tracebacks(True)
        assert stack_of_a_traced_equation() is not None
        assert source_info_util.current().traceback is not None
    finally:
        ji.set_tracebacks(False)
    assert stack_of_a_traced_equation() is None
    np.testing.assert_array_equal(jax.jit(lambda x: x * 2)(jnp.ones(2)), np.full(2, 2.0))
