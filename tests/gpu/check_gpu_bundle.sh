#!/usr/bin/env bash
# scripts/gpu-check's path for a lent GPU machine, run here without a GPU: --bundle from
# this build, then --from on the bundle runs every step (each test binary and benchmark
# starts with the bundle's libraries and skips) and ends with "no GPU", exit 3, with the
# logs and the summary in $OUT. Skipped (77) where a GPU is visible: --from would then
# measure for minutes (scripts/gpu-check is the way there).
# Usage: check_gpu_bundle.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build_dir=$2
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is visible: run scripts/gpu-check itself"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  cat "$work"/*.log 2>/dev/null || true
  echo "check_gpu_bundle: $*" >&2
  exit 1
}

"$source_dir/scripts/gpu-check" --bundle "$work/bundle" --build-dir "$build_dir" \
  >"$work/bundle.log" 2>&1 || fail "--bundle failed"
size=$(du -sm "$work/bundle" | cut -f1)
# The bundle travels with the working tree, 64 MiB in all.
[[ $size -le 40 ]] || fail "the bundle takes $size MiB; keep it within 40"

set +e
OUT="$work/out" "$source_dir/scripts/gpu-check" --from "$work/bundle" >"$work/run.log" 2>&1
rc=$?
set -e
[[ $rc -eq 3 ]] || fail "--from without a GPU exited $rc, expected 3 (every step ran, no GPU)"
for step in test_kernels_gpu test_cuda_memory_gpu test_cuda_executor_gpu test_cuda_daemon_gpu \
            bench_gpu_codec_throughput bench_gpu_fused_step; do
  grep -q "^== $step ==" "$work/run.log" || fail "step $step did not run"
done
grep -q "error while loading shared libraries" "$work/run.log" && fail "a binary lacks a library"
grep -Eq "gpu tests +0 passed, [1-9][0-9]* skipped, 0 failed" "$work/run.log" ||
  fail "the tests did not all start and skip"
grep -q "no GPU: every step ran and skipped; nothing was measured" "$work/run.log" ||
  fail "no closing 'no GPU' line"
for f in gpu-check-tests.log gpu-check-bench.log gpu-check-step.log gpu-check-summary.txt; do
  [[ -s "$work/out/$f" ]] || fail "\$OUT lacks $f"
done
echo "bundle of $size MiB: every step ran and skipped without a GPU"
