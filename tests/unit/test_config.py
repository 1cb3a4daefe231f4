"""Settings: every TORCH_TPU_* variable is declared once in torch_tpu/_config.py and read
only there; the parsing rules per type; a setting read per op follows the environment
while a mode is on, one read at import takes effect in a fresh process; docs/SETTINGS.md's table is
the generated one."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import torch_tpu
from torch_tpu import _config

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "torch_tpu"


# ---------------------------------------------------------------- the scanner
def _is_environ(expr, aliases) -> bool:
    """`os.environ`, `__import__("os").environ`, `environ`, or a name bound to one of them."""
    if isinstance(expr, ast.Attribute):
        return expr.attr == "environ"
    return isinstance(expr, ast.Name) and (expr.id == "environ" or expr.id in aliases)


def _env_key(node, aliases):
    """The key expression of an environment read at `node`, or None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") \
                and _is_environ(f.value, aliases):
            return node.args[0]
        if (isinstance(f, ast.Attribute) and f.attr == "getenv") or \
                (isinstance(f, ast.Name) and f.id == "getenv"):
            return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
            and _is_environ(node.value, aliases):
        return node.slice
    if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
            and any(_is_environ(c, aliases) for c in node.comparators):
        return node.left
    return None


def _names_torch_tpu(key, consts) -> bool:
    if isinstance(key, ast.Name):
        key = consts.get(key.id)
    if isinstance(key, ast.JoinedStr) and key.values:
        key = key.values[0]
    return isinstance(key, ast.Constant) and isinstance(key.value, str) \
        and key.value.startswith("TORCH_TPU_")


def torch_tpu_env_reads(source: str) -> list[int]:
    """Lines of `source` that read a TORCH_TPU_ variable from the environment: directly,
    through a module constant or an f-string, or through a helper of the module that reads
    the environment with a name it is passed (debug's old `_flag(name, default)`)."""
    tree = ast.parse(source)
    consts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and _is_environ(n.value, ()) for t in n.targets if isinstance(t, ast.Name)}
    readers = {}  # helper name -> the position of the parameter it uses as the key
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            for node in ast.walk(fn):
                key = _env_key(node, aliases)
                if isinstance(key, ast.Name) and key.id in params:
                    readers[fn.name] = params.index(key.id)
    lines = []
    for node in ast.walk(tree):
        key = _env_key(node, aliases)
        if key is not None and _names_torch_tpu(key, consts):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in readers and len(node.args) > readers[node.func.id] \
                and _names_torch_tpu(node.args[readers[node.func.id]], consts):
            lines.append(node.lineno)
    return sorted(lines)


_C_GETENV = re.compile(r"\b(?:std::)?(?:secure_)?getenv\s*\(\s*([^)]*)\)")


def c_torch_tpu_env_reads(source: str) -> list[str]:
    """getenv calls in C/C++ `source` that read a TORCH_TPU_ name or a computed name."""
    return [m.group(0) for m in _C_GETENV.finditer(source)
            if "TORCH_TPU_" in m.group(1) or not m.group(1).startswith('"')]


# ---------------------------------------------------------------- one home
def test_only_config_reads_torch_tpu_environment():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_config.py" and path.parent == PACKAGE:
            continue
        found += [f"{path.relative_to(ROOT)}:{n}" for n in torch_tpu_env_reads(path.read_text())]
    assert not found, ("TORCH_TPU_ environment reads outside torch_tpu/_config.py (declare "
                       "the setting there and use _config.get): " + ", ".join(found))


def test_csrc_reads_no_torch_tpu_environment():
    sources = [p for p in (PACKAGE / "csrc").iterdir() if p.suffix in (".cpp", ".cc", ".h")]
    assert sources
    found = {p.name: c_torch_tpu_env_reads(p.read_text()) for p in sources}
    assert not any(found.values()), found


