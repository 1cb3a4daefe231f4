"""Every `TORCH_TPU_*` setting, declared once; nothing else in the package reads them.

As with JAX's env-backed flags, each setting states its name, type, default, when the
package reads it and what it does; `get(name)` is the only way to read one, and the
settings table of docs/SETTINGS.md is generated from `SETTINGS` (`python -m torch_tpu settings --write`).
This module is a leaf: it imports nothing from torch_tpu, torch or jax, so every layer
can ask it without an import pointing up.

One parsing rule per type:
  bool        unset: the default; "", "0", "false", "off", "no" (any case, surrounding
              spaces ignored): False; anything else: True
  int, float  unset or blank: the default; otherwise the number (a ValueError names the
              variable)
  str         unset or blank: the default; otherwise the value, stripped
  path        unset: the default; blank or "0": None (off); otherwise the path, `~` expanded
  bytes       unset or blank: the default; otherwise a count of bytes: a whole number, or
              a number with a unit, KiB MiB GiB TiB (powers of 1024) or KB MB GB TB
              (powers of 1000), any case ("8GiB", "1.5 GB", "268435456")

`get` reads the environment on every call. When it is called is each setting's `read`:
a setting read at import keeps the value it had then; one read per op follows the
environment while the program runs (tests flip Debug's checks with the mode on).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

# When the package reads a setting (the `read` column of the table).
IMPORT = "import"                       # once, during `import torch_tpu`
PER_OP = "each op"                      # on every op that it concerns
DEVICE_START = "device start"           # once, when the tpu device is first used
INIT_PROCESS_GROUP = "init_process_group"
TORCHRUN_START = "device start (torchrun)"  # once, as the backend starts under torchrun

_FALSE = ("", "0", "false", "off", "no")
_TYPES = ("bool", "int", "float", "str", "path", "bytes")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: str
    # The value when the variable is unset; a callable is called then (a default that
    # depends on the rest of the environment). None: "not set", the caller decides.
    default: Any
    read: str
    doc: str
    default_doc: str | None = None  # how the table shows a computed or derived default

    def parse(self, raw: str | None):
        """The value of this setting for the environment string `raw` (None: unset)."""
        if raw is None:
            return self.default() if callable(self.default) else self.default
        value = raw.strip()
        if self.type == "bool":
            return value.lower() not in _FALSE
        if self.type == "path":
            return None if value in ("", "0") else pathlib.Path(value).expanduser()
        if not value:
            return self.parse(None)
        if self.type == "str":
            return value
        if self.type == "bytes":
            return self._bytes(raw, value)
        try:
            return int(value) if self.type == "int" else float(value)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r}: expected {'an' if self.type == 'int' else 'a'}"
                             f" {self.type}") from None

    def _bytes(self, raw: str, value: str) -> int:
        if value.isdigit():
            return int(value)
        number = value.rstrip("bBkKmMgGtTiI ")
        unit = value[len(number):].strip().lower() or "b"
        try:
            n = float(number) * _UNITS[unit]
        except (KeyError, ValueError):
            raise ValueError(f"{self.name}={raw!r}: expected a size in bytes, such as 268435456, "
                             f"8GiB or 512MiB (units: {', '.join(_UNITS)})") from None
        if not 0 <= n < 2**63:  # (negative, NaN, infinite)
            raise ValueError(f"{self.name}={raw!r}: expected a size in bytes from 0 to 2**63")
        return int(n)

    def shown_default(self) -> str:
        if self.default_doc is not None:
            return self.default_doc
        if self.type == "bool":
            return "1" if self.default else "0"
        return "unset" if self.default is None else f"`{self.default}`"


def _default_cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "torch_tpu" / "xla"


_DECLARED = [
    # ---- eager modes and ops
    Setting("TORCH_TPU_LAUNCH_BLOCKING", "bool", False, IMPORT,
            "Debug mode: every op waits for its result and runs extra checks, so an error "
            "surfaces at the line that caused it (wins over TORCH_TPU_DEFER_AND_FUSE)"),
    Setting("TORCH_TPU_DEFER_AND_FUSE", "bool", False, IMPORT,
            "DeferAndFuse mode: ops are recorded and run as one fused XLA program at each sync "
            "point (`.item()`, `.cpu()`, print, synchronize, ...), at each `backward()` call, "
            "and once per loop iteration in loops that never sync"),
    Setting("TORCH_TPU_COMPILE_WINDOW", "bool", True, IMPORT,
            "Strict: an op with no compiled program opens a compile window; the ops after it "
            "are traced while its XLA compile runs on a worker thread, and run, each as its "
            "own program, at the next sync (eager/window.py); 0: each new program compiles "
            "and runs at its call"),
    Setting("TORCH_TPU_CPU_FALLBACK", "bool", False, IMPORT,
            "ops that have no tpu lowering yet run on the CPU (slow; counted in "
            "`torch_tpu.metrics` and warned once per op) instead of raising "
            "`NotImplementedError`. Also `torch_tpu.set_cpu_fallback(True)`"),
    Setting("TORCH_TPU_READ_TIMEOUT_S", "float", 1800.0, IMPORT,
            "a read of device values (`.item()`, `.cpu()`, synchronize, each op in Debug "
            "mode) that waits this long for a value that never becomes ready ends the "
            "process with a message naming the read or op, its line and every thread's "
            "stack, as NCCL's watchdog does (_waits.py); under tpu_dist at least the "
            "group's timeout plus a minute; 0: wait forever"),
    Setting("TORCH_TPU_DEBUG_NAN_CHECK", "bool", True, PER_OP,
            "Debug mode: an op that turns finite inputs into NaN raises "
            "`TpuNonFiniteError`"),
    Setting("TORCH_TPU_DEBUG_INF_CHECK", "bool", False, PER_OP,
            "Debug mode, with the NaN check on: an op that turns finite inputs into Inf "
            "raises `TpuNonFiniteError` too (off: models make -inf on purpose, T5's "
            "log(0) buckets and GPT-Neo's summed finfo.min masks)"),
    Setting("TORCH_TPU_DEBUG_CPU_CHECK", "bool", False, PER_OP,
            "Debug mode: every op runs again on CPU, and a result that differs beyond the "
            "dtype's tolerance raises `TpuCpuMismatchError`"),
    Setting("TORCH_TPU_DEVICE_ASSERTS", "bool", True, IMPORT,
            "Strict and DeferAndFuse: indexing ops (index, gather, scatter, index_put, "
            "embedding, take, nll_loss targets, ...) compute an on-device validity flag, and "
            "an index out of range raises `DeviceAssertError` (\"device-side assert "
            "triggered\", a RuntimeError) at the next synchronization, naming the op and the "
            "line (Debug raises at the call regardless)"),
    Setting("TORCH_TPU_C_FAST_PATH", "bool", True, IMPORT,
            "the eager hot path's C copies of Python mechanisms: the argument scan "
            "(csrc/scan.cpp), DeferAndFuse recording with no Python frame (csrc/kernel.cpp), and "
            "compiled programs called through PJRT without jax.jit's dispatch (csrc/direct.cpp); "
            "0: every op goes through the Python reference (slower; for tests that compare both)"),
    Setting("TORCH_TPU_CPU_ATEN_KERNELS", "bool", True, IMPORT,
            "on the CPU platform only: bfloat16 matrix products inside XLA programs run "
            "ATen's CPU kernel (oneDNN) as an XLA custom call instead of XLA:CPU's own, "
            "~10x slower one (_cpu_kernels.py); 0: XLA:CPU's kernels everywhere. No effect on "
            "TPU or GPU"),
    Setting("TORCH_TPU_XLA_CPU_THREADS", "int", None, DEVICE_START,
            "CPU platform only: the threads of XLA:CPU's intra-op pool in this process "
            "(jaxlib reads `NPROC`, which wins when set). Unset: a process alone keeps "
            "jaxlib's default (every core it may use); when torchrun starts several on one "
            "host (LOCAL_WORLD_SIZE > 1), each gets its share, cores / LOCAL_WORLD_SIZE, as "
            "each CUDA rank owns its GPU (2-process FSDP2 and TP steps ran 1.1-1.16x faster "
            "than with every process's pool on every core)",
            default_doc="cores / local processes"),
    Setting("TORCH_TPU_JAX_TRACEBACKS", "bool", False, IMPORT,
            "jaxlib's record of the Python stack at every executable call and traced "
            "equation (a result array's `traceback`, MLIR source locations): off, as torch_tpu "
            "reads none of it and it cost ~2 µs an op in a model's forward; 1: on, as JAX "
            "has it (for JAX code in the same process that wants it)"),
    Setting("TORCH_TPU_DONATE", "bool", True, IMPORT,
            "DeferAndFuse donates to XLA the buffers a flush overwrites and nothing else "
            "holds, so results are written in place (lower peak memory)"),
    # ---- runtime, caches, reports
    Setting("TORCH_TPU_PLATFORM", "str", None, DEVICE_START,
            "which PJRT platform to use (`tpu`, `cuda`, `cpu`) when several are installed; "
            "`cpu` is also the way to ask for the CPU on a host whose accelerator is busy or "
            "broken: an accelerator that fails to start raises (docs/DEVICES.md), it never "
            "falls back",
            default_doc="JAX's choice"),
    Setting("TORCH_TPU_MEMORY_LIMIT", "bytes", None, DEVICE_START,
            "the device's memory capacity (`get_device_properties().total_memory`): an "
            "allocation past it raises `torch.OutOfMemoryError`. On a TPU or GPU it can only "
            "lower what the device reports",
            default_doc="the device's memory; on XLA:CPU half the host memory (the cgroup "
                        "limit if lower), shared by the local processes of a torchrun job"),
    Setting("TORCH_TPU_CACHE_DIR", "path", _default_cache_dir, IMPORT,
            "the persistent compilation cache (eager and `torch.compile` executables): a "
            "second process running the same program compiles nothing; empty or `0` turns "
            "it off", default_doc="`$XDG_CACHE_HOME/torch_tpu/xla` (`~/.cache/torch_tpu/xla`)"),
    Setting("TORCH_TPU_METRICS", "bool", False, IMPORT,
            "print `torch_tpu.metrics.report()` when the process ends"),
    Setting("TORCH_TPU_PROGRAM_CACHE_MAX_PROGRAMS", "int", 4096, IMPORT,
            "the most programs (Strict's op executables and recorded op entries, "
            "DeferAndFuse's fused graphs, torch.compile executables) kept in memory; past it "
            "the least recently used is evicted (`programs.<kind>.evictions` in "
            "`torch_tpu.metrics`)"),
    Setting("TORCH_TPU_PROGRAM_CACHE_MAX_MB", "int", 2048, IMPORT,
            "the most megabytes of compiled programs kept in memory (XLA's code size; on "
            "XLA:CPU, which reports none, 1.5 MB a program), evicted least recently used first"),
    Setting("TORCH_TPU_BUCKETS", "str", None, PER_OP,
            "Sizes (comma- or space-separated) that lengths which vary are compiled at, "
            "e.g. HF generate's cache capacity; past the largest, and by default, powers of "
            "two from 16 (`torch_tpu.set_buckets` overrides it)", default_doc="powers of two"),
    Setting("TORCH_TPU_BUCKETED_TRAINER", "bool", True, PER_OP,
            "HF `Trainer` on tpu pads each batch of its data loaders along the sequence to "
            "its bucket (a batch with an attention mask, from any collator), so dynamic "
            "padding compiles one program set per bucket, and TRL's GRPO and RLOO trainers "
            "pad completions to multiples of min(64, max_completion_length) (their "
            "`pad_to_multiple_of=\"auto\"`); 0: batches as the collator made them"),
    Setting("TORCH_TPU_BUCKETED_COLLATORS", "bool", True, PER_OP,
            "Once this process uses tpu, HF's padding collators (`DataCollatorWithPadding`, "
            "`...ForSeq2Seq`, `...ForLanguageModeling`, `...ForTokenClassification`) pad each "
            "batch with an attention mask to its bucket, in any loop; 0: as they pad"),
    Setting("TORCH_TPU_CAPACITY", "bool", True, IMPORT,
            "a tensor a loop grows a step at a time (`torch.cat` of each new token, "
            "`torch.arange(0, t)`) is held at its length's bucket, and row-wise ops on it run "
            "at that capacity: one program set per bucket (op/capacity.py); 0: per length"),
    Setting("TORCH_TPU_BUCKETED_GENERATE", "bool", True, PER_OP,
            "HF `generate()` on tpu decodes at a bucketed capacity (one program set per "
            "bucket, not per token); 0 runs transformers' own loop"),
    Setting("TORCH_TPU_CAPTURED_GENERATE", "bool", True, PER_OP,
            "bucketed `generate()` captures its decode step (torch.tpu.graph) and replays it, "
            "one launch per token, in Strict and DeferAndFuse; 0 decodes op by op"),
    Setting("TORCH_TPU_RECOMPILE_WARN", "int", 8, PER_OP,
            "warn (`RecompileWarning`, once per site) when one op at one line, one fused op "
            "sequence or one compiled graph has recompiled this many times for new shapes, "
            "naming the dimension that varies (read at each compile); 0: never"),
    Setting("TORCH_TPU_COMPILE_AHEAD", "bool", True, PER_OP,
            "torch.compile: each graph's XLA compile starts on a worker thread as the graph "
            "is handed over (the backward's too), so it overlaps torch's tracing and the "
            "other graphs' compiles (read at each graph); 0 compiles at the first call"),
    Setting("TORCH_TPU_DUMP_DIR", "path", None, PER_OP,
            "write every compiled program's StableHLO into this folder, one `.mlir` file "
            "each, headed by its key, the reason it compiled and its precision (read at "
            "each compile)"),
    # ---- distributed (tpu_dist)
    Setting("TORCH_TPU_DIST_HOSTNAME", "str", None, INIT_PROCESS_GROUP,
            "this host's address, for JAX's coordinator and gloo",
            default_doc="the interface that routes to MASTER_ADDR"),
    Setting("TORCH_TPU_COORDINATOR", "str", None, INIT_PROCESS_GROUP,
            "a fixed `host:port` for JAX's coordinator",
            default_doc="rank 0 picks a free port and publishes it in the store"),
    Setting("TORCH_TPU_DIST_HEARTBEAT_S", "int", None, INIT_PROCESS_GROUP,
            "seconds before JAX declares a silent process dead (a backstop: tpu_dist's "
            "links name a dead rank at once)",
            default_doc="the group timeout, clamped to 10-60"),
    Setting("TORCH_TPU_DIST_CHECK", "bool", True, IMPORT,
            "every collective first checks that all ranks issued the same one (one small "
            "all-gather); 0: faster small collectives, but a mismatch hangs or aborts in gloo"),
    Setting("TORCH_TPU_DIST_ASYNC_ERROR_HANDLING", "bool", True, IMPORT,
            "a failed, refused or timed-out collective, or a peer's death, ends the process "
            "with one message naming the rank at fault; 0: the message is printed and every "
            "later collective and device read raises it"),
    Setting("TORCH_TPU_DIST_SOCKET_SNDBUF", "bytes", 4 << 20, IMPORT,
            "XLA:CPU only: the send buffer each process fixes on the gloo sockets that XLA's "
            "cross-process collectives open (distributed/_sockets.py); 0 leaves it as "
            "gloo sets it", default_doc="4 MiB"),
    Setting("TORCH_TPU_DIST_WATCHDOG_POLL_S", "float", 0.05, IMPORT,
            "seconds between the watchdog's looks at the collectives in flight"),
    Setting("TORCH_TPU_DIST_EARLY_INIT", "bool", True, TORCHRUN_START,
            "under torchrun, start the distributed runtime when the tpu device is first "
            "used, even before init_process_group"),
    Setting("TORCH_TPU_DIST_INIT_TIMEOUT_S", "int", 600, TORCHRUN_START,
            "the rendezvous timeout of that early start, in seconds"),
]

SETTINGS: dict[str, Setting] = {}
for _s in _DECLARED:
    if _s.name in SETTINGS or not _s.name.startswith("TORCH_TPU_") or _s.type not in _TYPES:
        raise ValueError(f"bad or duplicate setting declaration {_s.name} ({_s.type})")
    SETTINGS[_s.name] = _s
del _s


def get(name: str):
    """The value of setting `name` in the environment now (see the module doc's rules)."""
    try:
        setting = SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared torch_tpu setting (torch_tpu/_config.py)") \
            from None
    return setting.parse(os.environ.get(name))


def is_set(name: str) -> bool:
    """Whether setting `name` is in the environment at all (else `get` gives its default)."""
    return SETTINGS[name].name in os.environ


def undeclared() -> list[str]:
    """TORCH_TPU_* variables set in this environment that torch_tpu does not read (typos)."""
    return sorted(k for k in os.environ if k.startswith("TORCH_TPU_") and k not in SETTINGS)


def markdown_table() -> str:
    """The settings table of docs/SETTINGS.md (between its marker comments)."""
    rows = ["| variable | type | default | read at | effect |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        cells = [f"`{s.name}`", s.type, s.shown_default(), s.read, s.doc]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"

# docs/SETTINGS.md holds the table between these two lines; `python -m torch_tpu settings
# --write` rewrites what is between them, and a test fails when it is stale.
TABLE_BEGIN = ("<!-- settings table: generated from src/torch_tpu/_config.py by "
                "`python -m torch_tpu settings --write`; do not edit by hand -->")
TABLE_END = "<!-- end of settings table -->"


def with_table(text: str) -> str:
    """`text` (a markdown file) with the part between the markers replaced by `markdown_table()`."""
    start = text.find(TABLE_BEGIN)
    end = text.find(TABLE_END, start)
    if start < 0 or end < 0:
        raise ValueError("the file lacks the settings table markers:\n"
                         f"{TABLE_BEGIN}\n{TABLE_END}")
    return text[:start + len(TABLE_BEGIN)] + "\n" + markdown_table() + text[end:]
