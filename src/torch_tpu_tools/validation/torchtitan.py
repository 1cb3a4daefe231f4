"""`python -m torch_tpu validate torchtitan` (set up and run by `bash scripts/torchtitan.sh`):
torchtitan's llama3 debug model, unmodified, under torchrun on tpu (tpu_dist) and on the CPU
(gloo), per parallel configuration; the loss of every step compared, the warm step times
compared, docs/TORCHTITAN.md written.

torchtitan lives in its own environment, `.venv-torchtitan` (scripts/torchtitan.sh builds
it, requirements-torchtitan.txt pins it): a venv that reuses `.venv`'s packages through a
.pth file, with torchtitan's dependencies (and triton, which torchtitan imports without
declaring it) on top, and each torchtitan version in its own `--target` folder
(`torchtitan-<version>`), picked per run through PYTHONPATH. `.venv` itself never gets
torchtitan or triton. Every run is one torchrun job of torchtitan_launch.py (what it
adapts around torchtitan is said there).

Parity: both devices start every configuration from one seed checkpoint per torchtitan
version (torchtitan's own `--checkpoint.create_seed_checkpoint`, made once on the CPU in one
process), and read the same data (the local assets of torchtitan_assets.py), so the
losses of the two runs of a configuration should agree step by step up to rounding.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ENV = pathlib.Path(".venv-torchtitan")  # in the checkout, where scripts/torchtitan.sh runs
SETUP = "bash scripts/torchtitan.sh --setup"
TOLERANCE = 2e-3  # max |loss difference| per step (measured <= 1.5e-4): bf16 mixed precision rounds differently


@dataclasses.dataclass(frozen=True)
class Config:
    key: str
    version: str
    label: str
    nproc: int
    parallelism: tuple = ()  # (torchtitan parallelism field, value) pairs


CONFIGS = {c.key: c for c in [
    Config("0.2.2/1", "0.2.2", "1 process", 1, (("data_parallel_shard_degree", 1),)),
    Config("0.2.2/fsdp2", "0.2.2", "FSDP=2", 2, (("data_parallel_shard_degree", 2),)),
    Config("0.2.2/tp2", "0.2.2", "TP=2", 2,
           (("data_parallel_shard_degree", 1), ("tensor_parallel_degree", 2))),
    Config("0.2.2/fsdp2xtp2", "0.2.2", "FSDP=2 x TP=2", 4,
           (("data_parallel_shard_degree", 2), ("tensor_parallel_degree", 2))),
    Config("0.2.2/hsdp2x2", "0.2.2", "HSDP (2 replicas x 2 shards)", 4,
           (("data_parallel_replicate_degree", 2), ("data_parallel_shard_degree", 2))),
    Config("0.3.0/1", "0.3.0", "1 process", 1, (("data_parallel_shard_degree", 1),)),
    # 0.3.0's default SPMD backend, spmd_types, hands FSDP2 plain parameters with a
    # `dp_mesh_dims` that torch 2.13.0's fully_shard accepts for DTensors only (ValueError on
    # CPU and tpu alike); its "partial_dtensor" backend is FSDP2 as 0.2.2 uses it.
    Config("0.3.0/fsdp2", "0.3.0", "FSDP=2 (spmd_backend partial_dtensor)", 2,
           (("data_parallel_shard_degree", 2), ("spmd_backend", "partial_dtensor"))),
]}
QUICK = ("0.2.2/1", "0.2.2/fsdp2", "0.3.0/1")  # the pytest marker's short run


@dataclasses.dataclass
class Shape:
    """What each run trains: torchtitan's debug model with these overrides."""
    steps: int = 10
    seq_len: int = 2048  # the debug model's own
    batch: int = 8  # local batch size, the debug model's own

    def args(self) -> list[str]:
        return ["--training.steps", str(self.steps), "--training.seq_len", str(self.seq_len),
                "--training.local_batch_size", str(self.batch)]


def python(env: pathlib.Path = ENV) -> pathlib.Path:
    return env / "bin" / "python"


def target(version: str, env: pathlib.Path = ENV) -> pathlib.Path:
    return env / f"torchtitan-{version}"


def missing(versions, env: pathlib.Path = ENV) -> str | None:
    """Why the torchtitan environment cannot run `versions`, or None when it can."""
    if not python(env).exists():
        return f"no torchtitan environment at {env} (set it up with `{SETUP}`)"
    for v in versions:
        if not (target(v, env) / "torchtitan" / "train.py").exists():
            return f"torchtitan {v} is not installed in {env} (set it up with `{SETUP}`)"
    return None