# Each way the package used to read its settings, and ways it might.
_READS = {
    "plain": 'import os\nX = os.environ.get("TORCH_TPU_A", "0") not in ("", "0")\n',
    "dunder import": 'if __import__("os").environ.get("TORCH_TPU_METRICS", "0"):\n    pass\n',
    "helper": ('import os\ndef _flag(name, default):\n    v = os.environ.get(name)\n'
               '    return default if v is None else v\n\nY = _flag("TORCH_TPU_B", True)\n'),
    "float": 'import os\nP = float(os.environ.get("TORCH_TPU_POLL", "0.05"))\n',
    "getenv": 'import os\nZ = os.getenv("TORCH_TPU_C")\n',
    "subscript": 'import os\nZ = os.environ["TORCH_TPU_C"]\n',
    "membership": 'import os\nZ = "TORCH_TPU_C" in os.environ\n',
    "alias": 'import os\nenv = os.environ\nZ = env.get("TORCH_TPU_C")\n',
    "constant": 'import os\n_NAME = "TORCH_TPU_C"\nZ = os.environ.get(_NAME)\n',
    "f-string": 'import os\ndef f(x):\n    return os.environ.get(f"TORCH_TPU_{x}")\n',
}


@pytest.mark.parametrize("idiom", sorted(_READS))
def test_scanner_finds_every_idiom(idiom):
    assert torch_tpu_env_reads(_READS[idiom]), idiom


def test_scanner_leaves_other_code_alone():
    clean = ('import os\nfrom torch_tpu import _config\nA = _config.get("TORCH_TPU_A")\n'
             'B = os.environ.get("MASTER_ADDR")\nos.environ["TORCH_TPU_C"] = "1"\n'
             'msg = "set TORCH_TPU_CPU_FALLBACK=1"\nenv = dict(os.environ, TORCH_TPU_D="1")\n'
             'def _env_int(name, default):\n    return int(os.environ.get(name) or default)\n'
             'W = _env_int("WORLD_SIZE", 1)\n')
    assert torch_tpu_env_reads(clean) == []
    assert c_torch_tpu_env_reads('auto a = std::getenv("TORCH_TPU_X"); auto b = getenv(name);'
                                 ' auto c = getenv("HOME");') == [
        'std::getenv("TORCH_TPU_X")', "getenv(name)"]


def test_every_setting_is_read_and_every_read_declared():
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r'_config\.get\(\s*"(TORCH_TPU_\w+)"', path.read_text()))
    assert used == set(_config.SETTINGS), (
        f"read but not declared: {sorted(used - set(_config.SETTINGS))}; "
        f"declared but never read: {sorted(set(_config.SETTINGS) - used)}")


