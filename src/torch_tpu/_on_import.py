"""Run a function right after a module is first imported: for registrations into libraries
that `import torch` must not load (DTensor costs ~2 s; accelerate is optional).

`when_imported(name, fn)` calls `fn()` now if the module is loaded, else once its code has
run: a one-shot finder at the front of sys.meta_path finds nothing itself, leaves at the
first import of `name`, and hands back the real spec with a loader that runs the module,
restores the original loader, then calls `fn`. An exception from `fn` becomes a warning:
the user's import never breaks over a registration.
"""
from __future__ import annotations

import importlib.abc
import sys
import warnings

_pending: dict = {}  # module name -> [fn, ...] waiting for its first import


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self._inner, self._name = inner, name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._inner
        for fn in _pending.pop(self._name, []):
            _call(fn)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_FINDER = _Finder()


def _call(fn) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"torch_tpu: {getattr(fn, '__qualname__', fn)} failed after an import: "
                      f"{e!r}", RuntimeWarning, stacklevel=3)


def when_imported(name: str, fn, loaded=lambda module: True) -> None:
    """`fn()` now if `name` is imported (and `loaded(module)`), else right after its first
    import."""
    module = sys.modules.get(name)
    if module is not None and loaded(module):
        _call(fn)
        return
    _pending.setdefault(name, []).append(fn)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def waiting(name: str) -> bool:
    """Whether something waits for the first import of `name`."""
    return bool(_pending.get(name))
