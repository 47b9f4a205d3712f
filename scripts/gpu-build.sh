#!/usr/bin/env bash
# Builds the GPU check's binaries on a machine without a GPU and stages them in one folder
# that a GPU machine without a Rust toolchain runs with scripts/gpu-run.sh.
#
#   scripts/gpu-build.sh                 the `cuda` build, staged in gpu-stage/
#   scripts/gpu-build.sh --cpu           the same binaries without `cuda` (dev profile), to
#                                        test the staging and gpu-run.sh where no GPU is
#   scripts/gpu-build.sh --out DIR       stage in DIR instead of gpu-stage/
#   scripts/gpu-build.sh --check DIR     check a staged folder only
#
# The `cuda` build needs no CUDA installation here: it takes CUDA 13.0's compiler and
# headers from NVIDIA's wheels on the Python package index (pinned below, cached under
# target/gpu/), so the kernels' PTX is one a CUDA 13.0 driver accepts. The CUDA libraries are
# not linked: candle's CUDA backend (cudarc) is built with `dynamic-loading`, so a binary
# opens libcuda, cuBLAS, cuBLASLt, NVRTC and cuRAND by name when a CUDA device is asked for,
# from whatever CUDA 13 the machine has, and starts and runs on the CPU where there is none.
# candle 0.11 asks cudarc for `dynamic-linking` instead; the build patches that one word in
# a copy of candle-core's manifest taken from cargo's registry (target/gpu/candle-core),
# applied with `--config patch...` for this build only. The CUDA runtime that candle's
# static kernels call is linked statically.
#
# The folder holds bin.tar.xz (bin/: the CLI, the CUDA parity tests, the FLUX-shaped subset
# bench, the small-pipeline writer, each stripped) and BUILD (what was built, from which
# commit); scripts/gpu-run.sh unpacks the binaries on the machine that runs them. The
# built-in weights and golden files travel with the working tree. The folder must stay
# under 56 MiB: the GPU machine receives 64 MiB in all, the working tree included.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

limit_mib=56
out=gpu-stage
mode=cuda
check_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --out) out="${2:?--out needs a folder}"; shift ;;
    --check) check_only="${2:?--check needs a folder}"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu-build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# What is built, read before the build patches Cargo.lock for its own use.
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"

# The staged binaries, by name in bin/, and how each shows that it starts.
binaries=(flashdiff cuda-parity flux-bench tiny-pipeline)
start_check() {
  case "$1" in
    flashdiff) echo "--version" ;;
    tiny-pipeline) echo "--version" ;;
    *) echo "--list" ;; # the test harness and criterion both list what they would run
  esac
}

# Checks a staged folder: the archive unpacks; every binary in it is present, starts and
# prints its version or its list, and needs no CUDA library of another major version than
# 13; the folder is under the size limit. Prints what it found; fails with the reason.
check_folder() {
  local dir="$1" fail=0
  [ -f "$dir/bin.tar.xz" ] || { echo "gpu-build.sh: $dir has no bin.tar.xz: not a staged folder" >&2; return 1; }
  local unpacked
  unpacked=$(mktemp -d)
  if ! tar -xJf "$dir/bin.tar.xz" -C "$unpacked"; then
    echo "gpu-build.sh: $dir/bin.tar.xz does not unpack" >&2; rm -rf "$unpacked"; return 1
  fi
  for b in "${binaries[@]}"; do
    local exe="$unpacked/bin/$b"
    if [ ! -x "$exe" ]; then
      echo "gpu-build.sh: bin/$b is missing from $dir/bin.tar.xz" >&2; fail=1; continue
    fi
    local said first
    if ! said=$("$exe" $(start_check "$b") 2>&1) || [ -z "$said" ]; then
      echo "gpu-build.sh: bin/$b does not start: $(printf '%s\n' "$said" | sed -n 1,3p)" >&2; fail=1; continue
    fi
    # No pipe into head: under pipefail a long list (a test harness's) makes echo die of
    # SIGPIPE when head stops reading, and set -e would end the check without a word.
    first=${said%%$'\n'*}
    local needs
    needs=$(ldd "$exe" 2>/dev/null | awk '{print $1}' | grep -E '^lib(cuda|cudart|cublas|cublasLt|nvrtc|curand)\.so' || true)
    local bad
    bad=$(echo "$needs" | grep -E '\.so\.' | grep -vE '^libcuda\.so\.1$|\.so\.13$|^libcurand\.so\.10$' || true)
    if [ -n "$bad" ]; then
      echo "gpu-build.sh: bin/$b needs CUDA libraries of another version: $(echo $bad)" >&2; fail=1
    fi
    echo "  bin/$b: $(stat -c %s "$exe") bytes, starts ($first); CUDA libraries linked: ${needs:-none}"
  done
  rm -rf "$unpacked"
  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  local mib=$(( (bytes + 1048575) / 1048576 ))
  if [ "$bytes" -gt $(( limit_mib * 1048576 )) ]; then
    echo "gpu-build.sh: $dir is $mib MiB, over the $limit_mib MiB limit" >&2; fail=1
  else
    echo "  $dir: $mib MiB (limit $limit_mib MiB)"
  fi
  return $fail
}

