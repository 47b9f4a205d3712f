"""Train TinyFLUX on the procedural shapes (../tinydit/shapes.py). Resumable: rerun the same
command to continue.

    nice -n 19 python3 models/tinyflux/train.py --out RUN --hours H

The loop, optimiser, schedule, EMA and checkpoint format are TinyDiT's (../tinydit/train.py);
only the model differs (flux_model.py: diffusers' FluxTransformer2DModel and our text encoder).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
import shapes  # noqa: E402
import train as base  # noqa: E402
from flux_model import FluxConfig, TinyFlux  # noqa: E402


class FluxTask:
    data, Model = shapes, TinyFlux

    @staticmethod
    def add_args(ap):
        ap.add_argument("--double", type=int, default=2, help="double-stream (joint) blocks")
        ap.add_argument("--single", type=int, default=4, help="single-stream blocks")

    @staticmethod
    def config(args):
        if args.d % args.heads:
            raise SystemExit(f"--d {args.d} is not a multiple of --heads {args.heads}")
        return FluxConfig(patch=args.patch, double=args.double, single=args.single,
                          heads=args.heads, head_dim=args.d // args.heads, text_d=args.d,
                          vocab=len(shapes.VOCAB), max_tokens=shapes.MAX_TOKENS)


if __name__ == "__main__":
    base.main(task=FluxTask, patch=4)
