#!/usr/bin/env bash
# Installs SGLang 0.5.23 and sglang-router 0.3.2 into the project's .venv. Idempotent.
#
# GPU machine (nvidia-smi lists a GPU): the normal `pip install sglang==0.5.23` (CUDA torch, sgl-kernel,
# flashinfer; SGLang pins its own torch there) and torch-memory-saver (colocated placement).
# CPU-only machine: the slim recipe, which keeps torch 2.13.0 (CPU build), transformers 5.19.0 and
# tokenizers 0.23.2:
#   1. SGLang's own requirements minus the CUDA-only packages (sglang-cpu-requirements.txt, pinned),
#   2. sglang itself with --no-deps,
#   3. remove torchvision (the index wheel is linked against CUDA torch),
#   4. copy the shims (import-only sgl_kernel and torchvision; sitecustomize.py, which makes pinned
#      memory a no-op without an accelerator, for SGLang's LoRA layers; agentrl_sglang_models, the model
#      classes registered up front so the scheduler skips importing every model file) to
#      .venv/share/agentrl/sglang-cpu-shims;
#      the engine launcher puts that folder on the SGLang subprocess's PYTHONPATH only.
# Override the detection with AGENTRL_SGLANG_INSTALL=cpu|gpu|skip.
set -euo pipefail
ROOT="${AGENTRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
HERE="$ROOT/scripts/setup"
PY="$ROOT/.venv/bin/python"
PIP=("$PY" -m pip install -q)
SGLANG_VERSION="0.5.23"
ROUTER_VERSION="0.3.2"

mode="${AGENTRL_SGLANG_INSTALL:-auto}"
if [[ "$mode" == "auto" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    mode=gpu
  else
    mode=cpu
  fi
fi
echo "[setup] sglang: $mode install of sglang==$SGLANG_VERSION, sglang-router==$ROUTER_VERSION" >&2

case "$mode" in
  skip)
    exit 0
    ;;
  gpu)
    # torch-memory-saver: what --enable-memory-saver needs, so colocated engines really free their memory
    # around the train step (without it the engine refuses to start with the flag)
    "${PIP[@]}" "sglang==$SGLANG_VERSION" "sglang-router==$ROUTER_VERSION" "torch-memory-saver==0.0.10"
    ;;
  cpu)
    "${PIP[@]}" "torch==2.13.0"
    "${PIP[@]}" -r "$HERE/sglang-cpu-requirements.txt"
    "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
    "${PIP[@]}" "sglang-router==$ROUTER_VERSION"
    "$PY" -m pip uninstall -q -y torchvision 2>/dev/null || true
    shims="$ROOT/.venv/share/agentrl/sglang-cpu-shims"
    rm -rf "$shims"
    mkdir -p "$shims"
    cp -r "$HERE/sglang-cpu-shims/sgl_kernel" "$HERE/sglang-cpu-shims/torchvision" \
      "$HERE/sglang-cpu-shims/agentrl_sglang_models" "$HERE/sglang-cpu-shims/sitecustomize.py" "$shims/"
    find "$shims" -name __pycache__ -prune -exec rm -rf {} +
    ;;
  *)
    echo "[setup] AGENTRL_SGLANG_INSTALL=$mode: expected auto, cpu, gpu or skip" >&2
    exit 2
    ;;
esac

# The versions the rest of the project is pinned to must have survived.
"$PY" - "$mode" <<'PY'
import sys
from importlib.metadata import version

mode = sys.argv[1]
want = {"sglang": "0.5.23", "sglang-router": "0.3.2"}
if mode == "cpu":
    want.update({"transformers": "5.19.0", "tokenizers": "0.23.2"})
bad = {name: (version(name), expected) for name, expected in want.items() if version(name) != expected}
torch_version = version("torch")
if mode == "cpu" and not torch_version.startswith("2.13.0"):
    bad["torch"] = (torch_version, "2.13.0")
if bad:
    sys.exit(f"[setup] sglang: version drift after install (installed, expected): {bad}")
PY
