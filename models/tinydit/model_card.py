"""Writes MODEL_CARD.md from the training run and eval.json (run by release.sh)."""
import json
import os
import sys

run = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(run, "config.json")))
ev = json.load(open(os.path.join(here, "eval.json")))
log = [l.split() for l in open(os.path.join(run, "train.log")) if l.startswith("step")]
last = log[-1]
loss = float(last[3])
from safetensors import safe_open
with safe_open(os.path.join(here, "tinydit.safetensors"), "pt") as fh:
    step = int(fh.metadata()["train_step"])
secs = sum(float(l[5]) * 50 for l in log)
m = cfg["model"]
bar_all = ev["all_correct"] >= 0.5
bar_attn = (ev["attn_ratio_warmup"] or 0) >= 3.0
t = cfg["train"]
anneal = ""
if t.get("anneal_from") is not None and t.get("anneal_to") is not None:
    anneal = (f"; constant until step {t['anneal_from']}, then a cosine decay to {t['lr_min']} at step "
              f"{t['anneal_to']}: `--anneal-from {t['anneal_from']} --anneal-to {t['anneal_to']} --lr-min {t['lr_min']}`")
card = f"""# TinyDiT: FlashDiff's built-in model

A text-conditioned Diffusion Transformer trained here, on CPU, on procedural images
(`shapes.py`): one or two shapes (circle, square, triangle, cross) in eight colours at nine
named places on a coloured background, 32x32 pixels, with the prompt that describes them
("a red circle top left and a blue square bottom right on a white background"). It exists so
that FlashDiff runs out of the box with no network and its attention means something.

## Architecture (`model.py`, re-implemented in `runtime/src/model`)

| | |
| --- | --- |
| latent | 32x32x3 pixels, patch {m['patch']} -> {(m['image'] // m['patch']) ** 2} tokens of {m['patch'] ** 2 * m['channels']} values |
| width, blocks, heads | d = {m['d']}, {m['depth']} blocks, {m['heads']} heads, MLP x{m['mlp_ratio']} (GELU tanh) |
| block | adaLN-zero self-attention, cross-attention to text, adaLN-zero MLP |
| text encoder | word embeddings ({m['vocab']} words) + learned positions, {m['text_layers']} pre-LN layers, {m['max_tokens']} tokens |
| conditioning | sinusoidal timestep MLP + pooled text |
| objective | rectified flow (velocity = noise - image), logit-normal t |
| sampler | Euler, 50 steps from t = 1 to 0 |
| parameters | 2.70 M (f32, {os.path.getsize(os.path.join(here, 'tinydit.safetensors')) / 1e6:.1f} MB safetensors) |

## Training

```
pip install -r models/tinydit/requirements.txt
nice -n 19 python3 models/tinydit/train.py --out RUN --hours H     # resumable: run again to continue
models/tinydit/release.sh RUN                                       # export, golden files, evaluation, this card
```

Batch {cfg['train']['batch']}, AdamW lr {cfg['train']['lr']} (warm-up {cfg['train']['warmup']} steps{anneal}), EMA {cfg['train']['ema']}
with a warm-up of its decay, seed {cfg['train']['seed']}, {cfg['train']['threads']} CPU threads, flush-to-zero on.
Shipped weights: EMA at step **{step}**, training loss {loss:.4f}, about {secs / 3600:.1f} h of
CPU training time (logged seconds per step; the machine was shared with builds, so wall time
was longer). `checkpoint/` holds the run's `train.log` and `config.json`; its training state (`ckpt.pt`) stays in the run folder, out of the repository: `train.py --out` on that folder resumes it, and on an empty folder trains from scratch.

## Quality (full computation, 50 steps, {ev['samples']} prompts from held-out seed 2026)

| measure | value | bar |
| --- | --- | --- |
| checker: all correct (background, every shape, colour, place) | {100 * ev['all_correct']:.1f}% | >= 50%: {'met' if bar_all else '**not met**'} |
| checker: background colour right | {100 * ev['background_correct']:.1f}% | |
| checker: every object present in its colour at its place | {100 * ev['shapes_present']:.1f}% | |
| checker: every object also of the right shape | {100 * ev['shapes_correct']:.1f}% | |
| cross-attention of an object's colour and shape words, mass per token inside the object / outside, warm-up steps 1-5, saliency blocks {ev['saliency_layers']} | {ev['attn_ratio_warmup']:.2f}x | >= 3x: {'met' if bar_attn else '**not met**'} |
| the same at the last step | {ev['attn_ratio_last']:.2f}x | |

`python3 models/tinydit/evaluate.py --weights models/tinydit/tinydit.safetensors --n 256`
reproduces the table ({ev['sampling_seconds']} s of sampling here).

## Files

- `tinydit.safetensors`: weights (f32), config, vocabulary and saliency blocks in the metadata.
- `golden.safetensors`: reference outputs for the Rust parity tests (`runtime/tests/parity.rs`).
- `checkpoint/config.json`, `checkpoint/train.log`: the run's settings and loss.
"""
open(os.path.join(here, "MODEL_CARD.md"), "w").write(card)
print("wrote MODEL_CARD.md")
