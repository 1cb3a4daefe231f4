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

Shipping programs (docs/SHIPPING_PROGRAMS.md): each executable that passes through this
cache, written after a compile or read, is also recorded (once per key) into PyTorch's
mega-cache as an `XlaArtifact` (type "torch_tpu_xla": its key and the checksummed entry, as
the file holds it), so that `torch.compiler.save_cache_artifacts()` carries every program
the process obtained: torch.compile graphs, eager ops, fused graphs, uploads and captures.
`load_cache_artifacts()` in another
process verifies each entry's checksum and writes it into this cache; with the cache off
there, the entries are held in memory instead (a cache with no folder, that holds only
them), so that loading still spares the compile without writing anything to disk.
A key does not depend on the folder (`_install`), so an entry is found under any folder.
Counted: `xla.artifacts_recorded`, `xla.artifacts_loaded`, `xla.artifact_hits` (an
executable obtained from a loaded artifact; it is one of the `xla.cache_hits` too).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import tempfile
import threading
import warnings

import jax
from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager

from . import _config, _jax_internals, metrics

_MAGIC = b"TTPU1"
_DIGEST = 32
_state = {"dir": None, "cache": None, "listening": False}
_hit = threading.local()
_loaded: dict = {}  # loaded artifacts' keys -> their entry, held in memory (None: on disk)
_record_lock = threading.Lock()  # (compile_ahead's threads record too)
_recorded: set = set()  # the keys recorded for the mega-cache
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a file name in the cache folder, no path


def cache_dir() -> pathlib.Path | None:
    """The directory in use, or None when the persistent cache is off."""
    return _state["dir"]


def _frame(value: bytes) -> bytes:
    return _MAGIC + hashlib.blake2b(value, digest_size=_DIGEST).digest() + value


def _unframe(data: bytes) -> bytes | None:
    """An entry's body, or None when its checksum does not match."""
    body = data[len(_MAGIC) + _DIGEST:]
    if (not data.startswith(_MAGIC) or hashlib.blake2b(body, digest_size=_DIGEST).digest()
            != data[len(_MAGIC):len(_MAGIC) + _DIGEST]):
        return None
    return body


class _CheckedCache:
    """JAX's cache interface (get/put by key) over files with a checksum each; with no
    folder (`path` None: the cache is off), only the artifacts loaded into memory."""

    def __init__(self, path: pathlib.Path | None):
        self._path = path
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> pathlib.Path:
        return self._path / f"{key}.xla"

    def get(self, key: str) -> bytes | None:
        _hit.artifact = key in _loaded  # (_listen: counted once JAX has loaded it)
        data = _loaded.get(key)
        if data is None:
            if self._path is None:
                return None
            f = self._file(key)
            try:
                data = f.read_bytes()
            except FileNotFoundError:
                return None
            except OSError as e:
                warnings.warn(f"torch_tpu: cannot read compilation cache entry {f.name}: {e}")
                return None
        body = _unframe(data)
        if body is None:
            warnings.warn(f"torch_tpu: corrupt compilation cache entry {key}.xla ignored "
                          "(checksum mismatch); compiling again")
            try:
                if self._path is not None:
                    self._file(key).unlink()
            except OSError:
                pass
            return None
        _record(key, data)
        return body

    def put(self, key: str, value: bytes) -> None:
        data = _frame(value)
        _record(key, data)
        self._write(key, data)

    def _write(self, key: str, data: bytes) -> None:
        if self._path is None:
            return
        f = self._file(key)
        if f.exists():
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self._path, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, f)  # atomic: readers see the whole entry or none
        except OSError as e:
            warnings.warn(f"torch_tpu: cannot write compilation cache entry {f.name}: {e}")

    def clear(self) -> None:
        if self._path is not None:
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
    _install(cache, 0.0)  # cache everything: eager ops compile in milliseconds, hundreds of them
    _state["dir"] = target
    return target


def _install(cache, min_seconds) -> None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_raise_persistent_cache_errors", False)
    # JAX would put the cache folder into every program's compile options (XLA's GPU
    # autotune cache, set on every platform), hence into its key: under another folder,
    # or none, a program's key would differ and no shipped artifact would be found
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    _jax_internals.set_persistent_cache(cache)
    _state["cache"] = cache


def disable() -> None:
    """Turn the persistent cache off (executables compiled from now on stay in memory)."""
    jax.config.update("jax_compilation_cache_dir", None)
    _jax_internals.set_persistent_cache(None)
    _state["dir"] = _state["cache"] = None


# ---------------------------------------------------------------- shipped programs
def _record(key: str, data: bytes) -> None:
    with _record_lock:
        if key in _recorded:
            return
        _recorded.add(key)
        CacheArtifactManager.record_artifact(XlaArtifact.type(), key, data)
    metrics.count("xla.artifacts_recorded")


def load(key: str, data: bytes) -> None:
    """An artifact's entry into the persistent cache, where JAX finds it by its key; with
    the cache off, into a cache with no folder that holds the loaded entries in memory.
    A damaged entry (checksum) is left out with a warning: its program compiles."""
    body = _unframe(data) if _KEY.fullmatch(key) else None
    if body is None:
        warnings.warn(f"torch_tpu: corrupt compiled-program artifact {key[:80]!r} ignored "
                      "(checksum mismatch or not a cache key); its program will compile again")
        return
    cache = _state["cache"]
    if cache is None:
        # it looks up the loaded entries and writes nothing: so that JAX serializes no
        # executable for it, it takes none (the minimum compile time to be cached: inf)
        cache = _CheckedCache(None)
        _install(cache, float("inf"))
    if cache._path is None:
        _loaded[key] = data
    else:
        cache._write(key, data)  # (recorded once an executable is obtained from it)
        _loaded[key] = None
    metrics.count("xla.artifacts_loaded")


@CacheArtifactFactory.register
class XlaArtifact(CacheArtifact):
    """One XLA executable of a torch.compile graph in torch.compiler's mega-cache: JAX's
    persistent-cache key and the checksummed entry. Registered on import of torch_tpu,
    as load_cache_artifacts needs it before it reads one (CacheInfo then has
    `torch_tpu_xla_artifacts`)."""

    @staticmethod
    def type() -> str:
        return "torch_tpu_xla"

    def populate_cache(self) -> None:
        load(self.key, self.content)


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
                if getattr(_hit, "artifact", False):
                    _hit.artifact = False
                    metrics.count("xla.artifact_hits")
            else:
                metrics.count("xla.compiles")
            metrics.counters["xla.compile_ms"] += int(seconds * 1000)
            events = getattr(_hit, "events", None)
            if events is not None:
                events.append((disk, seconds))

    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
