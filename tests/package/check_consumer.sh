#!/usr/bin/env bash
# The installed client package works for an engine's build:
#   1. configure statepool client-only with Boost and prometheus-cpp made unfindable, build
#      it (warnings as errors) and `cmake --install` it into a fresh prefix;
#   2. configure tests/package/consumer against that prefix (find_package(statepool)),
#      build it and run it.
# Usage: check_consumer.sh SOURCE_DIR WORK_DIR CXX_COMPILER
set -euo pipefail
source_dir=$1
work=$2
cxx=$3
rm -rf "$work"
mkdir -p "$work"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== client-only configure (no Boost, no prometheus-cpp) =="
cmake -S "$source_dir" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DSTATEPOOL_CLIENT_ONLY=ON -DSTATEPOOL_WERROR=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
  -DCMAKE_INSTALL_PREFIX="$work/prefix" --no-warn-unused-cli >"$work/configure.log"
cmake --build "$work/build" --parallel "$(nproc)" >"$work/build.log"
cmake --install "$work/build" >"$work/install.log"
test -f "$work/prefix/include/statepool/client.hpp"
test -f "$work/prefix/include/statepool_generated.h"
if find "$work/prefix" -name 'statepoold' -o -name 'statepoolctl' | grep -q .; then
  echo "a client-only install must not hold the daemon or the tools" >&2
  exit 1
fi

echo "== consumer project against the installed package =="
cmake -S "$source_dir/tests/package/consumer" -B "$work/consumer" "${generator[@]}" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/consumer-configure.log"
cmake --build "$work/consumer" >"$work/consumer-build.log"
"$work/consumer/consumer" "$work/no-daemon.sock"
