"""Writes the model card of a larger TinyFLUX (tinyflux-l, tinyflux-xl) from its run's log and
config (FOLDER/checkpoint/), its weights and its evaluation (FOLDER/eval.json).

    python3 models/tinyflux/family_card.py models/tinyflux-l
"""
import json
import os
import sys

from safetensors import safe_open
from safetensors.torch import load_file

if len(sys.argv) != 2:
    raise SystemExit("usage: family_card.py MODEL_FOLDER (models/tinyflux-l, say)")
folder = sys.argv[1].rstrip("/")
name = os.path.basename(folder)
cfg = json.load(open(os.path.join(folder, "checkpoint", "config.json")))
ev = json.load(open(os.path.join(folder, "eval.json")))
log = [ln.split() for ln in open(os.path.join(folder, "checkpoint", "train.log")) if ln.startswith("step")]
with safe_open(os.path.join(folder, "text_encoder", "model.safetensors"), "pt") as fh:
    step = int(fh.metadata()["step"])
params = sum(v.numel() for part in ["transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"]
             for v in load_file(os.path.join(folder, part)).values())
m, t = cfg["model"], cfg["train"]
side, cell = m["image"], m["patch"]
tokens = (side // cell) ** 2
size = {64: "l", 128: "xl"}.get(side, "?")
source = {64: "tinyflux (32x32 pixels, 64 image tokens)", 128: "tinyflux-l (64x64 pixels, 256 image tokens)"}
met = lambda ok: "met" if ok else "**not met**"  # noqa: E731
curve = [(int(ln[1]), float(ln[3])) for ln in log]
hours = sum(float(ln[5]) * 50 for ln in log) / 3600
marks = [s for s in (100, 500, 1000, 2000, 4000, 6000, 8000, 10000) if any(c[0] >= s for c in curve)]
marks = [s for s in marks if s < curve[-1][0]] + [curve[-1][0]]
loss_rows = "\n".join(f"| {s} | {min(curve, key=lambda c: abs(c[0] - s))[1]:.4f} |" for s in marks)
cycles = "".join(f"; then one more cycle from step {int(c[0])}: a climb to {c[2]} over the warm-up's "
                 f"length and a cosine decay back to {t['lr_min']} at step {int(c[1])}"
                 for c in t.get("cycle") or [])
stopped = (f" (the schedule runs to step {t['max_steps']}; these are the weights the study and "
           f"the tests use)" if step < t["max_steps"] else "")
card = f"""# {name}: TinyFLUX at {side}x{side} pixels ({tokens} image tokens)

TinyFLUX's transformer (diffusers' own `FluxTransformer2DModel`, unmodified, the same config)
and text encoder, trained further on a larger canvas so that regions of one image really
differ: 1-4 objects (circle, square, triangle, cross in eight colours at nine named places),
each covering about 2-10% of the canvas, on a flat, vertically striped or top-to-bottom
gradient background (`scenes.py`; every TinyFLUX prompt is also one of these). FlashDiff runs it
with the FLUX code it runs the released FLUX.1 with (`flashdiff generate --model {name}`).

| | |
| --- | --- |
| tokens | {side}x{side}x3 pixels cut into {cell}x{cell} cells: {tokens} image tokens of {cell * cell * 3} values (no VAE) |
| transformer | `FluxTransformer2DModel`: {m['double']} double-stream + {m['single']} single-stream blocks, width {m['heads'] * m['head_dim']}, {m['heads']} heads of {m['head_dim']}, RoPE axes {m['rope']} over (0, row, column) |
| text encoder | {m['vocab']} words (TinyFLUX's and "striped", "gradient"), {m['max_tokens']} tokens, {m['text_layers']} layers of width {m['text_d']} |
| objective | rectified flow, t logit-normal with shift {t['shift']} on {100 * (1 - t['unshifted']):.0f}% of samples |
| sampler | Euler, 50 uniform steps from t = 1 to 0 |
| parameters | {params / 1e6:.2f} M (f32) |

## Training

Progressive: started from {source.get(side, '?')}, its weights copied (RoPE positions
reach the larger grid unchanged; the two new words and the new text positions start near the
mean word and the last position), then trained on the larger scenes:

```
PYTHON=python3 nice -n 19 models/tinyflux/progressive.sh {size}   # resumable: rerun to continue
python3 models/tinyflux/golden.py {folder} {folder}/golden.safetensors
python3 models/tinyflux/evaluate.py --weights {folder} --n 256 --json {folder}/eval.json
python3 models/tinyflux/family_card.py {folder}
```

Batch {t['batch']}, AdamW lr {t['lr']} (warm-up {t['warmup']} steps, constant until step
{t['anneal_from']}, then a cosine decay to {t['lr_min']} at step {t['anneal_to']}{cycles}), EMA
{t['ema']}, {t['threads']} CPU threads, exported every {t['hours']} h of training into this
folder. A run whose optimiser state was lost continues from the folder's EMA weights at their
step. Shipped weights: EMA at step **{step}**{stopped}; {hours:.1f} h of logged CPU training time (the
machine was shared with builds).

| step | training loss |
| --- | --- |
{loss_rows}

## Quality (full computation, 50 steps, {ev['samples']} prompts from held-out seed 2026)

| measure | value | bar |
| --- | --- | --- |
| checker: all correct (background, every object's colour, place and shape) | {100 * ev['all_correct']:.1f}% | >= 50%: {met(ev['all_correct'] >= 0.5)} |
| checker: background colour right | {100 * ev['background_correct']:.1f}% | |
| checker: every object present in its colour at its place | {100 * ev['shapes_present']:.1f}% | |
| checker: every object also of the right shape | {100 * ev['shapes_correct']:.1f}% | |
| joint attention, image rows over an object's colour and shape words: mass per token inside the object / outside, warm-up steps 1-5, double-stream blocks | {ev['attn_ratio_warmup']:.2f}x | >= 3x: {met(ev['attn_ratio_warmup'] >= 3)} |
| the same at the last step | {ev['attn_ratio_last']:.2f}x | |

## Files

- `transformer/`, `text_encoder/model.safetensors`: as TinyFLUX's (`../tinyflux/MODEL_CARD.md`).
- `golden.safetensors`: diffusers' images from the engine's noise for the parity test
  (`server/tests/tinyflux.rs`, 60 dB).
- `checkpoint/config.json`, `checkpoint/train.log`: the run's settings and loss (the optimiser
  state, `ckpt.pt`, stays out of git).
"""
open(os.path.join(folder, "MODEL_CARD.md"), "w").write(card)
print(card)
