#!/usr/bin/env bash
# Set up (idempotent), then train a small Llama on tpu and on CPU side by side.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --steps 50`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m torch_tpu demo "$@"
