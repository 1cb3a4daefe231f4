#!/usr/bin/env bash
# Set up (idempotent), then run the test suite. Arguments go to pytest, e.g.
# `bash scripts/test.sh -k add -x`, or `bash scripts/test.sh tests/test_cli.py` to run
# only the paths given. "No tests collected" (pytest's exit code 5) counts as success;
# every other failure is the script's exit code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
targets=(tests)
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then targets=(); break; fi  # the caller named test paths
done
rc=0
"$ROOT/.venv/bin/python" -m pytest -q "${targets[@]}" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    rc=0
fi
exit "$rc"
