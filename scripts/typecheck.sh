#!/usr/bin/env bash
# Type-checks the whole agentrl namespace, including the folders that install into it
# (tools/ -> agentrl.tools, environments/ -> agentrl.environments). mypy cannot follow the
# package-dir mapping, so it checks a tree of symbolic links laid out as the installed package.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tree="$ROOT/.cache/typecheck"
rm -rf "$tree" && mkdir -p "$tree/agentrl"
for entry in "$ROOT"/agentrl/*; do
  ln -s "$entry" "$tree/agentrl/$(basename "$entry")"
done
ln -s "$ROOT/tools" "$tree/agentrl/tools"
ln -s "$ROOT/environments" "$tree/agentrl/environments"
cd "$tree"
exec "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.mypy_cache" agentrl "$@"
