"""torch.export programs as StableHLO (`torch_tpu.export.to_jax`): an MLP and a tiny Llama
decoder block exported, their StableHLO serialized, and the bytes run in a fresh process
that imports JAX and numpy only, with CPU parity; parameters lifted to arguments; the
refusals name what they refuse."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu.export import ExportError, parameter_names, to_jax

pytest.importorskip("flatbuffers")

# a process that never imports torch: the exported bytes, its inputs, its results
RUNNER = textwrap.dedent('''
    import json, sys
    import numpy as np
    from jax import export
    folder = sys.argv[1]
    exp = export.deserialize(open(folder + "/program.bin", "rb").read())
    inputs = np.load(folder + "/inputs.npz")
    got = exp.call(*[inputs[f"arg{i}"] for i in range(len(inputs.files))])
    got = got if isinstance(got, (tuple, list)) else [got]
    np.savez(folder + "/got.npz", *[np.asarray(g) for g in got])
    print(json.dumps({"torch_imported": "torch" in sys.modules,
                      "platforms": list(exp.platforms)}))
''')


def _run_without_torch(exp, inputs, tmp_path):
    (tmp_path / "program.bin").write_bytes(exp.serialize())
    np.savez(tmp_path / "inputs.npz", **{f"arg{i}": x for i, x in enumerate(inputs)})
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["torch_imported"] is False
    got = np.load(tmp_path / "got.npz")
    return [got[f"arr_{i}"] for i in range(len(got.files))]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).eval()


def test_mlp_runs_from_jax_alone(tmp_path):
    m, x = _mlp(), torch.randn(8, 16)
    exp = to_jax(torch.export.export(m, (x,)))
    text = exp.mlir_module()
    assert "stablehlo.dot_general" in text and "func.func public @main" in text
    assert [tuple(a.shape) for a in exp.in_avals] == [(8, 16)]  # the weights are constants
    (got,) = _run_without_torch(exp, [x.numpy()], tmp_path)
    np.testing.assert_allclose(got, m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_lifted_parameters_are_leading_arguments():
    m, x = _mlp(), torch.randn(8, 16)
    ep = torch.export.export(m, (x,))
    exp = to_jax(ep, lift_parameters=True)
    names = parameter_names(ep)
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    params = [ep.state_dict[n].detach().numpy() for n in names]
    got = np.asarray(exp.call(*params, x.numpy()))
    np.testing.assert_allclose(got, m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    # new weights, same program: no re-export to serve fine-tuned parameters
    params = [p * 0.5 for p in params]
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.5)
    np.testing.assert_allclose(np.asarray(exp.call(*params, x.numpy())),
                               m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_llama_block_runs_from_jax_alone(tmp_path):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=1, vocab_size=100)
    cfg._attn_implementation = "sdpa"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer, self.rope = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)

        def forward(self, h):
            pos = torch.arange(h.shape[1]).unsqueeze(0)
            out = self.layer(h, position_embeddings=self.rope(h, pos), position_ids=pos)
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)
    block, h = Block().eval(), torch.randn(2, 12, 64)
    exp = to_jax(torch.export.export(block, (h,)))
    (got,) = _run_without_torch(exp, [h.numpy()], tmp_path)
    np.testing.assert_allclose(got, block(h).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_several_outputs_and_bfloat16():
    class Two(nn.Module):
        def forward(self, x, y):
            return x.float().softmax(-1), (x * y).sum(0)

    x, y = torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    exp = to_jax(torch.export.export(Two(), (x, y)))
    a, b = exp.call(x.float().numpy().astype(exp.in_avals[0].dtype),
                    y.float().numpy().astype(exp.in_avals[1].dtype))
    want_a, want_b = Two()(x, y)
    np.testing.assert_allclose(np.asarray(a), want_a.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(b).astype(np.float32), want_b.float().numpy(),
                               rtol=1e-2)


def test_refusals_name_what_they_refuse():
    lib = torch.library.Library("tpu_export_test", "DEF")  # noqa: F841 (kept alive)
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    lib.impl("twice", lambda x: torch.empty_like(x), "Meta")

    class Custom(nn.Module):
        def forward(self, x):
            return torch.ops.tpu_export_test.twice(x) + 1

    with pytest.raises(ExportError, match="tpu_export_test.twice"):
        to_jax(torch.export.export(Custom(), (torch.randn(3),)))
    drop = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    with pytest.raises(ExportError, match="eval mode"):
        to_jax(torch.export.export(drop, (torch.randn(2, 4),)))
    dyn = torch.export.export(_mlp(), (torch.randn(8, 16),),
                              dynamic_shapes=({0: torch.export.Dim("batch")},))
    with pytest.raises(ExportError, match="symbolic dimensions"):
        to_jax(dyn)
    assert torch_tpu.export.to_jax is to_jax
