#!/usr/bin/env bash
# The one setup entry point for agentrl on a fresh machine. Idempotent: a second run only checks.
#
#   scripts/setup.sh            # apt packages, .venv, torch (CPU build where there is no GPU), agentrl[dev]
#
# Each stage lives in scripts/setup/ and is skipped when its inputs have not changed since its last
# successful run (a stamp under .venv/.stamps holds the hash of those inputs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AGENTRL_ROOT="$ROOT"
cd "$ROOT"

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*" >&2; }

# run_stage NAME SCRIPT INPUT_FILES...: runs SCRIPT unless the stamp matches the inputs' hash. The
# hash also covers $STAGE_SALT (settings from the environment that change what the stage installs).
run_stage() {
  local name="$1" script="$2"; shift 2
  local stamp_dir="$ROOT/.venv/.stamps" hash
  hash="$({ cat "$script" "$@" 2>/dev/null; printf '%s' "${STAGE_SALT:-}"; } | sha256sum | cut -c1-16)"
  if [[ -f "$stamp_dir/$name" && "$(cat "$stamp_dir/$name")" == "$hash" ]]; then
    log "$name: up to date"
    return 0
  fi
  log "$name: running"
  bash "$script"
  mkdir -p "$stamp_dir"
  echo "$hash" > "$stamp_dir/$name"
}

bash scripts/setup/apt.sh                  # cheap check each time (packages can vanish on a new machine)
bash scripts/setup/venv.sh                 # creates .venv if missing
run_stage python-deps scripts/setup/python-deps.sh pyproject.toml setup.py
for extra in scripts/setup/extra-*.sh; do  # later stages (SGLang CPU build, sandbox image, ...)
  [[ -e "$extra" ]] || continue
  stage="$(basename "$extra" .sh)"
  # a stage's inputs besides its script: files under scripts/setup/<name>-* (extra-sglang -> sglang-*)
  mapfile -t inputs < <(find scripts/setup -path "scripts/setup/${stage#extra-}-*" -type f \
                          -not -path '*/__pycache__/*' | LC_ALL=C sort)
  # the install mode a stage honours (AGENTRL_SGLANG_INSTALL for extra-sglang), so that a `skip` run
  # does not mark the stage done for a later default run
  salt_var="AGENTRL_${stage#extra-}_INSTALL"; salt_var="${salt_var^^}"; salt_var="${salt_var//-/_}"
  STAGE_SALT="${!salt_var:-auto}" run_stage "$stage" "$extra" "${inputs[@]}"
done
log "done: activate with 'source .venv/bin/activate'"
