"""Write TinyFLUX's EMA weights from a training checkpoint as a model folder in diffusers'
layout: `transformer/` (FluxTransformer2DModel's config.json and safetensors, loadable with
`FluxTransformer2DModel.from_pretrained`) and `text_encoder/model.safetensors` (the built-in
text encoder, with the model config, vocabulary and training step in its metadata).

    python3 models/tinyflux/export.py RUN/ckpt.pt models/tinyflux
"""
import sys

import torch

from flux_model import FluxConfig, TinyFlux, save_folder


def main(src, dst):
    ck = torch.load(src, weights_only=False, map_location="cpu")
    model = TinyFlux(FluxConfig(**ck["config"]))
    model.load_state_dict(ck["ema"])
    save_folder(model, dst, ck["step"])
    n = sum(v.numel() for v in model.state_dict().values())
    print(f"wrote {dst}/transformer and {dst}/text_encoder: {n} parameters, training step {ck['step']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: export.py CKPT.pt OUT_FOLDER")
    main(sys.argv[1], sys.argv[2])
