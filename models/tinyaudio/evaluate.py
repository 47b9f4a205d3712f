"""Quality of the built-in audio model, for its model card: full computation, 50 Euler steps
at the times the weights' sampling shift gives (as the Rust runtime takes them), on prompts
from a held-out seed (training uses seed 1; this uses 2026).

    python3 models/tinyaudio/evaluate.py --weights models/tinyaudio/tinyaudio.safetensors --n 256

Reports the checker's verdicts (sounds.check on the decoded waveform: event count, kinds,
pitches, all correct) and the cross-attention localisation: for each event, the mean
attention per latent frame from its pitch and kind words on the frames of its time span
(the checker's runs in the generated sound, in order, where their number matches the
prompt's) over the mean elsewhere, averaged over events, the saliency layers and heads, over
the 5 warm-up steps and at the last step.
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tinydit"))
import sounds  # noqa: E402
from evaluate import (arguments, localisation, report, sample_shift,  # noqa: E402
                      sample_with_attention)
from export import load_weights  # noqa: E402


def event_spans(wave):
    """The checker's event runs [a, b) in frames."""
    spec = sounds.spectrum_frames(np.asarray(wave, np.float64))
    energy = (spec ** 2).sum(1)
    if energy.max() <= 0:
        return []
    return [r for r in sounds.segments(energy, energy.max() * 1e-3, 8) if r[1] - r[0] >= 3]


@torch.no_grad()
def main():
    args = arguments(__doc__)
    model, meta = load_weights(args.weights)
    layers = json.loads(meta["saliency_layers"])
    rng = np.random.default_rng(args.seed)
    events = [sounds.sample_events(rng) for _ in range(args.n)]
    ids = torch.tensor([sounds.tokenize(sounds.prompt_text(e)) for e in events])
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n, model.cfg.tokens, model.cfg.patch_dim, generator=gen)
    shift = sample_shift(meta)
    x, warm, last, elapsed = sample_with_attention(model, x, ids, args.steps, args.warmup,
                                                   layers, shift=shift)
    specs = model.unpatchify(x).clamp(-1, 1).numpy()  # n x BANDS x FRAMES
    waves = [sounds.decode(s) for s in specs]
    verdicts = [sounds.check(waves[i], events[i]) for i in range(args.n)]
    ratios = {"warmup": [], "last": []}
    for i, ev in enumerate(events):
        spans = event_spans(waves[i])
        if len(spans) != len(ev):
            continue
        for k, (a, b) in enumerate(spans):
            inside = np.zeros(sounds.FRAMES, bool)
            inside[a:b] = True
            if inside.all():
                continue
            cols = [4 * k + 1, 4 * k + 2]  # "a P K then a P K": P and K of event k
            localisation(ratios, warm[i], last[i], cols, inside)
    keys = ("count", "kinds", "pitches", "all")
    report(args, {f"{k}_correct": float(np.mean([v[k] for v in verdicts])) for k in keys},
           ratios, "events_measured", layers, elapsed,
           extra={"train_step": int(meta.get("train_step", -1)), "sample_shift": shift})


if __name__ == "__main__":
    main()
