"""What `bench modes` measures and reports with: the variants and workloads, the issue's
targets and the result records (the model's spec is workloads/decoder.py's). A leaf module,
so that the measuring (modes.py) and the report (modes_report.py) both import it and not
each other."""
from __future__ import annotations

import dataclasses
import statistics

VARIANTS = ("strict", "defer_and_fuse", "debug", "cpu")
LABELS = {"strict": "Strict", "defer_and_fuse": "DeferAndFuse", "debug": "Debug",
          "cpu": "CPU eager"}
KINDS = ("llama", "qwen2")
KIND_LABELS = {"llama": "Llama", "qwen2": "Qwen2"}
TRAIN, INFER = "train", "infer"

TARGET_DEFER_VS_STRICT = 1.5   # the floor (the reference's claim); aim 2x
TARGET_DEFER_VS_CPU_TRAIN = 1.0
# issue 34: warm decode (generate) tokens/s against CPU eager's, per mode
TARGET_DECODE_VS_CPU = {"strict": 1.0, "defer_and_fuse": 1.5}
TARGET_MEM_RATIO = 1.0
TARGET_RECORD_US = 5.0
TARGET_ASSERTS_COST = 0.05     # device-side asserts: at most +5% on the training step


@dataclasses.dataclass
class WorkloadResult:
    kind: str
    workload: str
    tokens: int                                                  # per call
    seconds: dict = dataclasses.field(default_factory=dict)      # variant -> median s per call
    best: dict = dataclasses.field(default_factory=dict)         # variant -> fastest call s
    peak: dict = dataclasses.field(default_factory=dict)         # variant -> peak bytes (max)
    resident: dict = dataclasses.field(default_factory=dict)     # variant -> own bytes
    first_s: dict = dataclasses.field(default_factory=dict)      # variant -> first call s
    first_counts: dict = dataclasses.field(default_factory=dict)
    warm_counts: dict = dataclasses.field(default_factory=dict)
    counts: dict = dataclasses.field(default_factory=dict)       # over the measured calls
    samples: dict = dataclasses.field(default_factory=dict)      # variant -> number of calls
    errors: dict = dataclasses.field(default_factory=dict)
    agree: dict = dataclasses.field(default_factory=dict)        # variant -> matches CPU?
    reasons: list = dataclasses.field(default_factory=list)      # fused recompile reasons

    def tok_s(self, v: str) -> float:
        s = self.seconds.get(v, float("nan"))
        return self.tokens / s if s == s and s > 0 else float("nan")

    def ratio(self, a: str, b: str) -> float:
        x, y = self.tok_s(a), self.tok_s(b)
        return x / y if x == x and y == y and y > 0 else float("nan")

    def best_ratio(self, a: str, b: str) -> float:
        """Throughput ratio of the fastest calls: what each variant costs when the other
        jobs on the machine leave it alone."""
        x, y = self.best.get(a), self.best.get(b)
        return y / x if x and y else float("nan")


@dataclasses.dataclass
class RecordResult:
    n_ops: int
    us: dict = dataclasses.field(default_factory=dict)   # name -> median µs per op
    us_best: dict = dataclasses.field(default_factory=dict)  # name -> fastest round's µs per op
    flushed_while_recording: int = 0
    errors: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class AssertsResult:
    """The small Llama's training step with device-side asserts on and off (op/asserts.py):
    mode -> (seconds of the measured steps on, off), the two lists taken in the same rounds;
    `host`: the same steps' CPU time on the Python thread (what waiting for a core, on a
    loaded machine, does not inflate)."""
    steps: int
    samples: dict = dataclasses.field(default_factory=dict)
    host: dict = dataclasses.field(default_factory=dict)
    errors: dict = dataclasses.field(default_factory=dict)

    def medians(self, mode: str) -> tuple:
        on, off = self.samples[mode]
        return _median(on), _median(off)

    def cost(self, mode: str) -> float:
        """Fraction the asserts add to the step: median on / median off - 1."""
        on, off = self.medians(mode)
        return on / off - 1 if off > 0 else float("nan")

    def paired_cost(self, mode: str, host: bool = False) -> float:
        """The median over rounds of (step on / step off of the same round) - 1: steadier
        when the machine's load drifts. `host`: of the Python thread's CPU time."""
        on, off = (self.host if host else self.samples)[mode]
        return _median([a / b for a, b in zip(on, off) if b > 0]) - 1


def _median(xs):
    return statistics.median(xs) if xs else float("nan")
