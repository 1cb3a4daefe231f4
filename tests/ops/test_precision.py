"""Precision: torch's float32 matmul setting, cuDNN's switches under their tpu names and
`torch.tpu.precision(...)` reach every product and convolution XLA compiles, in each eager
mode and under torch.compile, and each program's key holds the setting: a change compiles
new programs, setting it back compiles nothing.

The scripts read what XLA is given: TORCH_TPU_DUMP_DIR writes every compiled program's
StableHLO, where a float32 dot or convolution carries `precision = [P, P]` (HIGHEST,
HIGH, DEFAULT). XLA:CPU computes float32 in float32 whatever P says, so the values are
CPU's in every setting; on a TPU, P is the number of bfloat16 passes (_precision.py).
"""
import dis
import inspect
import textwrap

import pytest
import torch
from helpers.dist_launch import run_script

from torch_tpu import _precision
from torch_tpu.lowering import registry

XLA = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}

# The user script's shared part: a tiny conv + attention + linear model, trained one step,
# and the precision attributes of the programs compiled since the last look.
PRELUDE = r'''
import json, os, pathlib, re
import torch, torch.nn as nn, torch.nn.functional as F
import torch_tpu

DUMP = pathlib.Path(os.environ["TORCH_TPU_DUMP_DIR"])
_seen = set()


def compiled():
    """{program name: [precision of each dot / convolution]} compiled since the last call."""
    out = {}
    for f in sorted(DUMP.glob("*.mlir")):
        if f in _seen:
            continue
        _seen.add(f)
        text = f.read_text()
        name = re.search(r"^// name: (.*)$", text, re.M).group(1)
        found = [a or b for a, _, b in
                 re.findall(r"precision = \[(\w+), (\w+)\]|#stablehlo<precision (\w+)>", text)]
        # a conv's attribute lists both operands: count each op once
        out.setdefault(name, []).extend(found[::2] if "#stablehlo<precision" in text else found)
    return out


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(2, c, 3, padding=1)
        self.proj = nn.Linear(c, c)
        self.head = nn.Linear(c, 1)

    def forward(self, x):
        h = self.conv(x).flatten(2).transpose(1, 2)          # (B, HW, C)
        q = self.proj(h).unsqueeze(1)                         # one head
        att = F.scaled_dot_product_attention(q, q, q).squeeze(1)
        return (torch.einsum("bsc,bsc->b", att, h) + torch.bmm(h, h.transpose(1, 2)).mean()
                + self.head(h.mean(1)).squeeze(1))


def train_step(net, x):
    net.zero_grad()
    loss = net(x).sum()
    loss.backward()
    return loss.item()
'''


def _run(tmp_path, body, timeout=900):
    script = tmp_path / "precision_script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    code, out, results = run_script(script, env={"TORCH_TPU_DUMP_DIR": str(tmp_path / "dump"),
                                                 "TORCH_TPU_CACHE_DIR": "0"}, timeout=timeout)
    assert code == 0 and results, out[-6000:]
    return results[0]


def _all(found, setting):
    """Every dot and convolution in `found` ({name: [P...]}) carries the setting's P."""
    values = [p for ps in found.values() for p in ps]
    return bool(values) and set(values) == {XLA[setting]}


# ---------------------------------------------------------------- each mode, each setting
EAGER = r'''
results = {}
for i, mode in enumerate(("strict", "debug", "defer_and_fuse")):
    torch.manual_seed(0)
    net = Net(4 + i).to("tpu")      # a size per mode: Strict and Debug share op programs
    x = torch.randn(2, 2, 5, 5, device="tpu")
    with torch_tpu.eager_mode(mode):
        losses = {}
        for setting in ("highest", "high", "medium", "highest"):
            torch.set_float32_matmul_precision(setting)
            losses[setting] = train_step(net, x)
            results[f"{mode} {setting} {len(results)}"] = compiled()
    cpu = Net(4 + i)
    cpu.load_state_dict({k: v.cpu() for k, v in net.state_dict().items()})
    results[f"{mode} cpu"] = [losses["highest"], train_step(cpu, x.cpu())]
print("RESULT " + json.dumps({"rank": 0, "results": results}))
'''

SENSITIVE_OPS = {"aten.convolution.default", "aten.convolution_backward.default",
                 "aten.addmm.default", "aten.mm.default", "aten.bmm.default",
                 "aten._scaled_dot_product_fused_attention_overrideable.default",
                 "aten._scaled_dot_product_fused_attention_overrideable_backward.default"}


