"""The C copies of Python mechanisms on the eager hot path agree with their references.

- The constants C and Python share by position or name, exported from C as
  `_C.CONTRACTS`, equal Python's: the argument-kind numbering, the cspec's field order,
  the graph key's layout, the __slots__ C reads at their offsets, the methods and
  attributes C calls by name.
- The C argument scan (`_C.scan`, csrc/scan.cpp) gives the same key, the same buffer
  objects and the same device scalars as `OpPlan.scan` over a table of op calls, and
  leaves exactly the listed calls to Python (a change there shows up here).
- With `TORCH_TPU_C_FAST_PATH=0` (every op through the Python reference) a DeferAndFuse
  training step gives the same values, flushes and compiles as with the fast path on; the
  whole DeferAndFuse suite passes that way too (slow).
- Debug and DeferAndFuse find the user's line by one rule (_frames.py, csrc/frames.cpp).
"""
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

import torch_tpu
from torch_tpu import _C, _dispatch, _frames
from torch_tpu.eager import debug, defer, fuse, strict
from torch_tpu.op import build, opcall
from torch_tpu.lowering import schema

aten = torch.ops.aten
DEFER = torch_tpu.EagerMode.DEFER_AND_FUSE
ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTRACTS = _C.CONTRACTS


# ---------------------------------------------------------------- shared constants
def test_contracts_cover_what_c_reads():
    assert set(CONTRACTS) == {"kinds", "cspec", "key_layout", "slots", "methods", "attributes"}


def test_argument_kind_numbering():
    assert CONTRACTS["kinds"] == schema.KINDS
    assert [schema.KINDS[k] for k in ("TENSOR", "OPT_TENSOR", "TENSOR_LIST", "OPT_TENSOR_LIST")] \
        == list(schema.TENSOR_KINDS)


def test_cspec_field_order():
    assert CONTRACTS["cspec"] == opcall.CSpec._fields
    plan = _dispatch.plan_for(aten.add_.Tensor)
    spec = plan.cspec
    assert isinstance(spec, opcall.CSpec)
    assert (spec.kinds, spec.mutated, spec.npos, spec.names, spec.defaults) == \
        (plan.kinds, plan.mutable, plan.npos, plan.names, plan.defaults)
    assert spec.mutated == (0,) and spec.python_only is False
    assert _dispatch.plan_for(aten.bernoulli.p).cspec.python_only is True


def test_graph_key_layout(monkeypatch):
    layout = CONTRACTS["key_layout"]
    assert layout == {"word_bytes": 8, "out_bits": fuse._OUT_BITS, "sections": fuse._KEY_SECTIONS,
                      "node": ("entry", "n_inputs", "inputs")}
    # and fuse._decode reads a real key as the graph it came from
    keys = []
    flush_plan = _C.flush_plan

    def keep_key(nodes, donate):
        planned = flush_plan(nodes, donate)
        keys.append(planned[0])
        return planned

    monkeypatch.setattr(_C, "flush_plan", keep_key)
    with torch_tpu.eager_mode(DEFER):
        x = torch.arange(5.0).to("tpu")
        torch_tpu.sync()
        keys.clear()
        t = x + 1.5
        w = (t * t).sum()
        del t  # an intermediate nothing holds: not an output
        assert w.item() == sum((i + 1.5) ** 2 for i in range(5))
    (key,) = keys
    assert len(key) % layout["word_bytes"] == 0
    wiring, outs, dyn_slots, dyn_types, donated = fuse._decode(key)
    assert wiring == ((0,), ((0, 0), (0, 0)), ((1, 0),))  # x; t, t; t * t
    assert outs == ((2, 0),) and donated == ()
    assert dyn_slots == tuple(range(len(dyn_types))) and len(dyn_slots) >= 1  # 1.5 (and alpha)


def test_slots_c_reads_at_their_offsets():
    classes = {"Entry": build.Entry, "DeferExecutor": defer.DeferExecutor}
    assert set(CONTRACTS["slots"]) == set(classes)
    for name, slots in CONTRACTS["slots"].items():
        for slot in slots:
            # a member descriptor of the class itself: slots.h reads it at its offset
            assert isinstance(classes[name].__dict__.get(slot), types.MemberDescriptorType), \
                (name, slot)


