"""Golden file for the parity test of TinyFLUX: diffusers' unmodified FluxTransformer2DModel
(the training code's model and Euler sampler) against FlashDiff's FLUX code with skipping off.

    python3 models/tinyflux/golden.py models/tinyflux models/tinyflux/golden.safetensors
    python3 models/tinyflux/golden.py models/tinyflux-l models/tinyflux-l/golden.safetensors

A model larger than 32x32 pixels also gets a prompt of the larger scenes (`scenes.py`).

For each prompt: the engine's noise for its seed (SplitMix64 + Box-Muller, as the engine draws
it, written here too so that the test can check both draw the same), the sample after
`STEPS` uniform Euler steps from t = 1 to 0, and that sample as an RGB image in [0, 1]
(height x width x 3). The test runs the engine in full mode on the same prompts and seeds.
"""
import json
import sys

import torch
from safetensors.torch import save_file

from flux_model import engine_noise, load_folder, sample
import scenes
import shapes

PROMPTS = [
    ("a red circle top left on a blue background", 3),
    ("a green triangle top right and a white square bottom left on a black background", 11),
]
LARGER = [("a yellow circle center and a red square bottom right on a green striped background", 5)]
STEPS = 20


@torch.no_grad()
def main(folder, out):
    model, step = load_folder(folder)
    cfg = model.cfg
    tensors = {}
    larger = cfg.image > 32
    prompts = PROMPTS + LARGER if larger else PROMPTS
    tokenize = scenes.tokenize if larger else shapes.tokenize
    for i, (prompt, seed) in enumerate(prompts):
        tokens, values = cfg.grid * cfg.grid, cfg.patch_dim
        noise = torch.from_numpy(engine_noise(seed, tokens * values)).reshape(1, tokens, values)
        ids = torch.tensor([tokenize(prompt)])
        x = sample(model, ids, noise, steps=STEPS)
        img = ((model.unpatchify(x)[0].permute(1, 2, 0) + 1) / 2).clamp(0, 1)
        tensors[f"noise.{i}"] = noise[0].contiguous()
        tensors[f"image.{i}"] = img.contiguous()
    meta = {"prompts": json.dumps([p for p, _ in prompts]), "seeds": json.dumps([s for _, s in prompts]),
            "steps": str(STEPS), "weights_step": str(step)}
    save_file(tensors, out, metadata=meta)
    print(f"wrote {out}: {len(prompts)} prompts, {STEPS} steps, weights at training step {step}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: golden.py MODEL_FOLDER OUT.safetensors")
    main(sys.argv[1], sys.argv[2])
