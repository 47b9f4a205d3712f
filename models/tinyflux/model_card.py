"""Writes models/tinyflux/MODEL_CARD.md from the run's log and config (checkpoint/) and the
evaluation (eval.json).

    python3 models/tinyflux/model_card.py
"""
import json
import os

from safetensors import safe_open
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(here, "checkpoint", "config.json")))
ev = json.load(open(os.path.join(here, "eval.json")))
log = [ln.split() for ln in open(os.path.join(here, "checkpoint", "train.log")) if ln.startswith("step")]
with safe_open(os.path.join(here, "text_encoder", "model.safetensors"), "pt") as fh:
    step = int(fh.metadata()["step"])
loss = float(log[-1][3])
hours = sum(float(ln[5]) * 50 for ln in log) / 3600
params = sum(v.numel() for part in ["transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"]
             for v in load_file(os.path.join(here, part)).values())
m, t = cfg["model"], cfg["train"]
met = lambda ok: "met" if ok else "**not met**"  # noqa: E731
curve = [(int(ln[1]), float(ln[3])) for ln in log]
marks = [s for s in (500, 1000, 2000, 4000, 8000, 12000, 16000) if any(c[0] >= s for c in curve)]
loss_rows = "\n".join(f"| {s} | {min(curve, key=lambda c: abs(c[0] - s))[1]:.4f} |" for s in marks)
card = f"""# TinyFLUX: the built-in FLUX

A FLUX transformer (diffusers' own `FluxTransformer2DModel`, unmodified, at a small config)
with a small text encoder for the built-in prompt language, trained here on CPU on the same
procedural shapes as TinyDiT (`../tinydit/shapes.py`: one or two shapes in eight colours at
nine named places on a coloured background, 32x32 pixels). FlashDiff runs it through the
same FLUX transformer code and joint-attention adapter as the released FLUX.1
(`flashdiff generate --model tinyflux`), and diffusers runs it as it is, so FlashDiff and
diffusers' own caches can be measured on one model whose attention means something.

## Architecture (`flux_model.py`; run by FlashDiff in `models/src/pipelines/tinyflux.rs`)

| | |
| --- | --- |
| tokens | 32x32x3 pixels cut into 4x4 cells: 64 image tokens of 48 values (no VAE) |
| transformer | `FluxTransformer2DModel`: {m['double']} double-stream + {m['single']} single-stream blocks, width {m['heads'] * m['head_dim']}, {m['heads']} heads of {m['head_dim']}, RoPE axes {m['rope']} over (0, row, column), no guidance embedding |
| text encoder | word embeddings ({m['vocab']} words) + learned positions, {m['text_layers']} pre-LN layers of width {m['text_d']}, {m['max_tokens']} tokens; its states are `encoder_hidden_states`, their mean `pooled_projections` |
| objective | rectified flow (velocity = noise - image), logit-normal t |
| sampler | Euler, 50 uniform steps from t = 1 to 0 |
| parameters | {params / 1e6:.2f} M (f32) |

## Training

```
pip install -r models/tinydit/requirements.txt diffusers
nice -n 19 python3 models/tinyflux/train.py --out RUN --hours H --max-steps {t['max_steps']} \\
    --anneal-from {t['anneal_from']} --anneal-to {t['anneal_to']} --lr-min {t['lr_min']}   # resumable: rerun to continue
python3 models/tinyflux/export.py RUN/ckpt.pt models/tinyflux             # transformer/ and text_encoder/
python3 models/tinyflux/golden.py models/tinyflux models/tinyflux/golden.safetensors
python3 models/tinyflux/evaluate.py --weights models/tinyflux --n 256 --json models/tinyflux/eval.json
python3 models/tinyflux/model_card.py
```

TinyDiT's loop (`../tinydit/train.py`): batch {t['batch']}, AdamW lr {t['lr']} (warm-up {t['warmup']}
steps, constant until step {t['anneal_from']}, then a cosine decay to {t['lr_min']} at step
{t['anneal_to']}), EMA {t['ema']}, seed {t['seed']}, {t['threads']} CPU threads. Shipped weights: EMA at
step **{step}**, training loss {loss:.4f}; {hours:.1f} h of logged CPU training time (the
machine was shared with builds, so its wall time was longer). `checkpoint/` holds the run's
`train.log` and `config.json`.

| step | training loss |
| --- | --- |
{loss_rows}

## Quality (full computation, 50 steps, {ev['samples']} prompts from held-out seed 2026)

| measure | value | bar |
| --- | --- | --- |
| checker: all correct (background, every shape, colour, place) | {100 * ev['all_correct']:.1f}% | >= 50%: {met(ev['all_correct'] >= 0.5)} |
| checker: background colour right | {100 * ev['background_correct']:.1f}% | |
| checker: every object present in its colour at its place | {100 * ev['shapes_present']:.1f}% | |
| checker: every object also of the right shape | {100 * ev['shapes_correct']:.1f}% | |
| joint attention, image rows over an object's colour and shape words: mass per token inside the object / outside, warm-up steps 1-5, double-stream blocks | {ev['attn_ratio_warmup']:.2f}x | >= 3x: {met(ev['attn_ratio_warmup'] >= 3)} |
| the same at the last step | {ev['attn_ratio_last']:.2f}x | |

`python3 models/tinyflux/evaluate.py --weights models/tinyflux --n 256` reproduces the table
({ev['sampling_seconds']} s of sampling here); it reads the attention by wrapping diffusers'
attention dispatch during the double-stream blocks.

## Files

- `transformer/`: `config.json` and `diffusion_pytorch_model.safetensors`, as diffusers'
  `save_pretrained` writes them (`FluxTransformer2DModel.from_pretrained` loads it).
- `text_encoder/model.safetensors`: the text encoder (f32), with the model config, the
  vocabulary and the training step in its metadata.
- `golden.safetensors`: diffusers' images from the engine's noise for the parity test
  (`server/tests/tinyflux.rs`: FlashDiff's FLUX code with nothing skipped must match them to
  60 dB).
- `checkpoint/config.json`, `checkpoint/train.log`: the run's settings and loss.
"""
open(os.path.join(here, "MODEL_CARD.md"), "w").write(card)
print(card)
