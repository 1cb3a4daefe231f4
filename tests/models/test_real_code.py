"""What real code does with a device: save/load, deepcopy, pickle, HF save_pretrained /
from_pretrained, generators, DataLoader with pinned memory and workers, activation
checkpointing and fork_rng. Each of these crashed or failed on a pure-Python version of
the representation; the crash test runs each in a subprocess and checks the exit code."""
import copy
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.checkpoint

import torch_tpu  # noqa: F401


def _state():
    torch.manual_seed(0)
    return {"w": torch.randn(4, 5), "b": torch.randn(5).to(torch.bfloat16),
            "i": torch.arange(6), "h": torch.randn(3).half()}


def test_save_load_round_trip_bit_exact(tmp_path):
    cpu = _state()
    tpu = {k: v.to("tpu") for k, v in cpu.items()}
    path = tmp_path / "ckpt.pt"
    torch.save(tpu, path)
    for loc in ("cpu", "tpu", None):
        loaded = torch.load(path, map_location=loc)
        for k, v in loaded.items():
            assert v.device.type == (loc or "tpu")
            assert v.dtype == cpu[k].dtype
            assert torch.equal(v.cpu(), cpu[k]), k
    back = {k: v.cpu().to("tpu") for k, v in torch.load(path, map_location="cpu").items()}
    assert all(torch.equal(back[k].cpu(), cpu[k]) for k in cpu)


def test_state_dict_map_location_into_model(tmp_path):
    m = torch.nn.Linear(3, 2)
    torch.save(m.state_dict(), tmp_path / "m.pt")
    t = torch.nn.Linear(3, 2).to("tpu")
    t.load_state_dict(torch.load(tmp_path / "m.pt", map_location="tpu"))
    assert torch.equal(t.weight.cpu(), m.weight.detach())


def test_deepcopy_and_pickle():
    x = torch.randn(3, 4).to("tpu")
    y = copy.deepcopy(x)
    assert y.device.type == "tpu" and torch.equal(y.cpu(), x.cpu())
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    y.add_(1)
    assert not torch.equal(y.cpu(), x.cpu())
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()).to("tpu")
    m2 = copy.deepcopy(m)
    assert torch.equal(m2[0].weight.cpu(), m[0].weight.cpu())
    p = pickle.loads(pickle.dumps(x))
    assert p.device.type == "tpu" and torch.equal(p.cpu(), x.cpu())


def test_storages_have_identity_and_size():
    a, b = torch.ones(4, device="tpu"), torch.ones(4, device="tpu")
    sa = a.untyped_storage()
    assert sa.data_ptr() != 0 and sa.data_ptr() != b.untyped_storage().data_ptr()
    assert sa.nbytes() == 16 and len(sa) == 16
    assert a[1:].untyped_storage().data_ptr() == sa.data_ptr()


def test_hf_save_pretrained_from_pretrained(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("tpu")
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).to("tpu")
    for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p.cpu(), q.cpu()), n


def test_generator_on_device():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(5)
    a = torch.rand(4, device="tpu", generator=g).cpu()
    g.manual_seed(5)
    b = torch.rand(4, device="tpu", generator=g).cpu()
    c = torch.rand(4, device="tpu", generator=g).cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)
    state = g.get_state()
    d = torch.rand(4, device="tpu", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(4, device="tpu", generator=g).cpu(), d)


def test_manual_seed_reproducible_and_rng_state():
    torch.manual_seed(123)
    a = torch.randn(8, device="tpu").cpu()
    state = torch.tpu.get_rng_state()
    b = torch.randn(8, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(8, device="tpu").cpu(), b)
    torch.manual_seed(123)
    assert torch.equal(torch.randn(8, device="tpu").cpu(), a)
    assert torch.tpu.initial_seed() == 123


def test_fork_rng():
    torch.manual_seed(0)
    with torch.random.fork_rng(device_type="tpu"):
        torch.randn(3, device="tpu")
    a = torch.randn(3, device="tpu").cpu()
    torch.manual_seed(0)
    assert torch.equal(torch.randn(3, device="tpu").cpu(), a)


def test_checkpoint_preserves_device_rng():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8, device="tpu", requires_grad=True)

    def block(t):
        return torch.nn.functional.dropout(lin(t), p=0.5, training=True)

    torch.manual_seed(1)
    ref = block(x)
    ref.sum().backward()
    g_ref = x.grad.cpu().clone()
    x.grad = None
    torch.manual_seed(1)
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    out.sum().backward()
    assert torch.equal(out.cpu(), ref.cpu())
    assert torch.equal(x.grad.cpu(), g_ref)


class _Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((3,), float(i))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_pin_memory(workers):
    loader = torch.utils.data.DataLoader(_Data(), batch_size=4, pin_memory=True, num_workers=workers)
    total = 0.0
    for batch in loader:
        assert batch.is_pinned()
        total += batch.to("tpu", non_blocking=True).sum().item()
    assert total == 3 * sum(range(8))


CRASH_CASES = {
    "factories": "torch.zeros(2, device='tpu'); torch.randn(2, device='tpu'); torch.arange(3, device='tpu')",
    "deepcopy": "import copy; copy.deepcopy(torch.nn.Linear(2, 2).to('tpu'))",
    "pickle": "import pickle; pickle.loads(pickle.dumps(torch.ones(2, device='tpu')))",
    "untyped_storage": "torch.UntypedStorage(16, device='tpu')",
    "load_to_tpu": "import io; b = io.BytesIO(); torch.save(torch.ones(3), b); b.seek(0); torch.load(b, map_location='tpu')",
    "generator": "torch.Generator(device='tpu').manual_seed(1)",
    "pin_memory": "torch.ones(3).pin_memory().to('tpu')",
    "view_dtype": "torch.ones(4, device='tpu').view(torch.int32).cpu()",
    "resize": "t = torch.ones(2, device='tpu'); t.resize_(10); t.untyped_storage().resize_(64)",
    "sync": "torch.accelerator.synchronize(); torch.tpu.synchronize()",
    "mixed_device": "import contextlib\nwith contextlib.suppress(RuntimeError): torch.ones(2, device='tpu') + torch.ones(2)",
    "bad_dtype": "import contextlib\nwith contextlib.suppress(TypeError): torch.ones(2, dtype=torch.complex32).to('tpu')",
    "bad_index": "import contextlib\nwith contextlib.suppress(RuntimeError): torch.set_default_device(None); torch.ones(2, device='tpu')[torch.tensor([5], device='tpu')]",
    "free_at_exit": "x = torch.ones(1000, device='tpu'); y = x[2:]; del x",
}


@pytest.mark.slow  # a fresh interpreter per case (~3 s each)
@pytest.mark.parametrize("name", sorted(CRASH_CASES))
def test_no_operation_crashes_the_interpreter(name):
    code = "import torch, torch_tpu\n" + CRASH_CASES[name] + "\nprint('OK')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, textwrap.shorten(proc.stderr, 2000)
