"""torch_tpu's tools, beside the runtime in the same distribution: the benchmarks (bench/),
the OpInfo and model-zoo sweeps (validation/), the demo, the `report` command, the shared
workloads they run, and the GRPO loop. They import the runtime `torch_tpu`; the runtime
never imports them. `python -m torch_tpu` finds their commands through the entry-point
group `torch_tpu.commands` (pyproject.toml)."""
