"""Write TinyFLUX's EMA weights from a training checkpoint to a safetensors file (the
transformer in diffusers' FluxTransformer2DModel layout under `transformer.`, the text
encoder under `text.`), with the model config and training step in its metadata.

    python3 models/tinyflux/export.py RUN/ckpt.pt models/tinyflux/tinyflux.safetensors
"""
import json
import sys

import torch
from safetensors.torch import save_file


def main(src, dst):
    ck = torch.load(src, weights_only=False, map_location="cpu")
    weights = {k: v.detach().contiguous().float() for k, v in ck["ema"].items()}
    meta = {"config": json.dumps(ck["config"]), "step": str(ck["step"])}
    save_file(weights, dst, metadata=meta)
    n = sum(v.numel() for v in weights.values())
    print(f"wrote {dst}: {len(weights)} tensors, {n} parameters, training step {ck['step']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: export.py CKPT.pt OUT.safetensors")
    main(sys.argv[1], sys.argv[2])
