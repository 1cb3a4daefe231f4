"""Benchmarks that measure tpu against references side by side, in one process, and write
their tables and charts into docs/PERFORMANCE.md.

`BENCHES` is the dispatch table for `python -m torch_tpu bench NAME`: name -> (module, help).
A bench module provides `add_arguments(parser)` and `main(args) -> int`. Add a line here
to add a bench; common.py has the shared timing, table and report helpers.
"""

BENCHES = {
    "ops": ("torch_tpu.bench.ops",
            "per-op time: Strict eager on tpu vs CPU eager vs a bare jax.jit call; Llama step"),
    "compile": ("torch_tpu.bench.compile", "small Llama: torch.compile(backend='tpu') vs eager modes, CPU eager, inductor, jax.jit"),
    "collectives": ("torch_tpu.bench.collectives", "tpu_dist all_reduce/all_gather bus bandwidth vs gloo, 2 processes, 4 KB-64 MB"),
    "modes": ("torch_tpu.bench.modes", "eager modes on small Llama/Qwen2: Strict vs DeferAndFuse vs Debug vs CPU eager (train, generate, memory, per-op recording)"),
}
