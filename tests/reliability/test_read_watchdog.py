"""A read that waits for a device value that never becomes ready (issue 53's hang: the
main thread asleep in jaxlib's BlockUntilReady, every other thread idle, no signal
getting through) ends the process with a message, instead of hanging (_waits.py).

The state is built as the runtime left it: a tensor whose XLA buffer is the result of a
program that never finishes (a host callback that waits on a gate nobody opens, queued
behind a matmul so that it runs on XLA's thread, not inline in the dispatching one).
- the read past TORCH_TPU_READ_TIMEOUT_S: exit 1, the user's line of the read and every
  thread's stack; in Debug mode the op that waits is named, at its own line;
- the same read when the program finishes before the timeout returns the right value.
"""
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import sys, threading
    import jax, jax.numpy as jnp, numpy as np
    import torch, torch_tpu
    from torch_tpu import _runtime, _storage

    gate = threading.Event()

    def wait_at_gate(x):
        gate.wait()
        return np.asarray(x)

    never = jax.jit(lambda x: jax.pure_callback(
        wait_at_gate, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    slow = jax.jit(lambda b: (b @ b)[:4, 0] * 0)

    t = torch.zeros(4, device="tpu")
    big = jnp.ones((1536, 1536), jnp.float32, device=_runtime.device())
    gate.set()
    never(slow(big)).block_until_ready()  # both compiled: the next calls queue
    gate.clear()
    _storage.set_buffer(t.untyped_storage(), never(slow(big)))
    if sys.argv[1] == "opens":
        threading.Timer(1.0, gate.set).start()
    y = (t + 1).sum()  # the op
    print("VALUE", y.item())  # the read
""")


def _line(marker: str) -> str:
    lines = _SCRIPT.splitlines()
    return f"never_ready.py:{next(i for i, text in enumerate(lines, 1) if marker in text)}"


def _run(tmp_path, mode, gate, timeout_s):
    script = tmp_path / "never_ready.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TORCH_TPU_READ_TIMEOUT_S=str(timeout_s), OMP_NUM_THREADS="1")
    env.pop("TORCH_TPU_DEFER_AND_FUSE", None)
    env.pop("TORCH_TPU_LAUNCH_BLOCKING", None)
    if mode == "defer_and_fuse":
        env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    if mode == "debug":
        env["TORCH_TPU_LAUNCH_BLOCKING"] = "1"
    return subprocess.run([sys.executable, str(script), gate], env=env, text=True,
                          capture_output=True, timeout=120)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_a_read_that_never_completes_ends_the_process_with_its_line(mode, tmp_path):
    out = _run(tmp_path, mode, "stays shut", 2)
    err = out.stderr
    assert out.returncode == 1 and "VALUE" not in out.stdout, err[-3000:]
    assert "never became ready (TORCH_TPU_READ_TIMEOUT_S=2)" in err, err[-3000:]
    if mode == "debug":  # the op's own wait, at the op's line
        assert "aten::add" in err and _line("# the op") in err, err[-3000:]
    else:
        assert "a read to the host" in err and _line("# the read") in err, err[-3000:]
    assert "in wait_at_gate" in err  # every thread's stack, the stuck program's too


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_slow_read_within_the_timeout_returns_its_value(mode, tmp_path):
    out = _run(tmp_path, mode, "opens", 30)
    assert out.returncode == 0 and "VALUE 4.0" in out.stdout, out.stderr[-3000:]
