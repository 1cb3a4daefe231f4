#!/usr/bin/env bash
# Set up (idempotent), then run the test suite. Arguments go to pytest, e.g.
# `bash scripts/test.sh -k add -x`, or `bash scripts/test.sh tests/tools/test_cli.py` to run
# only the paths given. `--fast` (the edit loop, a few minutes) leaves out the tests
# marked slow or distributed (pyproject.toml); CI runs everything else, on two pytest workers
# (pytest-xdist; a later `-n 0` of the caller runs it in one process). "No tests collected"
# (pytest's exit code 5) counts as success; every other failure is the script's exit code.
# The tests marked torchtitan (their own environment, scripts/torchtitan.sh) are always
# left out unless the caller's own -m asks for them: `bash scripts/torchtitan.sh --test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
targets=(tests)
args=()
marker="not torchtitan"  # a later -m of the caller wins
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        marker="not slow and not distributed and not torchtitan"
        continue
    fi
    if [ -e "${arg%%::*}" ]; then targets=(); fi  # the caller named test paths
    args+=("$arg")
done
# The whole suite runs on two workers; named paths run in this process, as the edit loop
# wants. (Grouping the process-job tests onto one worker, `--dist loadgroup`, does nothing
# with pytest 9.2: xdist 3.8 marks a group in `item._nodeid`, which pytest 9 no longer reads.)
workers=()
if [ "${targets[*]-}" = "tests" ]; then workers=(-n 2); fi
rc=0
"$ROOT/.venv/bin/python" -m pytest -q --durations=30 "${workers[@]}" "${targets[@]}" -m "$marker" "${args[@]}" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    rc=0
fi
exit "$rc"
