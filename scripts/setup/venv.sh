#!/usr/bin/env bash
# Creates the project's virtualenv at .venv (git-ignored) if it does not exist yet.
set -euo pipefail
ROOT="${AGENTRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
PY="${AGENTRL_PYTHON:-python3}"
if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
  echo "[setup] creating .venv with $($PY --version)" >&2
  "$PY" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
fi
