"""The persistent compilation cache: XLA executables on disk, shared across processes.

Every XLA program torch_tpu runs, eager ops and compiled graphs alike, goes through
`jax.jit`, so JAX's persistent compilation cache covers all of them. `setup()` points it
at `TORCH_TPU_CACHE_DIR` (default `$XDG_CACHE_HOME/torch_tpu/xla`, i.e.
`~/.cache/torch_tpu/xla`; set it to "" or "0" to turn the cache off), caches every entry
however fast it compiled, and installs `_CheckedCache` as JAX's cache backend:
  - each entry carries a checksum, and writes are atomic (temp file + rename), so a torn,
    truncated or bit-flipped entry is detected before XLA deserializes it: it is deleted,
    reported with a warning, and the program is compiled again;
  - JAX keys entries by the program, the compile options, the jax/jaxlib versions and
    the backend, so an incompatible entry is never looked up; if XLA still fails to load
    one, JAX warns and compiles (never raises: `jax_raise_persistent_cache_errors` off).

What is counted (torch_tpu.metrics), per process, through JAX's monitoring events:
  - `xla.compiles`: executables XLA compiled from scratch in this process;
  - `xla.cache_hits`: executables loaded from the persistent cache instead;
  - `xla.compile_ms`: the milliseconds those compiles and loads took.
Every executable a process obtains is exactly one of the two, so a second process that
runs the same program shows `xla.compiles == 0`. (`executables_compiled`, counted by the
eager executor, counts jitted functions it creates, whether or not XLA then compiles.)
`watch()` hands the same outcomes, per executable, to whoever is compiling a program on
this thread (_program_cache.py: the disk hits of each program).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import tempfile
import threading
import warnings

import jax

from . import _config, _jax_internals

_MAGIC = b"TTPU1"
_DIGEST = 32
_state = {"dir": None, "listening": False}
_hit = threading.local()


def cache_dir() -> pathlib.Path | None:
    """The directory in use, or None when the persistent cache is off."""
    return _state["dir"]


class _CheckedCache:
    """JAX's cache interface (get/put by key) over files with a checksum each."""

    def __init__(self, path: pathlib.Path):
        self._path = path
        path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> pathlib.Path:
        return self._path / f"{key}.xla"

    def get(self, key: str) -> bytes | None:
        f = self._file(key)
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            warnings.warn(f"torch_tpu: cannot read compilation cache entry {f.name}: {e}")
            return None
        body = data[len(_MAGIC) + _DIGEST:]
        if (not data.startswith(_MAGIC)
                or hashlib.blake2b(body, digest_size=_DIGEST).digest()
                != data[len(_MAGIC):len(_MAGIC) + _DIGEST]):
            warnings.warn(f"torch_tpu: corrupt compilation cache entry {f.name} ignored "
                          "(checksum mismatch); compiling again")
            try:
                f.unlink()
            except OSError:
                pass
            return None
        return body

    def put(self, key: str, value: bytes) -> None:
        f = self._file(key)
        if f.exists():
            return
        data = _MAGIC + hashlib.blake2b(value, digest_size=_DIGEST).digest() + value
        try:
            fd, tmp = tempfile.mkstemp(dir=self._path, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, f)  # atomic: readers see the whole entry or none
        except OSError as e:
            warnings.warn(f"torch_tpu: cannot write compilation cache entry {f.name}: {e}")

    def clear(self) -> None:
        for f in self._path.glob("*.xla"):
            f.unlink(missing_ok=True)


def setup(path: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turn the persistent cache on at `path` (default: from TORCH_TPU_CACHE_DIR). Call
    before the first compile; torch_tpu calls it on import. Returns the directory."""
    _listen()
    target = pathlib.Path(path) if path is not None else _config.get("TORCH_TPU_CACHE_DIR")
    if target is None:
        return None
    try:
        cache = _CheckedCache(target)
    except OSError as e:
        warnings.warn(f"torch_tpu: compilation cache disabled, cannot use {target}: {e}")
        return None
    jax.config.update("jax_compilation_cache_dir", str(target))
    # cache everything: eager ops compile in milliseconds, and there are hundreds
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_raise_persistent_cache_errors", False)
    _jax_internals.set_persistent_cache(cache)
    _state["dir"] = target
    return target


def disable() -> None:
    """Turn the persistent cache off (executables compiled from now on stay in memory)."""
    jax.config.update("jax_compilation_cache_dir", None)
    _jax_internals.set_persistent_cache(None)
    _state["dir"] = None


@contextlib.contextmanager
def watch():
    """A list that receives (from_disk, seconds) for each executable this thread obtains
    inside the block (nested blocks also pass theirs to the outer one)."""
    outer = getattr(_hit, "events", None)
    mine: list = []
    _hit.events = mine
    try:
        yield mine
    finally:
        _hit.events = outer
        if outer is not None:
            outer.extend(mine)


def _listen() -> None:
    if _state["listening"]:
        return
    _state["listening"] = True
    from . import metrics

    cache_hit, backend_compile = _jax_internals.compile_events()

    def on_event(event, **kwargs):
        if event == cache_hit:
            _hit.flag = True

    def on_duration(event, seconds, **kwargs):
        if event == backend_compile:
            # one event per executable obtained, after the cache lookup inside it
            disk = getattr(_hit, "flag", False)
            if disk:
                _hit.flag = False
                metrics.count("xla.cache_hits")
            else:
                metrics.count("xla.compiles")
            metrics.counters["xla.compile_ms"] += int(seconds * 1000)
            events = getattr(_hit, "events", None)
            if events is not None:
                events.append((disk, seconds))

    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
