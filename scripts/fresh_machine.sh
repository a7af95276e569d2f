#!/usr/bin/env bash
# Time a fresh machine's setup and tests, phase by phase, as a newcomer meets them: a clean clone of HEAD with an
# empty HOME (no pip cache, no llama.cpp wheel, no GGUF cache), then `make setup` split into its phases and
# `make test`. Writes reports/fresh_machine.json (seconds per phase) into this checkout.
#
#   bash scripts/fresh_machine.sh [--no-test]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/nexus-fresh.XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone -q "$here" "$work/nexus"
mkdir -p "$work/home"
cd "$work/nexus"
export HOME="$work/home" CI=true
declare -a names=() secs=()
phase() {  # phase NAME MAKE-ARGS...
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  make "$@" > "$work/$name.log" 2>&1 || { echo "fresh_machine: $name failed:"; tail -30 "$work/$name.log"; exit 1; }
  names+=("$name"); secs+=("$(echo "$(date +%s.%N) - $t0" | bc)")
  echo "$name: ${secs[-1]} s"
}
phase venv_and_torch .venv/.stamp-torch
phase llama_cpp_build .venv/.stamp-llama
phase deps_and_protos proto
phase native native
phase gguf gguf
phase models models
phase setup_rest setup
[ "${1:-}" = "--no-test" ] || phase test test
{
  printf '{\n  "commit": "%s",\n  "date": "%s",\n  "cpus": %s,\n  "home": "empty (a new temporary directory)",\n  "phases_s": {' \
    "$(git rev-parse --short HEAD)" "$(date -u +%FT%TZ)" "$(nproc)"
  for i in "${!names[@]}"; do printf '%s\n    "%s": %.1f' "$([ "$i" -gt 0 ] && echo ,)" "${names[$i]}" "${secs[$i]}"; done
  tests="not run"
  [ -f "$work/test.log" ] && tests=$(grep -E '[0-9]+ passed' "$work/test.log" | tail -1 | tr -d '=' | xargs)
  printf '\n  },\n  "tests": "%s"\n}\n' "$tests"
} > "$here/reports/fresh_machine.json"
cat "$here/reports/fresh_machine.json"
