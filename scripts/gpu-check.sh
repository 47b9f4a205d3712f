#!/usr/bin/env bash
# The GPU check: run once on a machine with an NVIDIA GPU and a CUDA toolkit (nvcc), from
# the repository root. Builds the `cuda` feature, runs the CUDA-vs-CPU parity test, then
# times `flashdiff generate` on the GPU against the CPU on the same prompt and seed, and
# prints everything the README's GPU section needs. Exits non-zero if anything fails.
# The CUDA parity tests include FLUX against diffusers' golden output (f32, full and subset
# forwards) and bf16 compute on CUDA against bf16 compute on the CPU. Then the FLUX-shaped
# subset timing at 1024 / 4096 tokens on the GPU in f32 and bf16 (criterion --quick), and
# the FLUX.1 dev and SD3.5 pipelines (text encoders, transformer, VAE) on small random
# weights, GPU against CPU, in f32 and bf16, and the Wan2.1 and Stable Audio Open ones.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
nvcc --version | tail -n 1
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-$cap}"
echo "CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"

echo "== build (--features cuda)"
time cargo build --release -p flashdiff --features cuda

echo "== CUDA vs CPU parity (models/tests/cuda.rs)"
cargo test --release -p flashdiff-models --features cuda --test cuda -- --nocapture 2>&1 | tee /tmp/gpu-parity.log
if grep -q SKIPPED /tmp/gpu-parity.log; then
  echo "the parity test skipped: no usable GPU" >&2
  exit 1
fi

echo "== generate on the GPU and on the CPU (same prompt and seed)"
prompt="a red circle top left and a blue square bottom right on a white background"
for dev in cuda cpu; do
  for i in 1 2 3; do
    /usr/bin/time -f "$dev run $i: %e s wall, %M KiB peak" \
      target/release/flashdiff generate "$prompt" --seed 3 --device "$dev" -o "/tmp/gpu-check-$dev.png" \
      | grep -E "^time|patch-steps computed"
  done
done
cmp /tmp/gpu-check-cuda.png /tmp/gpu-check-cpu.png && echo "PNG identical on both devices" \
  || echo "PNGs differ (expected within the parity tolerance; compare the images)"
echo "== FLUX-shaped token-subset forward on the GPU (models/benches/flux.rs), f32 and bf16"
for dtype in f32 bf16; do
  FLASHDIFF_BENCH_DEVICE=cuda FLASHDIFF_BENCH_DTYPE=$dtype \
    cargo bench -p flashdiff-models --features cuda --bench flux -- --quick 2>&1 \
    | grep -E "^flux_subset|time:|peak"
done
echo "== FLUX.1 dev and SD3.5 pipelines on small random weights (T5, CLIP, VAE on the GPU)"
cargo build --release -p flashdiff-models --features cuda,fixtures --example tiny_pipeline
for m in flux-dev sd3.5; do
  target/release/examples/tiny_pipeline "/tmp/gpu-check-$m" "$m"
  for dtype in f32 bf16; do
    for dev in cuda cpu; do
      /usr/bin/time -f "$m $dtype $dev: %e s wall, %M KiB peak" \
        target/release/flashdiff generate --model "$m" --weights "/tmp/gpu-check-$m" \
        --size 256x256 --steps 12 --device "$dev" --dtype "$dtype" \
        "a red cat on a blue table" -o "/tmp/gpu-check-$m-$dtype-$dev.png" \
        | grep -E "^time|patch-steps computed"
    done
  done
done
echo "== Wan2.1 and Stable Audio Open pipelines on small random weights, GPU against CPU"
target/release/examples/tiny_pipeline /tmp/gpu-check-wan wan2.1
target/release/examples/tiny_pipeline /tmp/gpu-check-sao stable-audio-open
for dev in cuda cpu; do
  target/release/flashdiff generate --model wan2.1 --weights /tmp/gpu-check-wan --size 128x96 \
    --frames 17 --steps 20 --device "$dev" "a red fox running in the snow" \
    -o "/tmp/gpu-check-wan-$dev.gif" | grep -E "^time|patch-steps computed"
  target/release/flashdiff generate --model stable-audio-open --weights /tmp/gpu-check-sao \
    --seconds 0.05 --steps 20 --device "$dev" "a dog barking in the rain" \
    -o "/tmp/gpu-check-sao-$dev.wav" | grep -E "^time|patch-steps computed"
done
echo "== done"