def test_methods_and_attributes_c_calls_by_name():
    executors = [strict.StrictExecutor, debug.DebugExecutor, defer.DeferExecutor]
    assert set(CONTRACTS["methods"]) == {"executor", "DeferExecutor"}
    for cls in executors:
        for m in CONTRACTS["methods"]["executor"]:
            assert callable(getattr(cls, m, None)), (cls, m)
    for m in CONTRACTS["methods"]["DeferExecutor"]:
        assert callable(getattr(defer.DeferExecutor, m, None)), m
    assert set(CONTRACTS["attributes"]) == {"OpPlan", "DeferExecutor"}
    plan = _dispatch.plan_for(aten.mul.Tensor)
    for a in CONTRACTS["attributes"]["OpPlan"]:
        assert hasattr(plan, a), a
    ex = defer.DeferExecutor()
    for a in CONTRACTS["attributes"]["DeferExecutor"]:
        assert hasattr(ex, a), a
    assert type(ex.loop) is _C.LoopDetector


# ---------------------------------------------------------------- the scan, C against Python
def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype).to("tpu")


def _tpu(t):
    return t.to("tpu")


# name -> (whether C scans it, () -> (op, args, kwargs)); False: C returns None and
# OpPlan.scan does it
SCAN_CASES = {
    "contiguous tensors": (True, lambda: (aten.add.Tensor, (_t(2, 3), _t(2, 3)), {})),
    "transposed views": (True, lambda: (aten.add.Tensor, (_t(2, 3).t(), _t(2, 3).t()), {})),
    "offset strided view, number for a tensor": (
        True, lambda: (aten.mul.Tensor, (_t(4, 6)[1:, ::2], 2.0), {})),
    "slice at offset 0 (offset as data)": (True, lambda: (aten.mul.Tensor, (_t(8, 4)[0:3], _t(3, 4)), {})),
    "write into a slice (offset as data)": (
        True, lambda: (aten.add_.Tensor, (_t(8, 4)[2:5], _t(3, 4)), {})),
    "bitcast view at an offset (offset in the key)": (
        True, lambda: (aten.bitwise_and.Scalar, (_t(6).view(torch.int32)[2:], 1), {})),
    "expanded view (stride 0)": (True, lambda: (aten.add.Tensor, (_t(2, 3), _t(1, 3).expand(2, 3)), {})),
    "bitcast view": (True, lambda: (aten.bitwise_and.Scalar, (_t(6).view(torch.int32), 1), {})),
    "int tensor, int number": (True, lambda: (aten.add.Tensor, (_tpu(torch.arange(4)), 3), {})),
    "complex tensor, complex number": (
        True, lambda: (aten.mul.Tensor, (_t(3, dtype=torch.complex64), 1j), {})),
    "0-dim tpu tensor": (True, lambda: (aten.add.Tensor, (_t(2, 3), _tpu(torch.tensor(2.0))), {})),
    "in-place": (True, lambda: (aten.add_.Tensor, (_t(2, 3), _t(2, 3)), {"alpha": 0.5})),
    "in-place reading its own storage": (True, lambda: (lambda a: (aten.add_.Tensor, (a, a[0]), {}))(_t(2, 3))),
    "int scalar": (True, lambda: (aten.clamp.default, (_t(3), 2), {})),
    "keyed scalar, common int": (True, lambda: (aten.pow.Tensor_Scalar, (_t(3), 2), {})),
    "keyed scalar, common float": (True, lambda: (aten.pow.Tensor_Scalar, (_t(3), 0.5), {})),
    "keyed scalar, inf": (True, lambda: (aten.linalg_vector_norm.default, (_t(3), float("inf")), {})),
    "keyed scalar, other float": (True, lambda: (aten.pow.Tensor_Scalar, (_t(3), 2.5), {})),
    "keyed scalar, other int": (True, lambda: (aten.pow.Tensor_Scalar, (_t(3), 4), {})),
    "keyed scalar, bool": (True, lambda: (aten.pow.Tensor_Scalar, (_t(3), True), {})),
    "None and float scalars": (True, lambda: (aten.clamp.default, (_t(5), None, 0.5), {})),
    "int list, bool static": (True, lambda: (aten.sum.dim_IntList, (_t(2, 3), [0, 1], True), {})),
    "optional tensors None, float static": (
        True, lambda: (aten.native_layer_norm.default, (_t(2, 3), [3], None, None, 1e-5), {})),
    "index list with None": (
        True, lambda: (aten.index.Tensor, (_t(3, 4), [None, _tpu(torch.tensor([0, 2]))]), {})),
    "foreach lists": (True, lambda: (aten._foreach_add.List, ([_t(2), _t(3)], [_t(2), _t(3)]), {})),
    "foreach in-place, scalar": (True, lambda: (aten._foreach_mul_.Scalar, ([_t(2), _t(3)], 0.5), {})),
    "foreach scalar list (int, float)": (
        True, lambda: (aten._foreach_add.ScalarList, ([_t(2), _t(3)], [1.0, 2]), {})),
    "factory (numbers keyed by value)": (
        True, lambda: (aten.arange.start_step, (0, 2.5, 0.5), {"device": torch.device("tpu")})),
    # left to Python
    "0-dim CPU tensor": (False, lambda: (aten.add.Tensor, (_t(2, 3), torch.tensor(2.0)), {})),
    "CPU index tensor": (False, lambda: (aten.index.Tensor, (_t(3, 4), [torch.tensor([0, 2])]), {})),
    "fresh storage, no buffer yet": (
        False, lambda: (aten.add.Tensor, (torch.empty(3, device="tpu"), _t(3)), {})),
    "tensor for a Scalar": (False, lambda: (aten.add.Scalar, (_t(3), _tpu(torch.tensor(2.0))), {})),
    "conj view": (False, lambda: (lambda z: (aten.mul.Tensor, (z.conj(), z), {}))(_t(3, dtype=torch.complex64))),
    "neg view": (False, lambda: (lambda a: (aten.add.Tensor, (a._neg_view(), a), {}))(_t(3))),
    "seeded": (False, lambda: (aten.bernoulli.p, (_t(4), 0.5), {})),
    "seeded, explicit generator": (
        False, lambda: (aten.normal.Tensor_float, (_t(4), 1.0),
                        {"generator": torch.Generator("tpu").manual_seed(3)})),
    "one storage written through two arguments": (
        False, lambda: (lambda flat: (aten._foreach_add_.Scalar, ([flat[:3], flat[3:]], 1.0), {}))(_t(6))),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("case", sorted(SCAN_CASES))
def test_c_scan_matches_python_scan(case, mode):
    in_c, build = SCAN_CASES[case]
    with torch_tpu.eager_mode(mode):
        op, args, kwargs = build()
        plan = _dispatch.plan_for(op)
        vals = opcall.normalize(plan, args, kwargs)
        fast = _C.scan(plan, vals)  # first: Python's scan may give a storage its buffer
        key, bufs, dyns = plan.scan(vals)
        assert key[0] is plan
        if not in_c:
            assert fast is None, f"C now scans {case!r}: move it to the C cases"
            return
        assert fast is not None, f"C no longer scans {case!r}"
        ckey, cbufs, cdyns = fast
        assert ckey == key and hash(ckey) == hash(key)
        assert len(cbufs) == len(bufs) and all(a is b for a, b in zip(cbufs, bufs))
        assert len(cdyns) == len(dyns) and all(a is b for a, b in zip(cdyns, dyns))


def test_scan_of_a_storage_written_twice_chains_the_writes():
    flat = _t(6)
    plan = _dispatch.plan_for(aten._foreach_add_.Scalar)
    key, bufs, _ = plan.scan(opcall.normalize(plan, ([flat[:3], flat[3:]], 1.0), {}))
    assert key[2] == (0, 0) and bufs[0] is bufs[1]  # both views are buffer 0's storage


def test_a_cpu_tensor_beside_a_tpu_tensor_is_refused_by_both_scans():
    plan = _dispatch.plan_for(aten.add.Tensor)
    vals = opcall.normalize(plan, (_t(2, 3), torch.ones(2, 3)), {})
    assert _C.scan(plan, vals) is None
    with pytest.raises(opcall.DeviceMismatchError, match="tpu:0 and cpu"):
        plan.scan(vals)


# ---------------------------------------------------------------- the fast path switch
STEP = r"""
import json, sys
import torch, torch_tpu
from torch_tpu import metrics
from torch_tpu.op import opcall
from torch_tpu.eager.defer import DeferExecutor
from torch_tpu.op.opcall import OpPlan
from torch_tpu.eager.strict import StrictExecutor

MODE, EXECUTOR = sys.argv[1], {"strict": StrictExecutor, "defer_and_fuse": DeferExecutor}[sys.argv[1]]
calls = {"execute": 0, "python_scan": 0}
execute, scan = EXECUTOR.execute, OpPlan.scan


def counted_execute(self, plan, vals):
    calls["execute"] += 1
    return execute(self, plan, vals)


def counted_scan(self, vals):
    calls["python_scan"] += 1
    return scan(self, vals)


EXECUTOR.execute, OpPlan.scan = counted_execute, counted_scan
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 3)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # foreach lists, Python scalars
x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
losses = []
with torch_tpu.eager_mode(MODE):
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        losses.append(loss.item())
print(json.dumps({"fast": opcall.C_FAST_PATH, "losses": losses, "calls": calls,
                  "params": [p.detach().cpu().tolist() for p in model.parameters()],
                  "counters": metrics.as_dict()["counters"]}))
"""


def _env(fast: bool):
    env = dict(os.environ, TORCH_TPU_C_FAST_PATH="1" if fast else "0")
    for k in ("TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_METRICS"):
        env.pop(k, None)
    return env


def _ours(counters):
    # (not XLA's, and not the device-side asserts' reads: a sync reads the newest value
    # that has finished on the device, so how many it reads depends on timing; not the
    # direct calls, which only the C side makes (csrc/direct.cpp); programs counted
    # compiled or loaded alike: the two processes run at once on one persistent cache,
    # so which of them finds a program on disk is a race)
    out = {}
    for k, v in counters.items():
        if k.startswith(("xla.", "device_asserts.", "direct.")):
            continue
        if k.startswith("programs.") and k.endswith((".disk_hits", ".xla_compiles")):
            k = k.rsplit(".", 1)[0] + ".built"
        out[k] = out.get(k, 0) + v
    return out


@pytest.mark.slow  # a training step per mode, twice
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_training_step_same_with_the_c_fast_path_off(mode):
    """The C fast paths (csrc/kernel.cpp: Strict's run_strict, DeferAndFuse's
    record_deferred) against their Python references (the executors' execute)."""
    procs = {fast: subprocess.Popen([sys.executable, "-c", STEP, mode], env=_env(fast), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for fast in (True, False)}
    runs = {}
    for fast, p in procs.items():
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        runs[fast] = json.loads(out.strip().splitlines()[-1])
    on, off = runs[True], runs[False]
    assert on["fast"] is True and off["fast"] is False
    assert on["losses"] == off["losses"] and on["params"] == off["params"]
    # the same ops, recorded into the same graphs (DeferAndFuse) or run as the same
    # executables (Strict): every flush, compile and cache count (not the xla.* ones: the
    # persistent compilation cache the two processes share, and compile times)
    assert _ours(on["counters"]) == _ours(off["counters"])
    if mode == "defer_and_fuse":
        assert on["counters"]["fused_cache_hits"] >= 1
    # off: each op came through the executor's execute and OpPlan.scan; on: the cached ops
    # ran or were recorded in C
    done = on["counters"][f"dispatches.{mode}"]
    assert off["calls"]["python_scan"] == off["calls"]["execute"] > done // 2
    assert on["calls"]["execute"] < off["calls"]["execute"] // 2
    assert on["calls"]["python_scan"] < off["calls"]["python_scan"] // 2


@pytest.mark.slow
def test_defer_suite_passes_with_the_c_fast_path_off():
    # less the two that start processes of their own to read settings (no C path in them)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "-k", "not mode_from_environment and not printed_at_exit",
                        str(ROOT / "tests" / "modes" / "test_defer.py")],
                       cwd=ROOT, env=_env(False),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


# ---------------------------------------------------------------- one rule for the user's line
def _code(filename):
    return compile("pass", filename, "exec")


@pytest.mark.parametrize("filename, internal", [
    (torch.nn.functional.__file__, True),
    (torch_tpu.eager.fuse.__file__, True),
    ("<frozen importlib._bootstrap>", True),
    (__file__, False),
    ("/home/me/torch/train.py", False),          # a directory named torch is not torch
    ("/home/me/torch_tpu_runs/train.py", False),  # nor one that starts like torch_tpu
    ("<stdin>", False),
])
def test_internal_code_rule(filename, internal):
    assert _frames.is_internal(_code(filename)) is internal


def test_debug_and_defer_name_the_same_user_line():
    """A user script in a directory called `torch`: both modes name its line."""
    where = "/home/me/torch/train.py"
    code = compile("\n\nfound = (user_line(), user_location())", where, "exec")
    scope = {"user_line": _frames.user_line, "user_location": _frames.user_location}
    exec(code, scope)
    line, location = scope["found"]
    assert line == (where, 3)
    assert location.startswith(_frames.location(where, 3))
    assert debug.user_location is _frames.user_location and defer._user_line is _frames.user_line


@pytest.mark.parametrize("value", [0.5, 1, 1.0, 2, 2.0, 3, 3.0, float("inf"), 0, 0.0, 4, 2.5,
                                   -1, -2.0, float("-inf"), 2 ** 40])
def test_keyed_scalar_values_agree_in_c_and_python(value):
    """C's keyed_scalar tests KEYED_VALUES itself: a common value is a constant of the
    program, keyed by type and value, and passes no device scalar; any other is traced."""
    plan = _dispatch.plan_for(aten.pow.Tensor_Scalar)
    vals = opcall.normalize(plan, (_t(3), value), {})
    ckey, _, cdyns = _C.scan(plan, vals)
    key, _, dyns = plan.scan(vals)
    assert ckey == key and len(cdyns) == len(dyns)
    keyed = schema.keyed(value)
    assert key[1][1] == ((type(value), value) if keyed else type(value))
    assert len(dyns) == (0 if keyed else 1)
