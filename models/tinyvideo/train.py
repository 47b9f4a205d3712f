"""Train TinyVideo on procedural clips (clips.py). Resumable: rerun the same command.

    nice -n 19 python3 models/tinyvideo/train.py --out models/tinyvideo/run --hours 2.5

The loop, optimiser, schedule, EMA and checkpoint format are TinyDiT's (../tinydit/train.py);
only the data and the model differ.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
import clips  # noqa: E402
import train as base  # noqa: E402
from video_model import VideoConfig, VideoDiT  # noqa: E402


class VideoTask:
    data, Model = clips, VideoDiT

    @staticmethod
    def config(args):
        return VideoConfig(frames=clips.FRAMES, image=clips.IMAGE, patch=args.patch, d=args.d,
                           depth=args.depth, heads=args.heads, vocab=len(clips.VOCAB),
                           max_tokens=clips.MAX_TOKENS)


if __name__ == "__main__":
    base.main(task=VideoTask, patch=8)
