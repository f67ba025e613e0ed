#!/bin/sh
# usage: run_if_present.sh TOOL... -- COMMAND [ARG...]
# Runs COMMAND when every TOOL is an executable file; otherwise prints why and exits 77,
# which ctest reports as "skipped" (SKIP_RETURN_CODE 77 on the test).
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  if [ ! -x "$1" ]; then
    echo "SKIPPED: $1 is not installed (scripts/deps --test installs it)"
    exit 77
  fi
  shift
done
[ "$1" = "--" ] && shift
exec "$@"
