"""`python -m torch_tpu bench NAME`: benchmarks that measure tpu against references side by
side, in one process, and write their tables and charts into OUT/PERFORMANCE.md (`--out`,
default ./docs).

`BENCHES` is the dispatch table: name -> (module, help).
A bench module provides `add_arguments(parser)` (with common.add_output_arguments: `--out`,
`--no-write`) and `main(args) -> int`. Add a line here to add a bench; common.py has the
shared timing, table and report helpers.
"""

BENCHES = {
    "ops": ("torch_tpu_tools.bench.ops",
            "per-op time: Strict eager on tpu vs CPU eager vs a bare jax.jit call; Llama step"),
    "compile": ("torch_tpu_tools.bench.compile", "small Llama and GPT: torch.compile(backend='tpu') vs eager modes, CPU eager, inductor, jax.jit"),
    "collectives": ("torch_tpu_tools.bench.collectives", "tpu_dist all_reduce/all_gather/reduce_scatter bus bandwidth vs gloo, 2 processes, 4 KB-64 MB"),
    "scaling": ("torch_tpu_tools.bench.scaling", "Llama train/generate across widths 64-1024 and 128-4096 tokens: eager modes, compiled, CPU eager, inductor, jax.jit; ratio vs FLOPs"),
    "modes": ("torch_tpu_tools.bench.modes", "eager modes on small Llama/Qwen2: Strict vs DeferAndFuse vs Debug vs CPU eager (train, generate, memory, per-op recording)"),
    "generate": ("torch_tpu_tools.bench.generate", "HF generate() decode tokens/s on a tiny Llama: Strict, DeferAndFuse (captured and op by op), Debug, compiled vs CPU eager and jax.jit"),
    "graphs": ("torch_tpu_tools.bench.graphs", "capture and replay (torch.tpu.graph) vs Strict, DeferAndFuse and CPU eager: small Llama train step, tiny Llama decode step"),
    "soak": ("torch_tpu_tools.bench.soak", "1,000 training steps with generation: RSS, device bytes, objects and programs stay flat (OUT/RELIABILITY.md)"),
    "dist": ("torch_tpu_tools.bench.dist", "FSDP2 and tensor-parallel Llama training steps at 1, 2, 4 processes: tpu_dist (Strict, DeferAndFuse) vs gloo on CPU"),
    "rl": ("torch_tpu_tools.bench.rl", "the GRPO loop (torch_tpu_tools.grpo, run by examples/grpo.py): rollout, scoring, reference, update on tpu (Strict, DeferAndFuse, compiled) vs CPU eager"),
    "loops": ("torch_tpu_tools.bench.loops", "loops users write (HF generate, a KV-cache loop, nanoGPT generate, a training step with a read): whole calls, each mode against CPU eager, ATen and XLA kernels"),
    "shapes": ("torch_tpu_tools.bench.shapes", "varying shapes (issue 15): generate at 16/64/256 tokens, variable-length training, the source[i:i+bptt] loop, cold generate in fresh processes; programs, cold s, warm vs CPU eager; --clients: Trainer dynamic padding, GRPO, nanoGPT generate, first steps"),
}

HELP = "benchmarks: bench NAME (see `bench --help`)"


def add_arguments(p) -> None:
    import importlib

    sub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (module, help_) in BENCHES.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_bench_module=module)
        importlib.import_module(module).add_arguments(sp)


def main(args) -> int:
    import importlib

    return importlib.import_module(args._bench_module).main(args)
