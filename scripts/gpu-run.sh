#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU and no Rust toolchain, from the
# repository root, on a folder that scripts/gpu-build.sh staged:
#
#   scripts/gpu-run.sh [STAGED_FOLDER]        (default gpu-stage/)
#
# Writes one log, $OUT/gpu-run.log (target/gpu-run/ when $OUT is not set), and prints it.
# First what the machine has: the GPU, driver and nvidia-smi, nvcc, PyTorch's CUDA, where
# each CUDA library the binaries open is found, and ldd of every staged binary. Then, each
# stage bounded in time and none stopping the next:
#   1. the CUDA parity tests (TinyDiT and FLUX on CUDA against the CPU and diffusers' golden
#      output, f32 and bf16);
#   2. `flashdiff generate` on the GPU against the CPU, same prompt and seed, timed;
#   3. the FLUX-shaped token-subset forward at 1024 and 4096 tokens, f32 and bf16;
#   4. the FLUX.1 dev, SD3.5, Wan2.1 and Stable Audio Open pipelines on small random
#      weights, GPU against CPU;
#   5. the diffusers adapter in wall time (studies/diffusers_wall.py --device cuda), from the
#      staged wheels where the machine's Python lacks flashdiff or diffusers.
# The whole run stays under 8 minutes. Without a GPU it says so and exits 2 after the
# machine section; with one, it exits 1 if any stage failed, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage="${1:-gpu-stage}"
out="${OUT:-$root/target/gpu-run}"
mkdir -p "$out"
log="$out/gpu-run.log"
: > "$log"
exec > >(tee -a "$log") 2>&1

start=$(date +%s)
deadline=$((start + 450)) # 7.5 minutes: the rest is margin for the last stage's bound
say() { echo "[$(( $(date +%s) - start ))s] $*"; }

if [ ! -f "$stage/bin.tar.xz" ]; then
  say "no staged folder at $stage (run scripts/gpu-build.sh on the build machine first)"
  exit 3
fi
stage=$(cd "$stage" && pwd)
unpacked=$(mktemp -d "${TMPDIR:-/tmp}/flashdiff-gpu.XXXXXX")
trap 'rm -rf "$unpacked"' EXIT
if ! tar -xJf "$stage/bin.tar.xz" -C "$unpacked" 2>/dev/null; then
  # No xz program: Python's lzma reads the archive as well.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    "$stage/bin.tar.xz" "$unpacked" || { say "cannot unpack $stage/bin.tar.xz"; exit 3; }
fi
bin="$unpacked/bin"
export FLASHDIFF_MODELS_DIR="$root/models" CARGO_MANIFEST_DIR="$root/models"

echo "== what was staged"
cat "$stage/BUILD" 2>/dev/null || echo "(no BUILD file)"

echo "== machine"
uname -a
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi || true
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
else
  echo "nvidia-smi: not found"
fi
echo "GPU: ${gpu:-none}"
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -n 2 || echo "nvcc: not found"
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' 2>&1 | tail -n 1 || true

