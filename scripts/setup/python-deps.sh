#!/usr/bin/env bash
# torch 2.13.0 first (on a machine without a GPU this resolves to the CPU build kept on local disk;
# a bare `torch` would pull a multi-GB CUDA build), then agentrl itself, editable, with dev extras.
set -euo pipefail
ROOT="${AGENTRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
PIP=("$ROOT/.venv/bin/python" -m pip install -q)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e "$ROOT[dev]"