@pytest.mark.slow  # a fresh process compiling ~60 programs
def test_each_setting_reaches_every_product_and_convolution_in_each_eager_mode(tmp_path):
    r = _run(tmp_path, EAGER)["results"]
    for mode in ("strict", "debug", "defer_and_fuse"):
        steps = [(k.split()[1], v) for k, v in r.items() if k.startswith(mode + " ") and "cpu" not in k]
        (first, at_first), (_, at_high), (_, at_medium), (_, back) = steps
        assert first == "highest" and _all(at_first, "highest"), (mode, at_first)
        assert _all(at_high, "high") and _all(at_medium, "medium"), (mode, at_high, at_medium)
        # setting it back finds the programs compiled for it: nothing compiles
        assert back == {}, (mode, back)
        if mode != "defer_and_fuse":  # one program per op: only the products recompile
            assert SENSITIVE_OPS <= set(at_first), (mode, sorted(at_first))
            assert set(at_high) <= SENSITIVE_OPS and set(at_medium) == set(at_high), at_high
        else:  # fused graphs: the ones holding a product or convolution recompile
            assert all(n.startswith("fused_") for n in at_high) and at_high, at_high
        loss, cpu_loss = r[f"{mode} cpu"]
        assert abs(loss - cpu_loss) <= 1e-4 * max(1.0, abs(cpu_loss)), (mode, loss, cpu_loss)


# ---------------------------------------------------------------- torch.compile
COMPILED = r'''
torch.manual_seed(0)
net = Net(4).to("tpu")
compiled_net = torch.compile(net, backend="tpu")
x = torch.randn(2, 2, 5, 5, device="tpu")
results = []
for setting in ("highest", "high", "medium", "highest"):
    torch.set_float32_matmul_precision(setting)
    net.zero_grad()
    compiled_net(x).sum().backward()
    results.append([setting, compiled()])
print("RESULT " + json.dumps({"rank": 0, "results": results}))
'''


@pytest.mark.slow  # a fresh process compiling ~60 programs
def test_each_setting_reaches_the_compiled_programs(tmp_path):
    r = _run(tmp_path, COMPILED)["results"]
    for setting, found in r[:3]:
        graphs = {n: p for n, p in found.items() if n.startswith(("forward", "backward"))}
        assert {n.rstrip("0123456789") for n in graphs} == {"forward", "backward"}, found
        assert _all(graphs, setting), (setting, graphs)
    assert r[3][1] == {}, r[3]  # back to "highest": its programs are still there


# ---------------------------------------------------------------- the other switches
SWITCHES = r'''
import torch.backends.tpu, torch.backends.tpudnn
a, b = torch.randn(8, 6, device="tpu"), torch.randn(6, 4, device="tpu")
img, w = torch.randn(1, 2, 6, 6, device="tpu"), torch.randn(3, 2, 3, 3, device="tpu")
found = {}
def both(label):
    (a @ b).cpu(), F.conv2d(img, w).cpu()
    got = compiled()
    found[label] = {"mm": got.get("aten.mm.default"), "conv": got.get("aten.convolution.default")}

torch.backends.tpu.matmul.allow_tf32 = True              # CUDA's flag: "high" products
both("allow_tf32")
torch.set_float32_matmul_precision("medium")
torch.backends.tpudnn.allow_tf32 = False                 # cuDNN's: full float32 convolutions
both("dnn off")
torch.backends.tpudnn.allow_tf32 = True
torch.backends.tpudnn.fp32_precision = "tf32"
both("dnn tf32")
torch.backends.tpudnn.fp32_precision = "none"
torch.set_float32_matmul_precision("highest")
with torch.tpu.precision("medium"):                      # the block wins over the settings
    both("context")
with torch_tpu.eager_mode("defer_and_fuse"):             # recorded in the block, flushed after
    with torch.tpu.precision("high"):
        y = a @ b
    z = (y @ b.t()).cpu()
found["deferred"] = compiled()
with torch_tpu.eager_mode("defer_and_fuse"):
    with torch.tpu.precision("high"):
        y = a @ b
    z = (y @ b.t()).cpu()
found["deferred again"] = compiled()
(a.bfloat16() @ b.bfloat16()).cpu()                      # 16-bit operands: no attribute
found["bf16"] = compiled()
print("RESULT " + json.dumps({"rank": 0, "found": found}))
'''


