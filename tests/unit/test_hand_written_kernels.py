"""The ops with hand-written PrivateUse1 kernels have one list each, kept by whoever
registers them: csrc/tpu_ext.cpp lists its C++ kernels as it registers them
(`_C.NATIVE_KERNELS`), _dispatch its Python ones (`_PYTHON_KERNELS`), and the lowering
table's registration leaves both alone (`_dispatch._HAND_WRITTEN`). These read torch's
dispatcher, not a copy of either list."""
import re

import torch

import torch_tpu  # noqa: F401
from torch_tpu import _C, _dispatch
from torch_tpu.lowering import registry

_AT = re.compile(r"^PrivateUse1: registered at (\S+):\d+", re.M)


def _private_use1_sources():
    """aten packet name -> the files that registered a PrivateUse1 kernel of its overloads."""
    out: dict = {}
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        if not name.startswith("aten::"):
            continue
        m = _AT.search(torch._C._dispatch_dump(name))
        if m:
            out.setdefault(name[6:].split(".")[0], set()).add(m.group(1).replace("\\", "/"))
    return out


def test_the_cpp_kernels_are_exactly_the_ones_c_lists():
    sources = _private_use1_sources()
    from_cpp = {name for name, files in sources.items()
                if any(f.endswith("csrc/tpu_ext.cpp") for f in files)}
    assert from_cpp == set(_C.NATIVE_KERNELS)
    # and no overload of theirs got a kernel from anywhere else (the lowering table's)
    mixed = {name: files for name, files in sources.items()
             if name in from_cpp and not all(f.endswith("csrc/tpu_ext.cpp") for f in files)}
    assert not mixed, mixed


def test_the_table_registers_nothing_over_a_hand_written_kernel():
    assert _dispatch._HAND_WRITTEN == set(_C.NATIVE_KERNELS) | set(_dispatch._PYTHON_KERNELS)
    # copy_ is lowered (aten.copy's in-place variant) yet keeps the Python kernel
    assert torch.ops.aten.copy.default in registry.LOWERINGS
    a = torch.zeros(3, device="tpu")
    a.copy_(torch.arange(3.0))
    assert a.cpu().tolist() == [0.0, 1.0, 2.0]
