#!/usr/bin/env bash
# The README's main command, scripts/demo, runs to the end: it calibrates plans with
# statepool-quant, starts statepoold, parks, resumes and decodes with every codec through
# statepool-demo, asks statepoolctl and the HTTP API what fits, and stops the daemon with
# SIGTERM. A small model (2 layers x 4 heads) on free ports, so that it takes seconds.
# Usage: check_demo.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build_dir=$2

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
metrics_port=$(free_port)
api_port=$(free_port)
while [[ $api_port == "$metrics_port" ]]; do api_port=$(free_port); done

out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! STATEPOOL_BUILD_DIR="$build_dir" STATEPOOL_METRICS_PORT="$metrics_port" \
     STATEPOOL_API_PORT="$api_port" "$source_dir/scripts/demo" --layers 2 --heads 4 --slots 2 \
     --steps 8 --decode-tokens 2 >"$out" 2>&1; then
  cat "$out"
  echo "scripts/demo failed" >&2
  exit 1
fi
for expected in "STEPQuant plan: gdn, 2 layers x 4 heads" "codec stepquant6" "codec stepquant4" \
                "== what fits now" '"limited_by":"arena"' "statepoold exited with status 0"; do
  if ! grep -qF -- "$expected" "$out"; then
    cat "$out"
    echo "scripts/demo printed no '$expected'" >&2
    exit 1
  fi
done
echo "scripts/demo ran to the end"
