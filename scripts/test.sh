#!/usr/bin/env bash
# Set up (idempotent), then run the test suite. Arguments go to pytest, e.g.
# `bash scripts/test.sh -k add -x`, or `bash scripts/test.sh tests/test_cli.py` to run
# only the paths given. `--fast` (the edit loop, a few minutes) leaves out the tests
# marked slow or distributed (pyproject.toml); CI runs everything. "No tests collected"
# (pytest's exit code 5) counts as success; every other failure is the script's exit code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
targets=(tests)
args=()
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        args=(-m "not slow and not distributed" "${args[@]}")  # a later -m of the caller wins
        continue
    fi
    if [ -e "${arg%%::*}" ]; then targets=(); fi  # the caller named test paths
    args+=("$arg")
done
rc=0
"$ROOT/.venv/bin/python" -m pytest -q --durations=30 "${targets[@]}" "${args[@]}" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    rc=0
fi
exit "$rc"