@pytest.mark.slow  # a fresh process compiling ~60 programs
def test_backends_switches_and_the_precision_block(tmp_path):
    f = _run(tmp_path, SWITCHES)["found"]
    assert f["allow_tf32"] == {"mm": ["HIGH"], "conv": ["HIGH"]}, f  # convs follow the matmul one
    assert f["dnn off"] == {"mm": ["DEFAULT"], "conv": ["HIGHEST"]}, f
    # a key holds both settings (a fused graph may have products and convolutions), so
    # the product compiles again too, at the same precision
    assert f["dnn tf32"] == {"mm": ["DEFAULT"], "conv": ["HIGH"]}, f
    assert f["context"] == {"mm": ["DEFAULT"], "conv": ["DEFAULT"]}, f
    (graph,) = f["deferred"].values()
    assert sorted(graph) == ["HIGH", "HIGHEST"], f["deferred"]  # each op keeps its own
    assert f["deferred again"] == {}, f
    # 16-bit operands carry no precision attribute; on XLA:CPU the product is ATen's kernel,
    # a custom call with no dot at all (_cpu_kernels.py)
    assert set(f["bf16"]["aten.mm.default"]) <= {"DEFAULT"}, f["bf16"]


# ---------------------------------------------------------------- every lowering marked
def _code_names(code, seen):
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "LOAD_NAME",
                          "LOAD_DEREF"):
            yield ins.argval
    for const in code.co_consts:
        if inspect.iscode(const) and const not in seen:
            seen.add(const)
            yield from _code_names(const, seen)


def _uses_precision(fn, memo, stack=()):
    """Whether `fn` (or a function of the package it calls by name) asks _precision."""
    fn = inspect.unwrap(fn)
    if fn in memo:
        return memo[fn]
    if fn in stack or not hasattr(fn, "__code__"):
        return False
    memo[fn] = False
    g = fn.__globals__
    found = False
    for name in _code_names(fn.__code__, set()):
        if name in ("for_matmul", "for_conv"):
            found = True
            break
        target = g.get(name)
        if (inspect.isfunction(target) and target.__module__.startswith("torch_tpu")
                and _uses_precision(target, memo, (*stack, fn))):
            found = True
            break
    memo[fn] = found
    return found


def test_every_lowering_that_asks_for_the_precision_is_keyed_by_it():
    """A lowering that reads the precision while unmarked would keep the first setting's
    program forever (its key would not hold the setting)."""
    memo = {}
    asking = {fn for fn in set(registry.LOWERINGS.values()) if _uses_precision(fn, memo)}
    names = sorted(f"{fn.__module__}.{fn.__name__}" for fn in asking - _precision.SENSITIVE)
    assert not names, f"unmarked (add @precision.sensitive): {names}"
    assert _precision.SENSITIVE <= asking  # and every marked one does ask
    assert len(asking) >= 10, sorted(fn.__name__ for fn in asking)


def test_a_change_recompiles_the_product_and_setting_it_back_does_not(eager, monkeypatch,
                                                                      tmp_path):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    a = torch.randn(7, 3, device="tpu")  # a shape no other test uses here
    b = torch.randn(3, 11, device="tpu")
    expected = a.cpu() @ b.cpu()  # (DeferAndFuse: a and b are made before the products)
    before = torch.get_float32_matmul_precision()
    found = []
    try:
        for setting in ("highest", "medium", "highest", "medium"):
            torch.set_float32_matmul_precision(setting)
            torch.testing.assert_close((a @ b).cpu(), expected)  # XLA:CPU: float32 always
            texts = [f.read_text() for f in sorted(tmp_path.glob("*.mlir"))]
            # the precision of each program with a product, in the order they compiled
            found.append([t.split("precision = [")[1].split(",")[0]
                          for t in texts if "dot_general" in t])
    finally:
        torch.set_float32_matmul_precision(before)
    # one program per setting, found again when the setting comes back
    assert found == [["HIGHEST"]] + [["HIGHEST", "DEFAULT"]] * 3, found


def test_the_precision_block_accepts_torchs_names_and_refuses_others():
    before = torch.get_float32_matmul_precision()
    for name, canonical in (("highest", "highest"), ("tf32", "high"), ("bf16", "medium"),
                            ("medium", "medium")):
        with torch.tpu.precision(name):
            assert _precision.current() == canonical and _precision.current("conv") == canonical
    assert _precision.current() == before
    try:
        torch.tpu.precision("fp8").__enter__()
    except ValueError as e:
        assert "fp8" in str(e) and "highest" in str(e)
    else:
        raise AssertionError("torch.tpu.precision('fp8') was accepted")

