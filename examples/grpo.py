"""GRPO (group relative policy optimization) in plain PyTorch, on tpu.

    python examples/grpo.py                        # Strict eager (the default mode)
    TORCH_TPU_DEFER_AND_FUSE=1 python examples/grpo.py   # or --mode defer_and_fuse
    python examples/grpo.py --compile              # torch.compile(backend="tpu") on the forward
    python examples/grpo.py --device cpu           # the same loop on PyTorch's CPU eager

One iteration: sample G completions for each of N prompts from the policy (temperature and
top-k, drawn by the device's generator); score them; normalize each reward within its
prompt's group (the advantage); one forward of a frozen reference copy; then the clipped
policy-gradient loss with a KL penalty against the reference, and an AdamW step. The toy
task rewards the fraction of completion tokens that equal TARGET, so the printed reward
curve starts near 1/vocab and rises within a few dozen iterations.

The loop itself is `torch_tpu_tools.grpo` (installed with torch_tpu), which
`python -m torch_tpu bench rl` also times; this script is its command line. Nothing in it
is specific to tpu but the device string. Every shape of the loop is fixed, so after the
first two iterations no iteration compiles a program, in any eager mode or compiled.
`--programs` prints the running count of compiled programs
(torch.tpu.compile_cache_stats) after each iteration.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from torch_tpu_tools.grpo import GRPO, Config, compiled_programs, prompt_batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--device", default="tpu")
    p.add_argument("--mode", default=None, help="eager mode: strict, debug or defer_and_fuse "
                                                "(default: from the environment)")
    p.add_argument("--compile", action="store_true", help='torch.compile(backend="tpu") the forward')
    p.add_argument("--programs", action="store_true", help="print compiled programs per iteration")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the curves")
    for f in dataclasses.fields(Config):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args()
    cfg = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
    if args.mode:
        import torch_tpu

        torch_tpu.set_eager_mode(args.mode)
    grpo = GRPO(cfg, args.device, compile=args.compile)
    counting = args.programs and args.device != "cpu"
    rewards, losses, programs = [], [], []
    t0 = time.perf_counter()
    for i, prompts in enumerate(prompt_batches(cfg, args.iterations)):
        reward, loss = grpo.step(prompts)
        rewards.append(reward)
        losses.append(loss)
        line = f"iteration {i + 1:3d}  reward {reward:.3f}  loss {loss:+.4f}"
        if counting:
            programs.append(compiled_programs())
            line += f"  programs {programs[-1]}"
        print(line, flush=True)
    k = min(5, len(rewards))
    print(f"{args.iterations} iterations in {time.perf_counter() - t0:.1f} s; reward "
          f"{sum(rewards[:k]) / k:.3f} (first {k}) -> {sum(rewards[-k:]) / k:.3f} (last {k})")
    if args.json:
        print("RESULT " + json.dumps({"rewards": rewards, "losses": losses, "programs": programs}))


if __name__ == "__main__":
    main()
