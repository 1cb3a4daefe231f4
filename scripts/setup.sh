#!/usr/bin/env bash
# Idempotent developer setup: .venv, pinned dependencies, and torch_tpu installed in
# editable mode with its C++ extension built. Works on a fresh clone; a second run with
# nothing changed takes about a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
LOG="$VENV/setup.log"

log() { echo "setup: $*" >&2; }

# Run a command with its output in $LOG; on failure, show the log and stop.
quiet() {
    if ! "$@" >>"$LOG" 2>&1; then
        log "FAILED: $*"
        log "---- last lines of $LOG ----"
        tail -n 60 "$LOG" >&2
        exit 1
    fi
}

# ---------------------------------------------------------------- the virtualenv
if [ ! -x "$VENV/bin/python" ]; then
    PY="${PYTHON:-}"
    if [ -z "$PY" ]; then
        if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
    fi
    log "creating .venv with $PY"
    "$PY" -m venv "$VENV"
fi
: >"$LOG"
PYBIN="$VENV/bin/python"
pip_install() { quiet "$PYBIN" -m pip install -q "$@"; }

# ---------------------------------------------------------------- torch, first and pinned
# Installing anything that depends on torch before torch itself lets pip pick an unpinned
# (multi-GB CUDA) build; with torch==2.13.0 in place, later installs see it satisfied.
if ! "$PYBIN" -c 'import sys, importlib.metadata as m; sys.exit(m.version("torch").split("+")[0] != "2.13.0")' 2>/dev/null; then
    log "installing torch==2.13.0"
    pip_install torch==2.13.0
fi

# ---------------------------------------------------------------- pinned dependencies
# Skipped while requirements-dev.txt is unchanged since the last successful install.
STAMP="$VENV/.requirements-dev.sha256"
REQ_SHA="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$REQ_SHA" ]; then
    log "installing requirements-dev.txt"
    pip_install -r requirements-dev.txt
    echo "$REQ_SHA" >"$STAMP"
fi

# ---------------------------------------------------------------- torch_tpu itself
# The editable install compiles src/torch_tpu/csrc/*.cpp (about 80 s). Rebuild only when a
# source is newer than the built extension, or the venv does not point at this tree.
needs_build() {
    local so
    so="$(ls -t src/torch_tpu/_C.*.so 2>/dev/null | head -n 1 || true)"
    [ -n "$so" ] || return 0
    for src in src/torch_tpu/csrc/* setup.py pyproject.toml; do
        [ "$src" -nt "$so" ] && return 0
    done
    local origin
    origin="$("$PYBIN" -c 'import importlib.util as u; s = u.find_spec("torch_tpu"); print(s.origin if s else "")' 2>/dev/null || true)"
    [ "$origin" = "$ROOT/src/torch_tpu/__init__.py" ] || return 0
    return 1
}
if needs_build; then
    log "building torch_tpu (C++ extension, about 80 s)"
    pip_install --no-build-isolation --no-deps -e .
    # pip's editable build can leave an old .so in place: make the mtime say "fresh"
    touch src/torch_tpu/_C.*.so
fi
log "ready ($VENV)"
