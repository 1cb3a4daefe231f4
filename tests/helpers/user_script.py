"""Running a few lines of user code as a script in a fresh process, in one eager mode:
the body reports by assigning to the dict `out`, which comes back (tests/device/test_memory.py,
tests/device/test_fork.py)."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap


def run_script(body: str, mode: str, *, prelude: str = "", limit: str | None = "256MiB",
               timeout: float = 240) -> dict:
    """`body` after `prelude` (helper definitions), with torch and torch_tpu imported and
    `mode` set; TORCH_TPU_MEMORY_LIMIT=`limit` (None: the default budget), no other
    TORCH_TPU_ setting of this environment. -> `out`, and the script's stderr."""
    script = ("import gc, json, os, sys, time, traceback\nimport torch, torch_tpu\n"
              f"torch_tpu.set_eager_mode({mode!r})\nout = {{}}\n" + prelude
              + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    if limit is not None:
        env["TORCH_TPU_MEMORY_LIMIT"] = limit
    with tempfile.TemporaryDirectory() as tmp:  # a file, so tracebacks show the lines
        path = os.path.join(tmp, "user_script.py")
        with open(path, "w") as f:
            f.write(script)
        proc = subprocess.run([sys.executable, path], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return {**json.loads(line[len("RESULT "):]), "stderr": proc.stderr}