def test_config_is_a_leaf():
    tree = ast.parse((PACKAGE / "_config.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_every_setting_is_documented():
    reads = {_config.IMPORT, _config.PER_OP, _config.DEVICE_START,
             _config.INIT_PROCESS_GROUP, _config.TORCHRUN_START}
    for s in _config.SETTINGS.values():
        assert s.read in reads and s.doc and s.shown_default(), s.name


# ---------------------------------------------------------------- docs/SETTINGS.md
def test_settings_table_is_generated():
    text = (ROOT / "docs" / "SETTINGS.md").read_text()
    assert _config.with_table(text) == text, (
        "docs/SETTINGS.md's table differs from src/torch_tpu/_config.py: run "
        "`python -m torch_tpu settings --write`")


def test_table_rewrite_replaces_a_stale_table():
    stale = f"intro\n{_config.TABLE_BEGIN}\n| old | table |\n{_config.TABLE_END}\nrest\n"
    new = _config.with_table(stale)
    assert "| old |" not in new and "`TORCH_TPU_DONATE`" in new
    assert new.startswith("intro\n") and new.endswith(f"{_config.TABLE_END}\nrest\n")
    assert _config.with_table(new) == new
    with pytest.raises(ValueError, match="markers"):
        _config.with_table("no markers here")


# ---------------------------------------------------------------- parsing
@pytest.mark.parametrize("raw,expected", [
    (None, True), ("1", True), ("yes", True), (" TRUE ", True), ("on", True), ("2", True),
    ("0", False), ("", False), ("  ", False), ("false", False), ("Off", False), ("no", False)])
def test_bool(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("TORCH_TPU_DONATE", raising=False)
    else:
        monkeypatch.setenv("TORCH_TPU_DONATE", raw)
    assert _config.get("TORCH_TPU_DONATE") is expected


def test_numbers(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DIST_INIT_TIMEOUT_S", " 30 ")
    monkeypatch.setenv("TORCH_TPU_DIST_WATCHDOG_POLL_S", "0.5")
    assert _config.get("TORCH_TPU_DIST_INIT_TIMEOUT_S") == 30
    assert _config.get("TORCH_TPU_DIST_WATCHDOG_POLL_S") == 0.5
    monkeypatch.setenv("TORCH_TPU_DIST_INIT_TIMEOUT_S", "")
    monkeypatch.setenv("TORCH_TPU_DIST_WATCHDOG_POLL_S", " ")
    assert _config.get("TORCH_TPU_DIST_INIT_TIMEOUT_S") == 600
    assert _config.get("TORCH_TPU_DIST_WATCHDOG_POLL_S") == 0.05
    monkeypatch.delenv("TORCH_TPU_DIST_HEARTBEAT_S", raising=False)
    assert _config.get("TORCH_TPU_DIST_HEARTBEAT_S") is None  # derived by the caller
    monkeypatch.setenv("TORCH_TPU_DIST_INIT_TIMEOUT_S", "ten")
    with pytest.raises(ValueError, match="TORCH_TPU_DIST_INIT_TIMEOUT_S='ten': expected an int"):
        _config.get("TORCH_TPU_DIST_INIT_TIMEOUT_S")


def test_str(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COORDINATOR", " 10.0.0.1:1234 ")
    assert _config.get("TORCH_TPU_COORDINATOR") == "10.0.0.1:1234"
    monkeypatch.setenv("TORCH_TPU_COORDINATOR", "")
    assert _config.get("TORCH_TPU_COORDINATOR") is None


def test_path(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_TPU_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _config.get("TORCH_TPU_CACHE_DIR") == tmp_path / "torch_tpu" / "xla"
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", "~/xla")
    assert _config.get("TORCH_TPU_CACHE_DIR") == pathlib.Path.home() / "xla"
    for off in ("", "0", " 0 "):
        monkeypatch.setenv("TORCH_TPU_CACHE_DIR", off)
        assert _config.get("TORCH_TPU_CACHE_DIR") is None


def test_unknown_name_raises():
    with pytest.raises(KeyError, match="TORCH_TPU_NOPE is not a declared"):
        _config.get("TORCH_TPU_NOPE")


# ---------------------------------------------------------------- when they are read
def test_per_op_setting_follows_the_environment_while_the_mode_is_on(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEBUG_NAN_CHECK", "1")
    x = torch.tensor([-1.0]).to("tpu")
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEBUG):
        with pytest.raises(torch_tpu.TpuNonFiniteError):
            torch.log(x)
        monkeypatch.setenv("TORCH_TPU_DEBUG_NAN_CHECK", "off")
        assert torch.isnan(torch.log(x).cpu()).all()
        monkeypatch.setenv("TORCH_TPU_DEBUG_NAN_CHECK", "yes")
        with pytest.raises(torch_tpu.TpuNonFiniteError):
            torch.log(x)


@pytest.mark.slow  # fresh interpreters
def test_import_time_settings_in_a_fresh_process():
    """What a user sets before starting the program: the modes and the CPU fallback take
    the words of the bool rule, and `settings` shows what is set and flags a typo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    env.update(TORCH_TPU_DEFER_AND_FUSE="on", TORCH_TPU_CPU_FALLBACK="false",
               TORCH_TPU_DEFER_AND_FUZE="1")
    code = ("from torch_tpu.__main__ import info_lines, main\n"
            "print(dict(info_lines()))\n"
            "main(['settings'])\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "'eager mode': 'defer_and_fuse'" in out.stdout
    assert "'CPU fallback': 'off'" in out.stdout
    assert "set here: TORCH_TPU_DEFER_AND_FUSE -> True" in out.stdout
    assert "set here: TORCH_TPU_CPU_FALLBACK -> False" in out.stdout
    assert "not a torch_tpu setting (a typo?): TORCH_TPU_DEFER_AND_FUZE" in out.stdout
    assert _config.markdown_table() in out.stdout
