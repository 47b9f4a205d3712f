#!/usr/bin/env bash
# Train one size of the TinyFLUX family from the size below it, exporting the EMA weights to
# the model folder every CHUNK hours, so that the folder always holds the latest weights a
# later run can continue from (`--init-from` the folder itself continues its step).
#
#   nice -n 19 models/tinyflux/progressive.sh l     # 64x64, from models/tinyflux
#   nice -n 19 models/tinyflux/progressive.sh xl    # 128x128, from models/tinyflux-l
#
# Resumable: rerun it. PYTHON picks the interpreter (torch, diffusers, numpy, safetensors).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
# Passive OpenMP waits: a thread that finds its core taken sleeps instead of spinning, so a
# run sharing the machine with other work slows down gracefully instead of stalling.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
THREADS=${THREADS:-2}
CHUNK=${CHUNK:-0.25}
case "${1:-}" in
  l)  image=64;  from=models/tinyflux;   dir=models/tinyflux-l
      args=(--batch 32 --max-steps 12000 --warmup 300 --anneal-from 4000 --anneal-to 8000
            --cycle 8000 12000 2e-4) ;;
  xl) image=128; from=models/tinyflux-l; dir=models/tinyflux-xl
      args=(--batch 8 --max-steps 8000 --warmup 300 --anneal-from 4000 --anneal-to 8000) ;;
  *)  echo "usage: progressive.sh l|xl" >&2; exit 2 ;;
esac
run=$dir/checkpoint
max=$(printf '%s\n' "${args[@]}" | sed -n '/--max-steps/{n;p}')
# A fresh run starts from the folder's own weights when it has some (a run whose optimiser
# state was lost), else from the smaller model's.
init=$from
if [ -f "$dir/text_encoder/model.safetensors" ]; then init=$dir; fi
while :; do
  "$PY" models/tinyflux/train.py --out "$run" --image $image --init-from "$init" \
      --lr-min 3e-05 --shift 2 --unshifted 0.5 --hours "$CHUNK" --threads "$THREADS" "${args[@]}"
  "$PY" models/tinyflux/export.py "$run/ckpt.pt" "$dir"
  step=$("$PY" -c "import torch,sys; print(torch.load(sys.argv[1], weights_only=False)['step'])" "$run/ckpt.pt")
  if [ "$step" -ge "$max" ]; then echo "done at step $step"; break; fi
done
