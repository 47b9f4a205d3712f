"""Export a training checkpoint's EMA weights as the built-in model (safetensors, f32).

    python3 models/tinydit/export.py --ckpt RUN/ckpt.pt --out models/tinydit/tinydit.safetensors

The file carries its config and vocabulary in the safetensors metadata, and the fixed
position table as the tensor `pos_embed`, so the Rust runtime needs nothing else.
"""
import argparse
import json

import torch
from safetensors.torch import save_file

import shapes
from model import Config, TinyDiT


def load(ckpt_path, ema=True):
    ck = torch.load(ckpt_path, weights_only=False, map_location="cpu")
    cfg = Config(**ck["config"])
    model = TinyDiT(cfg)
    model.load_state_dict(ck["ema" if ema else "model"])
    model.eval()
    return model, ck["step"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--saliency-layers", default="", help="comma list; default: last half")
    args = ap.parse_args()
    model, step = load(args.ckpt)
    cfg = model.cfg
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors["pos_embed"] = model.pos_embed.float().contiguous()
    layers = ([int(x) for x in args.saliency_layers.split(",")] if args.saliency_layers
              else list(range(cfg.depth // 2, cfg.depth)))
    meta = {
        "format": "flashdiff-tinydit",
        "format_version": "1",
        "config": json.dumps(cfg.to_dict()),
        "vocab": json.dumps(shapes.VOCAB),
        "function_words": json.dumps(shapes.FUNCTION_WORDS),
        "saliency_layers": json.dumps(layers),
        "train_step": str(step),
    }
    save_file(tensors, args.out, metadata=meta)
    n = sum(v.numel() for v in tensors.values())
    print(f"wrote {args.out}: {len(tensors)} tensors, {n} floats, step {step}")


if __name__ == "__main__":
    main()