if [ -n "$check_only" ]; then
  check_folder "$check_only"
  exit $?
fi

# CUDA 13.0 from NVIDIA's wheels: nvcc, ptxas, cicc (NVVM), the CUDA headers, CCCL's
# headers (libcu++, used by cuda_fp16.h) and the static CUDA runtime.
cuda_wheels=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-runtime==13.0.96
)
toolkit="$root/target/gpu/cuda-13.0"
install_toolkit() {
  if [ -x "$toolkit/bin/nvcc" ] && [ -f "$toolkit/.complete" ]; then return; fi
  echo "== CUDA 13.0 compiler and headers from NVIDIA's wheels (into $toolkit)"
  rm -rf "$toolkit" target/gpu/wheels target/gpu/unpacked
  mkdir -p target/gpu/wheels target/gpu/unpacked
  python3 -m pip download -q --no-deps --only-binary=:all: --dest target/gpu/wheels "${cuda_wheels[@]}"
  for w in target/gpu/wheels/*.whl; do python3 -m zipfile -e "$w" target/gpu/unpacked; done
  mv target/gpu/unpacked/nvidia/cu13 "$toolkit"
  rm -rf target/gpu/unpacked
  chmod +x "$toolkit"/bin/* "$toolkit"/nvvm/bin/*
  # The static runtime under the name the kernels' link line asks for (-lcudart): the
  # binaries then need no libcudart at run time.
  mkdir -p "$toolkit/lib-link"
  cp "$toolkit/lib/libcudart_static.a" "$toolkit/lib-link/libcudart.a"
  "$toolkit/bin/nvcc" --version | tail -n 2
  touch "$toolkit/.complete"
}

# candle-core from cargo's registry with cudarc's `dynamic-linking` swapped for
# `dynamic-loading`; nothing else changes.
patch_candle() {
  local manifest version
  manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "candle-core"))')
  version=$(basename "$(dirname "$manifest")")
  local dest="$root/target/gpu/candle-core"
  if [ ! -f "$dest/.from" ] || [ "$(cat "$dest/.from")" != "$version" ]; then
    rm -rf "$dest"
    cp -r "$(dirname "$manifest")" "$dest"
    local n
    n=$(grep -c '"dynamic-linking",' "$dest/Cargo.toml" || true)
    if [ "$n" != 1 ]; then
      echo "gpu-build.sh: expected one cudarc \"dynamic-linking\" feature in $version's manifest, found $n" >&2
      exit 1
    fi
    sed -i 's/"dynamic-linking",/"dynamic-loading",/' "$dest/Cargo.toml"
    echo "$version" > "$dest/.from"
  fi
  echo "$dest"
}

# The executable a cargo command built for the target of the given kind and name.
executable_of() {
  python3 -c '
import json, sys
name, kind = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == name and kind in m["target"]["kind"] \
            and not (kind == "bin" and m["profile"]["test"]):
        print(m["executable"])
        break
' "$1" "$2"
}

if [ "$mode" = cuda ]; then
  install_toolkit
  candle=$(patch_candle)
  export PATH="$toolkit/bin:$PATH" CUDA_HOME="$toolkit" CUDA_PATH="$toolkit"
  export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
  export CARGO_TARGET_DIR="$root/target/gpu/target"
  export RUSTFLAGS="${RUSTFLAGS:-} -L native=$toolkit/lib-link"
  profile=(--release)
  patch=(--config "patch.crates-io.candle-core.path=\"$candle\"")
  # The patch rewrites Cargo.lock's candle-core entry; the repository's stays as it was.
  cp Cargo.lock target/gpu/Cargo.lock.saved
  trap 'cp target/gpu/Cargo.lock.saved Cargo.lock' EXIT
  echo "== building with CUDA 13.0 (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP), cudarc loading its libraries at run time"
else
  echo "== the same binaries without the cuda feature, as cargo test --workspace builds them (dev profile)"
fi
json=(--message-format=json-render-diagnostics)
log=$(mktemp)
if [ "$mode" = cpu ]; then
  # What `cargo test --workspace` builds, with the features the whole workspace unifies: after
  # the README's test command nothing compiles again (a build of one package alone resolves
  # other features and rebuilds most of the tree). The CLI is the binary the integration
  # tests run, not its test harness.
  cargo test --workspace --no-run "${json[@]}" > "$log"
  cli=$(executable_of flashdiff bin < "$log")
  parity=$(executable_of cuda test < "$log")
  example=$(executable_of tiny_pipeline example < "$log")
  cargo test --workspace --no-run --bench flux "${json[@]}" > "$log"
  bench=$(executable_of flux bench < "$log")
else
  cargo build "${patch[@]}" "${profile[@]}" -p flashdiff --features cuda --bin flashdiff "${json[@]}" > "$log"
  cli=$(executable_of flashdiff bin < "$log")
  cargo test "${patch[@]}" "${profile[@]}" -p flashdiff-models --features cuda --test cuda --no-run "${json[@]}" > "$log"
  parity=$(executable_of cuda test < "$log")
  cargo bench "${patch[@]}" -p flashdiff-models --features cuda --bench flux --no-run "${json[@]}" > "$log"
  bench=$(executable_of flux bench < "$log")
  cargo build "${patch[@]}" "${profile[@]}" -p flashdiff-models --features cuda,fixtures --example tiny_pipeline "${json[@]}" > "$log"
  example=$(executable_of tiny_pipeline example < "$log")
fi
rm -f "$log"

echo "== staging in $out/"
# The binaries share most of their bytes (candle's kernels, our code): one archive with a
# dictionary larger than any of them stores those once (about 10 MiB for the four CUDA
# binaries, 198 MiB unpacked).
bins="$root/target/gpu/bin-$mode"
rm -rf "$bins" "$out"
mkdir -p "$bins/bin" "$out"
i=0
for exe in "$cli" "$parity" "$bench" "$example"; do
  [ -n "$exe" ] || { echo "gpu-build.sh: cargo reported no executable for ${binaries[$i]}" >&2; exit 1; }
  cp "$exe" "$bins/bin/${binaries[$i]}"
  strip "$bins/bin/${binaries[$i]}"
  i=$((i + 1))
done
tar -cf - -C "$bins" bin | xz -T1 --lzma2=preset=6,dict=192MiB > "$out/bin.tar.xz"
{
  echo "mode: $mode"
  echo "commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  [ "$mode" = cuda ] && echo "cuda: $("$toolkit/bin/nvcc" --version | tail -n 1), CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
  echo "rustc: $(rustc --version)"
} > "$out/BUILD"
if [ "$mode" = cuda ]; then
  # The adapter's wall-time stage runs Python: the flashdiff package (abi3, any CPython >= 3.9)
  # and diffusers with the hub client, for a GPU machine whose PyTorch has no diffusers.
  echo "== wheels for the diffusers adapter's wall-time stage"
  mkdir -p "$out/wheels"
  MATURIN_PEP517_ARGS="--release" python3 -m pip wheel -q --no-deps -w "$out/wheels" ./python
  python3 -m pip download -q --no-deps --only-binary=:all: --dest "$out/wheels" diffusers huggingface_hub
  ls -l "$out/wheels"
fi
cat "$out/BUILD"
check_folder "$out"
