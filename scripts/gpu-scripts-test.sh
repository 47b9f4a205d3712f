#!/usr/bin/env bash
# Tests the GPU check's two scripts where there is no GPU (CI, a laptop):
#
#   scripts/gpu-scripts-test.sh                  stages the binaries built without `cuda`
#                                                (scripts/gpu-build.sh --cpu), then tests
#   scripts/gpu-scripts-test.sh FOLDER [REF]     tests a folder staged already (gpu-stage/
#                                                from the `cuda` build), REF being the
#                                                default build's CLI to compare with
#
# It checks that the folder passes gpu-build.sh's own check (every binary starts and prints
# its version or list, no CUDA library of a major version other than 13, under 56 MiB);
# that the staged CLI, run as gpu-run.sh runs it (weights found through
# FLASHDIFF_MODELS_DIR), generates on the CPU the same PNG, byte for byte, as the reference
# CLI; that gpu-run.sh says no GPU was found and exits 2, with its log under $OUT; and that
# a folder over the size limit or missing a binary is refused with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

folder="${1:-}"
ref="${2:-}"
if [ -z "$folder" ]; then
  folder=target/gpu-stage-cpu
  scripts/gpu-build.sh --cpu --out "$folder"
  ref=${ref:-target/debug/flashdiff}
fi
ref=${ref:-target/release/flashdiff}
folder=$(cd "$folder" && pwd)
[ -x "$ref" ] || { echo "gpu-scripts-test: no reference CLI at $ref (build it first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu-scripts-test: FAIL: $*" >&2; exit 1; }

echo "== the staged folder passes its check"
scripts/gpu-build.sh --check "$folder"

bin="$tmp/unpacked/bin"
mkdir -p "$tmp/unpacked"
tar -xJf "$folder/bin.tar.xz" -C "$tmp/unpacked"

echo "== the staged CLI generates on the CPU what the reference CLI does"
prompt="a red circle top left and a blue square bottom right on a white background"
(cd "$tmp" && FLASHDIFF_MODELS_DIR="$root/models" "$bin/flashdiff" generate "$prompt" \
  --seed 3 --device cpu -o staged.png)
"$ref" generate "$prompt" --seed 3 --device cpu -o "$tmp/reference.png"
cmp "$tmp/staged.png" "$tmp/reference.png" || fail "the staged CLI's PNG differs from $ref's"
echo "identical PNGs ($(stat -c %s "$tmp/reference.png") bytes)"

echo "== the staged CLI asked for CUDA here: a clear error, no crash"
set +e
msg=$(FLASHDIFF_MODELS_DIR="$root/models" "$bin/flashdiff" generate "$prompt" --device cuda \
  -o "$tmp/cuda.png" 2>&1)
rc=$?
set -e
echo "exit $rc: $msg"
[ "$rc" -eq 2 ] || fail "--device cuda without a GPU exited $rc, not 2"
echo "$msg" | grep -q "CUDA" || fail "--device cuda without a GPU did not say why"
echo "$msg" | grep -qi "panicked" && fail "--device cuda without a GPU printed a panic"

echo "== gpu-run.sh here: no GPU found, exit 2, the log under \$OUT"
set +e
OUT="$tmp/out" scripts/gpu-run.sh "$folder" > "$tmp/run.txt" 2>&1
rc=$?
set -e
tail -n 3 "$tmp/run.txt"
[ "$rc" -eq 2 ] || fail "gpu-run.sh exited $rc without a GPU, not 2"
grep -q "no GPU found" "$tmp/out/gpu-run.log" || fail "gpu-run.sh's log does not say that no GPU was found"
grep -q "ldd flashdiff" "$tmp/out/gpu-run.log" || fail "gpu-run.sh's log lacks the staged binaries' ldd"

echo "== a folder over 56 MiB, or missing a binary, is refused"
cp -r "$folder" "$tmp/big"
head -c $((56 * 1048576)) /dev/zero > "$tmp/big/padding"
if scripts/gpu-build.sh --check "$tmp/big" > "$tmp/big.txt" 2>&1; then
  fail "a folder over the limit passed the check"
fi
grep -q "over the 56 MiB limit" "$tmp/big.txt" || fail "the size refusal does not say why: $(cat "$tmp/big.txt")"
rm "$tmp/big/padding"
rm "$bin/flux-bench"
tar -cJf "$tmp/big/bin.tar.xz" -C "$tmp/unpacked" bin
if scripts/gpu-build.sh --check "$tmp/big" > "$tmp/missing.txt" 2>&1; then
  fail "a folder missing a binary passed the check"
fi
grep -q "flux-bench is missing" "$tmp/missing.txt" || fail "the refusal does not name the missing binary"
echo "== gpu scripts: all checks passed"
