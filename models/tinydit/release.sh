#!/usr/bin/env bash
# Turns a training checkpoint into the shipped model: EMA weights, golden files for the Rust
# parity tests, and the evaluation numbers for the model card.
#   models/tinydit/release.sh RUN_DIR        (RUN_DIR holds ckpt.pt from train.py)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
run="${1:?usage: release.sh RUN_DIR}"
cd "$here"
python3 export.py --ckpt "$run/ckpt.pt" --out tinydit.safetensors
python3 golden.py --weights tinydit.safetensors --out golden.safetensors
python3 evaluate.py --weights tinydit.safetensors --n 256 --json eval.json
python3 model_card.py "$run"
mkdir -p checkpoint
cp "$run/train.log" "$run/config.json" checkpoint/   # the training state stays in RUN_DIR
