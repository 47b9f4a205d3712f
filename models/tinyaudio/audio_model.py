"""TinyAudio: TinyDiT (../tinydit/model.py) on a 1-D latent, the built-in audio model.

The blocks, text encoder and conditioning are TinyDiT's, unchanged, so the Rust runtime runs
both with one implementation. What differs:
  latent:  a log-magnitude spectrogram, 64 frames x 32 bands (sounds.py); one token per
           frame: 64 tokens of 32 values in time order (a 1-D grid)
  pos:     a 1-D sin-cos table of the frame (shipped in the weights file as `pos_embed`)
Self-attention spans the whole clip; cross-attention as TinyDiT.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinyvideo"))
from model import Config, TinyDiT  # noqa: E402
from video_model import sincos_1d  # noqa: E402

import sounds  # noqa: E402


class AudioConfig(Config):
    """image = 8 and patch = 1 give TinyDiT's 64 tokens; channels are the bands."""

    def __init__(self, **kw):
        kw.setdefault("image", 8)
        kw.setdefault("patch", 1)
        kw.setdefault("channels", sounds.BANDS)
        super().__init__(**kw)
        self.frames = sounds.FRAMES

    @property
    def tokens(self):
        return self.frames


class AudioDiT(TinyDiT):
    def __init__(self, cfg: AudioConfig):
        super().__init__(cfg)
        self.register_buffer("pos_embed", sincos_1d(cfg.d, cfg.frames), persistent=False)

    def patchify(self, spec):
        """(b, BANDS, FRAMES) -> (b, FRAMES, BANDS): one token per frame."""
        return spec.transpose(1, 2)

    def unpatchify(self, x):
        return x.transpose(1, 2)
