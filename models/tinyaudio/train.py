"""Train TinyAudio on procedural sound events (sounds.py). Resumable: rerun the same command.

    nice -n 19 python3 models/tinyaudio/train.py --out models/tinyaudio/run --hours 2.5

The loop, optimiser, schedule, EMA and checkpoint format are TinyDiT's (../tinydit/train.py);
only the data and the model differ.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
import train as base  # noqa: E402  (TinyDiT's train.py: imported before audio_model adds paths)
from audio_model import AudioConfig, AudioDiT  # noqa: E402
import sounds  # noqa: E402


class AudioTask:
    data, Model = sounds, AudioDiT

    @staticmethod
    def config(args):
        return AudioConfig(d=args.d, depth=args.depth, vocab=len(sounds.VOCAB),
                           max_tokens=sounds.MAX_TOKENS)


if __name__ == "__main__":
    base.main(task=AudioTask, patch=1)
