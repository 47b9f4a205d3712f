"""TinyVideo: TinyDiT (../tinydit/model.py) on a 3-D latent grid, the built-in video model.

The blocks, text encoder and conditioning are TinyDiT's, unchanged, so the Rust runtime runs
both with one implementation. What differs:
  latent:  8 frames x 32x32x3, each frame patchified on its own (patch 8) -> 8 x 4 x 4 = 128
           tokens of 192 values, frame-major (token = (f * 4 + y) * 4 + x)
  pos:     TinyDiT's fixed 2-D sin-cos table of (y, x) plus a 1-D sin-cos table of the frame
           (shipped in the weights file as `pos_embed`, 128 x d)
Self-attention spans every token of every frame (3-D attention); cross-attention as TinyDiT.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
from model import Config, TinyDiT, sincos_2d  # noqa: E402


class VideoConfig(Config):
    def __init__(self, frames=8, image=32, patch=8, **kw):
        super().__init__(image=image, patch=patch, **kw)
        self.frames = frames

    @property
    def tokens(self):
        return self.frames * self.grid * self.grid


def sincos_1d(d, n):
    """Fixed 1-D sin-cos table (n, d) of positions 0..n."""
    half = d // 2
    omega = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    a = torch.arange(n, dtype=torch.float64)[:, None] * omega[None]
    return torch.cat([torch.sin(a), torch.cos(a)], 1).float()


def sincos_3d(d, frames, grid):
    """(frames * grid * grid, d): the frame's 1-D table plus the (y, x) 2-D table."""
    space = sincos_2d(d, grid)
    time = sincos_1d(d, frames)
    return (time[:, None, :] + space[None]).reshape(frames * grid * grid, d)


class VideoDiT(TinyDiT):
    def __init__(self, cfg: VideoConfig):
        super().__init__(cfg)
        self.register_buffer("pos_embed", sincos_3d(cfg.d, cfg.frames, cfg.grid),
                             persistent=False)

    def patchify(self, clip):
        """(b, c, F, H, W) -> (b, F * g * g, p * p * c), frame-major, TinyDiT's order inside."""
        b, c, f, hh, ww = clip.shape
        frames = clip.permute(0, 2, 1, 3, 4).reshape(b * f, c, hh, ww)
        x = super().patchify(frames)
        return x.reshape(b, f * x.shape[1], x.shape[2])

    def unpatchify(self, x):
        b = x.shape[0]
        f, g = self.cfg.frames, self.cfg.grid
        frames = super().unpatchify(x.reshape(b * f, g * g, x.shape[2]))
        return frames.reshape(b, f, *frames.shape[1:]).permute(0, 2, 1, 3, 4)