def _version_args(version: str, work: pathlib.Path, dump: pathlib.Path) -> list[str]:
    if version == "0.2.2":  # a toml per job (the wheel ships none: torchtitan_assets.py)
        return ["--job.config_file", str(work / "debug_model.toml"),
                "--job.dump_folder", str(dump)]
    return ["--module", "llama3", "--config", "llama3_debugmodel", "--dump_folder", str(dump)]


def _environ(device: str, version: str, work: pathlib.Path, env_dir: pathlib.Path,
             mode: str = "strict") -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(target(version, env_dir))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_CACHE=str(work / "hf-cache"), TOKENIZERS_PARALLELISM="false")
    env.pop("TORCH_TPU_DEFER_AND_FUSE", None)
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # no tpu in the baseline's process
    else:
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        if mode == "defer_and_fuse":
            env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    return env


def _torchrun(nproc: int, device: str, record: pathlib.Path | None, env_dir: pathlib.Path,
              titan_args: list[str]) -> list[str]:
    cmd = [str(python(env_dir)), "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(nproc), "-m", "torch_tpu_tools.validation.torchtitan_launch",
           "--device", device]
    if record is not None:
        cmd += ["--record", str(record)]
    return cmd + ["--", *titan_args]


def _error(log: pathlib.Path) -> str:
    """The exception line of a failed run's log (rank 0's, else the last one)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    found = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and ":" in ln
             and not ln.lstrip().startswith(("File", "Traceback"))
             and "ChildFailedError" not in ln and "error_file" not in ln]
    ranked = [ln for ln in found if ln.startswith("[rank0]")] or found
    return (ranked[-1] if ranked else (lines[-1] if lines else "no output"))[:300]


def _run(cmd: list[str], env: dict, cwd: pathlib.Path, log: pathlib.Path,
         timeout: float) -> str | None:
    """Run one torchrun job, its output in `log`; the error, or None when it succeeded."""
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout,
                                start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s"
    return None if rc == 0 else f"exit {rc}: {_error(log)}"


def seed(version: str, work: pathlib.Path, env_dir: pathlib.Path, timeout: float) -> pathlib.Path:
    """The seed checkpoint of `version` (made once, on the CPU, in one process)."""
    step0 = work / f"seed-{version}" / "checkpoint" / "step-0"
    if (step0 / ".metadata").exists():
        return step0
    dump = work / f"seed-{version}"
    shutil.rmtree(dump, ignore_errors=True)
    dump.mkdir(parents=True)
    args = _version_args(version, work, dump) + [
        "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
        "--parallelism.data_parallel_shard_degree", "1", "--debug.seed", "0"]
    err = _run(_torchrun(1, "cpu", None, env_dir, args), _environ("cpu", version, work, env_dir),
               work, dump / "seed.log", timeout)
    if err or not (step0 / ".metadata").exists():
        raise RuntimeError(f"torchtitan {version}: the seed checkpoint failed: {err} "
                           f"(log {dump / 'seed.log'})")
    return step0


def run_one(cfg: Config, device: str, shape: Shape, work: pathlib.Path, runs: pathlib.Path,
            env_dir: pathlib.Path, timeout: float, mode: str = "strict") -> dict:
    """One torchrun job of `cfg` on `device`: {"losses", "times", "log"} or {"error", "log"}."""
    name = f"{cfg.key.replace('/', '-')}-{device}"
    dump = runs / name
    dump.mkdir(parents=True, exist_ok=True)
    record, log = dump / "steps.jsonl", dump / "run.log"
    record.unlink(missing_ok=True)
    parallel = [a for k, v in cfg.parallelism for a in (f"--parallelism.{k}", str(v))]
    args = (_version_args(cfg.version, work, dump) + shape.args() + parallel
            + ["--checkpoint.enable", "--checkpoint.folder", "checkpoint",
               "--checkpoint.initial_load_path", str(seed(cfg.version, work, env_dir, timeout)),
               "--checkpoint.load_only"])
    t0 = time.perf_counter()
    err = _run(_torchrun(cfg.nproc, device, record, env_dir, args),
               _environ(device, cfg.version, work, env_dir, mode), work, log, timeout)
    steps = [json.loads(ln) for ln in record.read_text().splitlines()] if record.exists() else []
    out = {"log": str(log), "wall_s": time.perf_counter() - t0,
           "losses": [s["loss"] for s in steps], "times": [s["time"] for s in steps]}
    if err is None and len(steps) != shape.steps:
        err = f"{len(steps)} of {shape.steps} steps logged"
    if err is not None:
        out["error"] = err
    return out


def step_time(times: list[float], warmup: int) -> float:
    """The median wall time of the steps after the first `warmup` (a step's time: the
    interval between its loss read-back and the previous one's)."""
    gaps = [b - a for a, b in zip(times, times[1:])][max(warmup - 1, 0):]
    return statistics.median(gaps) if gaps else float("nan")


def compare(cpu: dict, tpu: dict, warmup: int) -> dict:
    row = {"cpu_error": cpu.get("error"), "tpu_error": tpu.get("error")}
    n = min(len(cpu["losses"]), len(tpu["losses"]))
    row["steps"] = n
    row["max_diff"] = (max(abs(a - b) for a, b in zip(cpu["losses"][:n], tpu["losses"][:n]))
                       if n else float("nan"))
    row["cpu_s"], row["tpu_s"] = step_time(cpu["times"], warmup), step_time(tpu["times"], warmup)
    row["ratio"] = row["tpu_s"] / row["cpu_s"] if row["cpu_s"] > 0 else float("nan")
    row["cpu_losses"], row["tpu_losses"] = cpu["losses"], tpu["losses"]
    row["ok"] = (not row["cpu_error"] and not row["tpu_error"] and n > 0
                 and row["max_diff"] <= TOLERANCE)
    return row


def run(keys, shape: Shape, env_dir: pathlib.Path = ENV, warmup: int = 2,
        timeout: float = 3600, mode: str = "strict", progress=None, keep: bool = False) -> dict:
    """Run each configuration on the CPU (gloo), then on tpu; {key: comparison row}."""
    from . import torchtitan_assets

    configs = [CONFIGS[k] for k in keys]
    env_dir = pathlib.Path(env_dir).resolve()  # the runs' working directory is elsewhere
    reason = missing({c.version for c in configs}, env_dir)
    if reason:
        raise RuntimeError(reason)
    work = env_dir / "work"
    torchtitan_assets.write(work)
    runs = pathlib.Path(tempfile.mkdtemp(prefix="runs-", dir=work))
    results = {}
    for cfg in configs:
        done = {}
        for device in ("cpu", "tpu"):
            if progress is not None:
                progress.set_postfix_str(f"{cfg.key} on {device}", refresh=True)
            done[device] = run_one(cfg, device, shape, work, runs, env_dir, timeout, mode)
            if progress is not None:
                progress.update(1)
        results[cfg.key] = {**compare(done["cpu"], done["tpu"], warmup),
                            "logs": [done["cpu"]["log"], done["tpu"]["log"]]}
    if not keep and all(r["ok"] for r in results.values()):
        shutil.rmtree(runs, ignore_errors=True)
    return results


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x != x else format(x, spec)


def table(results: dict) -> str:
    from ..bench import common

    rows = []
    for key, r in results.items():
        c = CONFIGS[key]
        err = "; ".join(f"{d}: {r[f'{d}_error']}" for d in ("cpu", "tpu") if r[f"{d}_error"])
        rows.append([f"torchtitan {c.version}", c.label, c.nproc, r["steps"],
                     _fmt(r["max_diff"], ".2e"), _fmt(r["tpu_s"], ".2f"),
                     _fmt(r["cpu_s"], ".2f"), _fmt(r["ratio"], ".2f") + ("x" if r["ratio"] == r["ratio"] else ""),
                     "PASS" if r["ok"] else f"FAIL {err}".strip()])
    return common.markdown_table(
        ["torchtitan", "configuration", "processes", "steps", "max abs loss diff",
         "tpu s/step", "CPU s/step", "tpu / CPU", "parity"], rows)


def markdown(results: dict, shape: Shape, mode: str, warmup: int, loads: tuple,
             command: str, environment: str, notes: str = "") -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# torchtitan on tpu",
        "",
        "torchtitan's llama3 debug model (6.2 M parameters), **unmodified** (its wheels, no "
        "edits), trained under torchrun on tpu (`tpu_dist`) and on the CPU (gloo), from one "
        "seed checkpoint per torchtitan version, on the same local data. Each row is a pair "
        "of runs; the loss of every step is compared, and the step times are the median of "
        f"the steps after the first {warmup} (compilation), each step timed from one loss "
        "read-back to the next.",
        "",
        "Generated by the command below; do not edit by hand. Set up and run with "
        "`bash scripts/torchtitan.sh` (arguments go to `python -m torch_tpu validate "
        "torchtitan`); the pytest marker `torchtitan` (tests/clients/test_torchtitan.py) runs "
        "a short version, outside the default test run.",
        "",
        f"Produced by `{command}` on {stamp}.  ",
        f"{environment}.  ",
        f"Load average (1, 5, 15 min) at the start: {loads[0]}; at the end: {loads[1]}.  ",
        f"Each run: `--training.steps {shape.steps} --training.seq_len {shape.seq_len} "
        f"--training.local_batch_size {shape.batch}` (the debug model's own: 10, 2048, 8); "
        f"tpu eager mode: {mode}.",
        "",
        table(results),
        "",
        notes,  # docs/bench_notes/torchtitan.md: the reading of the figures, kept by hand
        "",
        "## Losses per step",
        "",
    ]
    for key, r in results.items():
        c = CONFIGS[key]
        lines += [f"- torchtitan {c.version}, {c.label}: CPU "
                  + ", ".join(f"{x:.5f}" for x in r["cpu_losses"]) + "; tpu "
                  + ", ".join(f"{x:.5f}" for x in r["tpu_losses"])]
    lines += ["", _HOW]
    return "\n".join(lines) + "\n"


