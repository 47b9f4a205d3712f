"""Export a training checkpoint's EMA weights as a built-in model (safetensors, f32).

    python3 models/tinydit/export.py --ckpt RUN/ckpt.pt --out models/tinydit/tinydit.safetensors
    python3 models/tinydit/export.py --kind video --ckpt RUN/ckpt.pt \
        --out models/tinyvideo/tinyvideo.safetensors
    python3 models/tinydit/export.py --kind audio --ckpt RUN/ckpt.pt \
        --out models/tinyaudio/tinyaudio.safetensors

The file carries its kind, config and vocabulary in the safetensors metadata, the fixed
position table as the tensor `pos_embed`, and for audio the decoder's constants, so the Rust
runtime needs nothing else.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))

# The sampling schedule's shift s (time u -> s u / (1 + (s - 1) u)) each kind ships with, as
# the metadata "sample_shift"; 1 (uniform steps, no entry) unless measured better. TinyAudio
# takes 0.5: its first steps then cover more of the noise range, so an event's kind and end
# are settled by the end of the warm-up (models/tinyaudio/README.md, "Sampling schedule").
SAMPLE_SHIFT = {"image": 1.0, "video": 1.0, "audio": 0.5}


def task(kind):
    """(data module, model class, config class) of a kind of built-in model."""
    if kind == "image":
        import shapes
        from model import Config, TinyDiT
        return shapes, TinyDiT, Config
    if kind == "video":
        sys.path.insert(0, os.path.join(HERE, "..", "tinyvideo"))
        import clips
        from video_model import VideoConfig, VideoDiT
        return clips, VideoDiT, VideoConfig
    if kind == "audio":
        sys.path.insert(0, os.path.join(HERE, "..", "tinyaudio"))
        import sounds
        from audio_model import AudioConfig, AudioDiT
        return sounds, AudioDiT, AudioConfig
    raise SystemExit(f"unknown kind {kind!r}: image, video or audio")


def load(ckpt_path, ema=True, kind="image"):
    _, Model, Cfg = task(kind)
    ck = torch.load(ckpt_path, weights_only=False, map_location="cpu")
    conf = dict(ck["config"])
    frames = conf.pop("frames", None)
    cfg = Cfg(**conf)
    if frames is not None:
        cfg.frames = frames
    model = Model(cfg)
    model.load_state_dict(ck["ema" if ema else "model"])
    model.eval()
    return model, ck["step"]


def load_weights(path):
    """A built-in model from its exported safetensors file (any kind), in eval mode, and the
    file's metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    kind = meta.get("kind", "image")
    _, Model, Cfg = task(kind)
    conf = json.loads(meta["config"])
    frames = conf.pop("frames", None)
    cfg = Cfg(**conf)
    if frames is not None:
        cfg.frames = frames
    model = Model(cfg)
    sd = load_file(path)
    sd.pop("pos_embed")
    model.load_state_dict(sd)
    model.eval()
    return model, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", default="image", choices=["image", "video", "audio"])
    ap.add_argument("--saliency-layers", default="", help="comma list; default: last half")
    ap.add_argument("--raw", action="store_true",
                    help="the trained weights instead of their EMA (the EMA lags a change "
                         "of recipe by about 1/(1 - decay) steps)")
    ap.add_argument("--sample-shift", type=float, default=None,
                    help="the sampling schedule's shift written to the file (default: the "
                         "kind's, SAMPLE_SHIFT)")
    args = ap.parse_args()
    shift = SAMPLE_SHIFT[args.kind] if args.sample_shift is None else args.sample_shift
    if not 0.01 <= shift <= 100:
        raise SystemExit(f"--sample-shift {shift} must be in [0.01, 100]")
    data, _, _ = task(args.kind)
    model, step = load(args.ckpt, kind=args.kind, ema=not args.raw)
    cfg = model.cfg
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors["pos_embed"] = model.pos_embed.float().contiguous()
    layers = ([int(x) for x in args.saliency_layers.split(",")] if args.saliency_layers
              else list(range(cfg.depth // 2, cfg.depth)))
    meta = {
        "format": "flashdiff-tinydit",
        "format_version": "1",
        "kind": args.kind,
        "config": json.dumps(cfg.to_dict()),
        "vocab": json.dumps(data.VOCAB),
        "function_words": json.dumps(data.FUNCTION_WORDS),
        "saliency_layers": json.dumps(layers),
        "train_step": str(step),
    }
    if shift != 1.0:
        meta["sample_shift"] = json.dumps(shift)
    if args.kind == "audio":
        meta["audio"] = json.dumps({
            "rate": data.RATE, "hop": data.HOP, "db_floor": data.DB_FLOOR,
            "centres": [float(c) for c in data.CENTRES],
        })
    save_file(tensors, args.out, metadata=meta)
    n = sum(v.numel() for v in tensors.values())
    print(f"wrote {args.out}: {args.kind}, {len(tensors)} tensors, {n} floats, step {step}")


if __name__ == "__main__":
    main()
