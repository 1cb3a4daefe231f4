"""`python -m torch_tpu report`: what the program caches did, for the current cache folder.

Each process that compiled or looked up programs saves its `compile_cache_stats()` into
the persistent cache folder's `runs/` when it ends (_program_stats.save_run; the newest
20 are kept). This command prints, for that folder (TORCH_TPU_CACHE_DIR, or --cache-dir):
  - the disk cache: entries and bytes, the largest programs by name;
  - each of the last runs (--runs, default 1): per kind of program the lookups, hits in
    memory and on disk, misses, XLA compiles, evictions, programs and bytes held; the
    programs that took longest to compile, with why each compiled; recompile storms;
  - the program dumps in TORCH_TPU_DUMP_DIR, when it is set.
`text(stats)` formats the same for a live process: `print(torch_tpu_tools.report.text())`.
"""
from __future__ import annotations

import collections
import datetime
import json
import pathlib

_KIND_NAMES = {"op": "op executables / entries", "graph": "DeferAndFuse graphs",
               "compiled": "torch.compile programs"}
_COLUMNS = ("requests", "memory_hits", "misses", "disk_hits", "xla_compiles", "evictions",
            "held", "bytes")


def _mb(n) -> str:
    return f"{n / (1 << 20):.1f} MB"


def text(stats: dict | None = None, top: int = 10) -> str:
    """A run's stats (default: this process's, now) as the report prints them."""
    if stats is None:
        from torch_tpu import _program_stats

        stats = _program_stats.stats()
    lines = []
    width = max(len(c) for c in _COLUMNS)
    header = f"  {'':26s}" + "".join(f"{c:>{width + 1}s}" for c in _COLUMNS)
    lines.append(header)
    for kind, row in stats["kinds"].items():
        cells = "".join(f"{(_mb(row[c]) if c == 'bytes' else row[c])!s:>{width + 1}s}"
                        for c in _COLUMNS)
        lines.append(f"  {_KIND_NAMES.get(kind, kind):26s}{cells}")
    lim = stats.get("limits", {})
    lines.append(f"  held: {stats['held']} programs, {_mb(stats['bytes'])} (bound: "
                 f"{lim.get('programs')} programs, {lim.get('mb')} MB); compile time "
                 f"{stats.get('compile_seconds', 0):.2f} s; recompile storms warned: "
                 f"{stats.get('recompile_storms', 0)}; cache-only: {stats.get('cache_only')}")
    programs = sorted(stats.get("programs", []), key=lambda p: -p["compile_seconds"])
    if programs:
        lines.append(f"  slowest compiles (of {len(programs)} held):")
        for p in programs[:top]:
            disk = {True: "disk hit", False: "compiled", None: "not run"}[p["disk_hit"]]
            lines.append(f"    {p['compile_seconds'] * 1000:9.1f} ms  {p['kind']:8s} "
                         f"{p['name'][:40]:40s} {disk:9s} at {p['where']}: {p['reason']}")
    storms = stats.get("storms") or []
    if storms:
        lines.append("  sites that kept recompiling for new shapes:")
        lines.extend(f"    {s['what']} at {s['where']}: {s['recompiles']} recompiles; "
                     f"{s['varying'][:140]}" for s in storms[:top])
    reasons = stats.get("recompile_reasons") or []
    if reasons:
        lines.append("  last fused-graph recompile reasons:")
        lines.extend(f"    {r[:160]}" for r in reasons[-5:])
    return "\n".join(lines)


def disk_lines(folder: pathlib.Path, top: int = 8) -> list[str]:
    """The persistent cache folder: its entries, grouped by program name."""
    by_name: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for f in folder.glob("*.xla"):
        try:
            size = f.stat().st_size
        except OSError:
            continue
        name = f.stem.rsplit("-", 1)[0]  # JAX's key: "<module name>-<hash>"
        by_name[name] += size
        counts[name] += 1
    total = sum(by_name.values())
    lines = [f"disk cache {folder}: {sum(counts.values())} executables, {_mb(total)}"]
    for name, size in by_name.most_common(top):
        lines.append(f"  {_mb(size):>10s}  {counts[name]:5d} x {name}")
    return lines


HELP = "the program caches of the last runs: memory and disk hits, compile times"


def add_arguments(p) -> None:
    p.add_argument("--cache-dir", type=pathlib.Path, default=None,
                   help="the persistent cache folder (default: TORCH_TPU_CACHE_DIR's)")
    p.add_argument("--runs", type=int, default=1, help="how many of the last runs to print")
    p.add_argument("--json", action="store_true", help="print the last runs' stats as JSON")


def main(args) -> int:
    from torch_tpu import _config

    folder = args.cache_dir or _config.get("TORCH_TPU_CACHE_DIR")
    if folder is None:
        print("the persistent cache is off (TORCH_TPU_CACHE_DIR is 0 or empty): nothing saved")
        return 1
    folder = pathlib.Path(folder)
    runs = sorted((folder / "runs").glob("*.json"))[-max(args.runs, 1):]
    loaded = []
    for path in runs:
        try:
            loaded.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if args.json:
        print(json.dumps(loaded, indent=1))
        return 0
    print("\n".join(disk_lines(folder)))
    if not loaded:
        print(f"no runs saved in {folder / 'runs'} yet (each process saves its stats there "
              "when it ends)")
    for run in loaded:
        when = datetime.datetime.fromtimestamp(run.get("time", 0)).isoformat(" ", "seconds")
        argv = " ".join(run.get("argv", []))[:100]
        print(f"\nrun of {when} (pid {run.get('pid')}): {argv}")
        print(text(run))
    dump = _config.get("TORCH_TPU_DUMP_DIR")
    if dump is not None and dump.is_dir():
        files = sorted(dump.glob("*.mlir"))
        print(f"\nprogram dumps in {dump}: {len(files)} StableHLO files"
              + (f", the newest {files[-1].name}" if files else ""))
    return 0