_HOW = """## How the runs are made

- The environment: `.venv-torchtitan` (gitignored), built by `bash scripts/torchtitan.sh
  --setup` from `requirements-torchtitan.txt`: a venv whose `.pth` file adds `.venv`'s
  packages (torch, torch_tpu, datasets, tokenizers), torchtitan's other dependencies and
  triton (which torchtitan imports without declaring it) on top, and each torchtitan version
  in its own `--target` folder, installed with `--no-deps` (0.2.2 and 0.3.0 cannot be
  installed side by side). `.venv` and the default test run never see torchtitan or triton.
- The assets: the wheels ship neither torchtitan's `tests/assets` (the `c4_test` data set,
  the test tokenizer) nor 0.2.2's `debug_model.toml`. A synthetic deterministic corpus, a BPE
  tokenizer trained on it (vocabulary 2000, under the model's 2048) and the toml (0.2.2's,
  verbatim) are written on first use (`torchtitan_assets.py`). 0.3.0 takes its config from
  its own registry (`--module llama3 --config llama3_debugmodel`).
- The CPU baseline: torchtitan picks its device from
  `torch._utils._get_available_device_type()`, which names none on a CPU-only torch; the
  launcher (`torchtitan_launch.py`) makes it say "cpu" and gives torchtitan `torch.cpu`
  with the memory calls it makes, and gloo follows. torch refuses flex_attention's
  backward on CPU inputs and inductor cannot compile it for the CPU, so for 0.3.0 (whose
  debug model uses FlexAttention through `torch.compile`) the baseline runs flex_attention
  eagerly, torch's dense implementation; tpu compiles it (`compile/flex.py`).
- The CPU baseline with FSDP: torchtitan sets FSDP2's gradient divide factor, so FSDP2
  reduce-scatters with `ReduceOp.PREMUL_SUM`, which gloo lacks (tpu_dist has it); the
  launcher makes FSDP2 use its own `force_sum_reduction_for_comms` (SUM; the factor is 1).
- Both: torchtitan 0.3.0 calls `torch.distributed.set_timeout`, which torch 2.13.0 has as
  `distributed_c10d._set_pg_timeout`; the launcher supplies the name.
"""


