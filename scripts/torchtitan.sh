#!/usr/bin/env bash
# torchtitan as a client: set up .venv-torchtitan (idempotent), then run torchtitan's llama3
# debug model, unmodified, on tpu and on the CPU (gloo) per parallel configuration, and write
# docs/TORCHTITAN.md. Arguments go to `python -m torch_tpu validate torchtitan`, e.g.
# `bash scripts/torchtitan.sh --configs quick --steps 4`. `--setup` only sets up;
# `--test` runs the pytest marker `torchtitan` (tests/clients/test_torchtitan.py) instead.
#
# .venv-torchtitan is a venv on the same interpreter whose .pth file adds .venv's packages
# (torch, torch_tpu, ...); requirements-torchtitan.txt goes on top, and each torchtitan
# version into its own --target folder, --no-deps. .venv itself never gets torchtitan or triton.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
VENV="$ROOT/.venv-torchtitan"
REQ="$ROOT/requirements-torchtitan.txt"
LOG="$VENV/setup.log"

log() { echo "torchtitan.sh: $*" >&2; }
quiet() {
    if ! "$@" >>"$LOG" 2>&1; then
        log "FAILED: $*"
        tail -n 60 "$LOG" >&2
        exit 1
    fi
}

if [ ! -x "$VENV/bin/python" ]; then
    log "creating .venv-torchtitan"
    "$ROOT/.venv/bin/python" -m venv "$VENV"
fi
: >"$LOG"
PYBIN="$VENV/bin/python"
# .venv's packages, .pth files included (torch_tpu's editable install is one), come after
# this venv's own: `import site; site.addsitedir(...)` in a .pth runs at every start.
DEV_SITE="$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SITE="$("$PYBIN" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$DEV_SITE')" >"$SITE/_torch_tpu_dev_venv.pth"

STAMP="$VENV/.requirements-torchtitan.sha256"
REQ_SHA="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$REQ_SHA" ]; then
    log "installing requirements-torchtitan.txt"
    # the file is its own constraints file: torch stays .venv's 2.13.0, nothing unpinned
    quiet "$PYBIN" -m pip install -q -c "$REQ" -r "$REQ"
    for spec in $(sed -n 's/^# *\(torchtitan==[0-9.]*\)$/\1/p' "$REQ"); do
        version="${spec#torchtitan==}"
        log "installing $spec into .venv-torchtitan/torchtitan-$version"
        rm -rf "$VENV/torchtitan-$version"
        quiet "$PYBIN" -m pip install -q --no-deps --target "$VENV/torchtitan-$version" "$spec"
    done
    echo "$REQ_SHA" >"$STAMP"
fi
log "ready ($VENV)"

case "${1:-}" in
    --setup) exit 0 ;;
    --test) shift; exec "$ROOT/.venv/bin/python" -m pytest -q -m torchtitan tests/clients "$@" ;;
esac
exec "$ROOT/.venv/bin/python" -m torch_tpu validate torchtitan "$@"
