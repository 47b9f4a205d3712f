"""Train TinyFLUX on the procedural shapes. Resumable: rerun the same command to continue.

    nice -n 19 python3 models/tinyflux/train.py --out RUN --hours H                 # 32x32
    nice -n 19 python3 models/tinyflux/train.py --out RUN --hours H --image 64 \\
        --init-from models/tinyflux                                                # TinyFLUX-L

At 32x32 pixels the data is TinyDiT's (../tinydit/shapes.py); at 64 and 128 it is the larger
scenes of scenes.py. `--init-from FOLDER` starts from a model folder (export.py's layout): a
smaller model's (progressive training: the transformer's weights carry over unchanged, as its
RoPE positions extend to the larger grid; the text encoder gains the new words and positions)
or one of the same size, whose training step it then continues from (a run whose optimiser
state was lost). The loop, optimiser, schedule, EMA and checkpoint format are TinyDiT's
(../tinydit/train.py); only the model and data differ.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
import shapes  # noqa: E402
import train as base  # noqa: E402
import scenes  # noqa: E402
from flux_model import FluxConfig, TinyFlux, load_folder  # noqa: E402


class SceneData:
    """scenes.py at one canvas size, in the shape the loop asks of a data module."""

    def __init__(self, image):
        self.image, self.VOCAB, self.MAX_TOKENS = image, scenes.VOCAB, scenes.MAX_TOKENS

    def batch(self, rng, n):
        return scenes.batch(rng, n, self.image)


class FluxTask:
    data, Model = shapes, TinyFlux

    @staticmethod
    def add_args(ap):
        ap.add_argument("--double", type=int, default=2, help="double-stream (joint) blocks")
        ap.add_argument("--single", type=int, default=4, help="single-stream blocks")
        ap.add_argument("--image", type=int, default=32, choices=[32, 64, 128],
                        help="canvas side in pixels: 32 draws shapes.py, 64 and 128 scenes.py")
        ap.add_argument("--init-from", default=None, metavar="FOLDER",
                        help="start from this model folder's weights (a fresh run only)")

    @staticmethod
    def data_for(args):
        return shapes if args.image == 32 else SceneData(args.image)

    @staticmethod
    def config(args):
        if args.d % args.heads:
            raise SystemExit(f"--d {args.d} is not a multiple of --heads {args.heads}")
        data = FluxTask.data_for(args)
        return FluxConfig(image=args.image, patch=args.patch, double=args.double,
                          single=args.single, heads=args.heads, head_dim=args.d // args.heads,
                          text_d=args.d, vocab=len(data.VOCAB), max_tokens=data.MAX_TOKENS)

    @staticmethod
    def init(model, args):
        """Copies `--init-from`'s weights into `model`; returns the step to start at."""
        if args.init_from is None:
            return 0
        src, step = load_folder(args.init_from)
        s, d = src.cfg, model.cfg
        for key in ("patch", "channels", "double", "single", "heads", "head_dim", "text_d",
                    "text_layers", "rope"):
            if getattr(s, key) != getattr(d, key):
                raise SystemExit(f"--init-from {args.init_from}: its {key} is {getattr(s, key)}, "
                                 f"this run's {getattr(d, key)}")
        if s.vocab > d.vocab or s.max_tokens > d.max_tokens or s.image > d.image:
            raise SystemExit(f"--init-from {args.init_from}: a larger model (vocabulary "
                             f"{s.vocab}, {s.max_tokens} text tokens, {s.image} pixels)")
        model.transformer.load_state_dict(src.transformer.state_dict())
        text = src.text.state_dict()
        with torch.no_grad():
            for name, p in model.text.state_dict().items():
                old = text[name]
                if p.shape == old.shape:
                    p.copy_(old)
                elif name == "tok_emb.weight":  # new words: the mean word, slightly apart
                    p[: old.shape[0]] = old
                    p[old.shape[0]:] = old.mean(0) + 0.02 * torch.randn_like(p[old.shape[0]:])
                elif name == "txt_pos":  # new positions: the last one, slightly apart
                    p[: old.shape[0]] = old
                    p[old.shape[0]:] = old[-1] + 0.02 * torch.randn_like(p[old.shape[0]:])
                else:
                    raise SystemExit(f"--init-from: text encoder weight {name} is {tuple(old.shape)}, "
                                     f"this run's {tuple(p.shape)}")
        same = s.image == d.image and s.vocab == d.vocab and s.max_tokens == d.max_tokens
        start = (step or 0) if same else 0
        print(f"initialised from {args.init_from} (step {step}, {s.image}x{s.image} pixels); "
              + (f"continuing at step {start}" if same else "a new schedule from step 0"),
              flush=True)
        return start


if __name__ == "__main__":
    base.main(task=FluxTask, patch=4)
