#!/usr/bin/env bash
# Installs megatron-core 0.19.2 (the train.backend = "megatron" backend) into the project's .venv. Idempotent.
#
# The 0.19.2 wheel is tagged cp311 but declares Requires-Python >= 3.12, so on the project's Python 3.11
# it is installed with --no-deps --ignore-requires-python; its hard dependencies (torch, numpy,
# packaging >= 24.2) are already pinned by the project. triton is needed even on CPU: the pipeline
# schedules import a MoE module that imports triton unconditionally. No Transformer Engine or Apex:
# megatron-core falls back to torch norms and optimizers (GPU clusters add TE themselves).
# Override with AGENTRL_MEGATRON_INSTALL=auto|skip.
set -euo pipefail
ROOT="${AGENTRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
PY="$ROOT/.venv/bin/python"
PIP=("$PY" -m pip install -q)
MEGATRON_VERSION="0.19.2"

mode="${AGENTRL_MEGATRON_INSTALL:-auto}"
case "$mode" in
  skip) exit 0 ;;
  auto) ;;
  *) echo "[setup] AGENTRL_MEGATRON_INSTALL=$mode: expected auto or skip" >&2; exit 2 ;;
esac
echo "[setup] megatron: megatron-core==$MEGATRON_VERSION (+ triton 3.9.0)" >&2
"${PIP[@]}" "packaging>=24.2"
"${PIP[@]}" --no-deps --ignore-requires-python "megatron-core==$MEGATRON_VERSION"
"${PIP[@]}" "triton==3.9.0"

"$PY" - <<'PY'
import sys
from importlib.metadata import version

got = version("megatron-core")
if got != "0.19.2":
    sys.exit(f"[setup] megatron: megatron-core {got} installed, expected 0.19.2")
if not version("torch").startswith("2.13.0"):
    sys.exit(f"[setup] megatron: torch {version('torch')} after install, expected 2.13.0")
PY
