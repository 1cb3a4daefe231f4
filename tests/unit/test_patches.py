"""Every patch of torch internals lives in torch_tpu._patches, written against one torch
version: these tests fail loudly when torch changes a function a patch wraps, or when a
patch stops being in place."""
import inspect
import subprocess
import sys

import pytest
import torch

from torch_tpu import _patches


@pytest.mark.parametrize("patch", _patches.ALL, ids=lambda p: p.target)
def test_patched_function_keeps_its_signature(patch):
    assert torch.__version__.split("+")[0] == _patches.WRITTEN_FOR, (
        f"torch {torch.__version__}: re-check every patch in torch_tpu/_patches.py, then "
        f"update WRITTEN_FOR")
    if patch in _patches.WITH_DYNAMO:
        _patches.apply_with_dynamo()
    if patch in _patches.FOR_VALIDATION:
        _patches.apply_for_validation()
    assert patch.current_signature() == patch.signature, (
        f"torch changed {patch.target}, which torch_tpu patches ({patch.why[:80]}...): "
        f"was {patch.signature}, now {patch.current_signature()}")


@pytest.mark.parametrize("patch", _patches.AT_IMPORT, ids=lambda p: p.target)
def test_patch_is_in_place_and_applied_once(patch):
    owner, name = patch.owner_and_name()
    installed = getattr(owner, name)
    assert installed._tpu_patch is patch
    patch.apply()  # idempotent: no second wrapper
    assert getattr(owner, name) is installed


def test_no_torch_patch_outside_patches_module():
    """Assignments to torch attributes (`torch.x.y = ...`, `SomeTorchClass.attr = ...`)
    appear only in _patches.py; settings of torch's config modules (`inductor_config.x =`)
    are not patches."""
    import ast
    import pathlib

    root = pathlib.Path(_patches.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "_patches.py":
            continue
        tree = ast.parse(path.read_text())
        torch_names = {"torch"}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else None
                for a in node.names:
                    full = f"{mod}.{a.name}" if mod else a.name
                    if full.startswith("torch"):
                        torch_names.add(a.asname or a.name.split(".")[0])
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                base = t
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(t, ast.Attribute) and isinstance(base, ast.Name) \
                        and base.id in torch_names and not base.id.endswith("config"):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"torch internals patched outside _patches.py: {offenders}"


@pytest.mark.slow  # fresh processes
def test_print_and_save_of_tpu_tensors(tmp_path):
    """What the import-time patches are for, as a user sees it."""
    code = f"""
import torch
x = torch.arange(6.0, device="tpu").reshape(2, 3)
print(x)
torch.save({{"x": x}}, {str(tmp_path / 'x.pt')!r})
y = torch.load({str(tmp_path / 'x.pt')!r}, map_location="tpu")["x"]
assert y.device.type == "tpu" and torch.equal(y.cpu(), x.cpu())
w = torch.nn.Linear(3, 3)
w.weight.grad = None
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "device='tpu:0'" in out.stdout and out.stdout.strip().endswith("ok")


def test_a_changed_signature_leaves_the_whole_set_unpatched():
    """`apply_all` (the libraries' adapters): one wrapped signature that changed, and no
    patch of the set is applied; the warning names it and what the user loses."""
    import json

    ok = _patches.Patch("json:dumps", str(inspect.signature(json.dumps)), lambda f: f, "test")
    stale = _patches.Patch("json:loads", "(s)", lambda f: f, "test")
    with pytest.warns(RuntimeWarning, match=r"json:loads.*the test is unpatched"):
        assert not _patches.apply_all([ok, stale], "the test is unpatched")
    assert not hasattr(json.dumps, "_tpu_patch") and not hasattr(json.loads, "_tpu_patch")