HELP = "torchtitan's llama3 debug model on tpu vs CPU (gloo), per parallel configuration"


def add_arguments(p) -> None:
    from ..bench import common

    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated configurations (default: all): " + ", ".join(CONFIGS)
                   + f"; 'quick' is {','.join(QUICK)}")
    p.add_argument("--steps", type=int, default=Shape.steps)
    p.add_argument("--seq-len", type=int, default=Shape.seq_len)
    p.add_argument("--batch", type=int, default=Shape.batch, help="local batch size")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps left out of the step time (default 2)")
    p.add_argument("--mode", choices=("strict", "defer_and_fuse"), default="strict",
                   help="torch_tpu's eager mode in the tpu runs")
    p.add_argument("--env", type=pathlib.Path, default=ENV,
                   help=f"the torchtitan environment (default ./{ENV})")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    common.add_output_arguments(p, "TORCHTITAN.md")


def main(args) -> int:
    from ..bench import common

    keys = list(QUICK) if args.configs == "quick" else [k for k in args.configs.split(",") if k]
    unknown = [k for k in keys if k not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    reason = missing({CONFIGS[k].version for k in keys}, args.env)
    if reason:
        raise SystemExit(reason)
    shape = Shape(args.steps, args.seq_len, args.batch)
    load0 = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    from tqdm import tqdm

    with tqdm(total=2 * len(keys), desc="validate torchtitan", unit="run",
              dynamic_ncols=True, file=sys.stderr) as bar:
        results = run(keys, shape, args.env, args.warmup, args.timeout, args.mode, bar,
                      args.keep)
    load1 = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(table(results))
    for r in results.values():
        if not r["ok"]:
            print("logs:", *r["logs"])
    if not args.no_write:
        path = args.out / "TORCHTITAN.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown(results, shape, args.mode, args.warmup, (load0, load1),
                                 common.command_line(), common.environment_line(),
                                 common.notes(args.out, "torchtitan")))
        print(f"\nwrote {path}")
    return 0 if all(r["ok"] for r in results.values()) else 1
