"""Benchmarks that measure tpu against references side by side, in one process, and write
their tables and charts into docs/PERFORMANCE.md.

`BENCHES` is the dispatch table for `python -m torch_tpu bench NAME`: name -> (module, help).
A bench module provides `add_arguments(parser)` and `main(args) -> int`. Add a line here
to add a bench; common.py has the shared timing, table and report helpers.
"""

BENCHES = {
    "ops": ("torch_tpu.bench.ops",
            "per-op time: Strict eager on tpu vs CPU eager vs a bare jax.jit call; Llama step"),
}