# Where the CUDA 13 libraries are: the toolkit's lib64, then PyTorch's wheels. They go on
# LD_LIBRARY_PATH, since the binaries open them by name at run time.
dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && dirs+=("$d")
done
site=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null || true)
for s in $site; do
  for d in "$s"/nvidia/cu13/lib "$s"/nvidia/*/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
done
# Each folder once, in the order found (the toolkit's first).
unique=()
for d in "${dirs[@]}"; do
  case " ${unique[*]} " in *" $d "*) ;; *) unique+=("$d") ;; esac
done
dirs=("${unique[@]}")
for ((i = ${#dirs[@]} - 1; i >= 0; i--)); do
  LD_LIBRARY_PATH="${dirs[$i]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
echo "library folders searched: ${dirs[*]:-none}"
find_lib() {
  local name="$1" d
  for d in "${dirs[@]}"; do
    [ -e "$d/$name" ] && { echo "$d/$name"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}'
}
missing=()
for lib in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcurand.so.10; do
  where=$(find_lib "$lib")
  echo "  $lib: ${where:-NOT FOUND}"
  [ -n "$where" ] || missing+=("$lib")
done
for b in "$bin"/*; do
  echo "ldd $(basename "$b"):"
  ldd "$b" 2>&1 | sed 's/^/    /'
done

if [ -z "$gpu" ]; then
  say "no GPU found (nvidia-smi is missing or lists no GPU): nothing to check on a GPU here"
  exit 2
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "CUDA libraries not found: ${missing[*]} (the CUDA stages will fail; running them to show how)"
fi

failed=()
passed=()
# run NAME SECONDS COMMAND...: one bounded stage step; its failure is recorded, not fatal.
run() {
  local name="$1" limit="$2"; shift 2
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 5 ]; then
    say "SKIP $name: the run's time is spent"; failed+=("$name (no time left)"); return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "RUN  $name (at most ${limit}s): $*"
  local t0=$(date +%s.%N)
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  local took
  took=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')" 2>/dev/null || echo "?")
  if [ $rc -eq 0 ]; then
    say "PASS $name in ${took}s"; passed+=("$name")
  else
    [ $rc -eq 124 ] && say "FAIL $name: timed out after ${limit}s" || say "FAIL $name: exit $rc after ${took}s"
    failed+=("$name")
  fi
  return $rc
}

echo "== 1. CUDA parity tests"
parity_log="$out/parity.log"
run parity 150 bash -c "'$bin/cuda-parity' --nocapture --test-threads 1 2>&1 | tee '$parity_log'; exit \${PIPESTATUS[0]}"
if grep -q SKIPPED "$parity_log" 2>/dev/null; then
  say "FAIL parity: a test skipped (no usable GPU as the binary sees it)"
  failed+=("parity (skipped)")
fi

echo "== 2. generate on the GPU and on the CPU (same prompt and seed)"
prompt="a red circle top left and a blue square bottom right on a white background"
for dev in cuda cpu; do
  for i in 1 2; do
    run "generate $dev #$i" 60 "$bin/flashdiff" generate "$prompt" --seed 3 --device "$dev" \
      -o "$out/generate-$dev.png"
  done
done
if cmp -s "$out/generate-cuda.png" "$out/generate-cpu.png"; then
  say "the PNGs are identical on both devices"
else
  say "the PNGs differ (within the parity tolerance they may; both are in \$OUT)"
fi

echo "== 3. FLUX-shaped token-subset forward, 1024 and 4096 tokens"
for dtype in f32 bf16; do
  run "flux subset $dtype" 75 env FLASHDIFF_BENCH_DEVICE=cuda FLASHDIFF_BENCH_DTYPE=$dtype \
    "$bin/flux-bench" --bench --quick --noplot
done

echo "== 4. the pipelines on small random weights, GPU against CPU"
pipes="$out/pipelines"
mkdir -p "$pipes"
for m in flux-dev sd3.5 wan2.1 stable-audio-open; do
  run "write $m" 60 "$bin/tiny-pipeline" "$pipes/$m" "$m" || continue
  case "$m" in
    wan2.1) args=(--size 128x96 --frames 17 --steps 20 "a red fox running in the snow"); ext=gif ;;
    stable-audio-open) args=(--seconds 0.05 --steps 20 "a dog barking in the rain"); ext=wav ;;
    *) args=(--size 256x256 --steps 12 "a red cat on a blue table"); ext=png ;;
  esac
  for dtype in f32 bf16; do
    for dev in cuda cpu; do
      run "$m $dtype $dev" 60 "$bin/flashdiff" generate --model "$m" --weights "$pipes/$m" \
        --device "$dev" --dtype "$dtype" "${args[@]}" -o "$pipes/$m-$dtype-$dev.$ext"
    done
  done
done

echo "== 5. the diffusers adapter in wall time on the GPU"
py="$unpacked/py"
if ! python3 -c "import diffusers, flashdiff" 2>/dev/null; then
  if compgen -G "$stage/wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$py" "$stage"/wheels/*.whl \
      || say "the staged wheels did not install (the stage will show what is missing)"
  else
    say "no staged wheels and no diffusers or flashdiff here"
  fi
fi
run "adapter wall time" 240 env PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}" python3 studies/diffusers_wall.py \
  --device cuda --cases flux-1024,tinyflux --reps 3 --threads 16 --out "$out/wall"

echo "== summary ($(( $(date +%s) - start ))s)"
echo "passed: ${#passed[@]}"
for p in "${passed[@]}"; do echo "  $p"; done
echo "failed: ${#failed[@]}"
for f in "${failed[@]}"; do echo "  $f"; done
[ ${#failed[@]} -eq 0 ]
