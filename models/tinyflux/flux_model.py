"""TinyFLUX: the built-in FLUX. The transformer is diffusers' own `FluxTransformer2DModel`,
unmodified, at a small config; the text encoder is a small one of ours for the built-in prompt
language (the shapes data of ../tinydit/shapes.py).

  text:    ids (16) -> tok_emb + txt_pos -> 2 pre-LN encoder layers -> LN    = states (16 x d_txt)
           pooled = mean(states)                                (FLUX's `pooled_projections`)
  latent:  patchify 32x32x3 (patch 4) -> 64 tokens x 48                       (FLUX's packed latent)
  ids:     image token (r, c) -> (0, r, c); text tokens -> (0, 0, 0)           (FLUX's RoPE ids)
  model:   FluxTransformer2DModel(hidden_states, encoder_hidden_states=states,
           pooled_projections=pooled, timestep=t, img_ids, txt_ids) -> velocity tokens

Rectified flow as TinyDiT: x_t = (1 - t) x_0 + t noise, velocity target noise - x_0; diffusers'
FLUX scales the timestep by 1000 itself, so `t` goes in as it is.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
from diffusers import FluxTransformer2DModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
from model import TextLayer, sample  # noqa: E402,F401  (TinyDiT's text layer and Euler sampler)
import shapes  # noqa: E402  (the vocabulary the text encoder is trained on)


class FluxConfig:
    def __init__(self, image=32, patch=4, channels=3, double=2, single=4, heads=4, head_dim=32,
                 text_d=128, text_layers=2, vocab=22, max_tokens=16, rope=(8, 12, 12)):
        self.image, self.patch, self.channels = image, patch, channels
        self.double, self.single, self.heads, self.head_dim = double, single, heads, head_dim
        self.text_d, self.text_layers = text_d, text_layers
        self.vocab, self.max_tokens, self.rope = vocab, max_tokens, list(rope)

    @property
    def grid(self):
        return self.image // self.patch

    @property
    def patch_dim(self):
        return self.patch * self.patch * self.channels

    def to_dict(self):
        return dict(self.__dict__)

    def transformer_config(self):
        """Keyword arguments of `FluxTransformer2DModel` (saved as its config.json)."""
        return dict(patch_size=1, in_channels=self.patch_dim, out_channels=self.patch_dim,
                    num_layers=self.double, num_single_layers=self.single,
                    attention_head_dim=self.head_dim, num_attention_heads=self.heads,
                    joint_attention_dim=self.text_d, pooled_projection_dim=self.text_d,
                    guidance_embeds=False, axes_dims_rope=tuple(self.rope))


class TextEncoder(nn.Module):
    """Word ids -> (states, pooled): TinyDiT's text tower, with the mean as the pooled vector."""

    def __init__(self, cfg: FluxConfig):
        super().__init__()
        d = cfg.text_d
        self.tok_emb = nn.Embedding(cfg.vocab, d)
        self.txt_pos = nn.Parameter(torch.randn(cfg.max_tokens, d) * 0.02)
        self.layers = nn.ModuleList([TextLayer(d, 4, 4 * d) for _ in range(cfg.text_layers)])
        self.ln = nn.LayerNorm(d, eps=1e-6)

    def forward(self, ids):
        x = self.tok_emb(ids) + self.txt_pos[None]
        for layer in self.layers:
            x = layer(x)
        x = self.ln(x)
        return x, x.mean(1)


def image_ids(grid):
    r = torch.arange(grid, dtype=torch.float32).repeat_interleave(grid)
    c = torch.arange(grid, dtype=torch.float32).repeat(grid)
    return torch.stack([torch.zeros_like(r), r, c], 1)


class TinyFlux(nn.Module):
    def __init__(self, cfg: FluxConfig):
        super().__init__()
        self.cfg = cfg
        self.text = TextEncoder(cfg)
        self.transformer = FluxTransformer2DModel(**cfg.transformer_config())
        self.register_buffer("img_ids", image_ids(cfg.grid), persistent=False)
        self.register_buffer("txt_ids", torch.zeros(cfg.max_tokens, 3), persistent=False)

    def patchify(self, img):
        b, c, hh, ww = img.shape
        p, g = self.cfg.patch, self.cfg.grid
        x = img.reshape(b, c, g, p, g, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, g * g, p * p * c)

    def unpatchify(self, x):
        b = x.shape[0]
        p, g, c = self.cfg.patch, self.cfg.grid, self.cfg.channels
        x = x.reshape(b, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(b, c, g * p, g * p)

    def forward(self, xt_tokens, t, ids):
        states, pooled = self.text(ids)
        return self.transformer(hidden_states=xt_tokens, encoder_hidden_states=states,
                                pooled_projections=pooled, timestep=t, img_ids=self.img_ids,
                                txt_ids=self.txt_ids, return_dict=False)[0]


TEXT_FORMAT = "flashdiff-tinyflux-text"


def vocabulary(cfg):
    """The words a model of this config reads: the 32x32 language, or scenes.py's."""
    import scenes

    for vocab in (shapes.VOCAB, scenes.VOCAB):
        if len(vocab) == cfg.vocab:
            return vocab
    raise ValueError(f"no built-in vocabulary has {cfg.vocab} words")


def save_folder(model, out, step):
    """`out/transformer/` (diffusers' own save) and `out/text_encoder/model.safetensors`."""
    from safetensors.torch import save_file

    model.transformer.save_pretrained(os.path.join(out, "transformer"), safe_serialization=True)
    os.makedirs(os.path.join(out, "text_encoder"), exist_ok=True)
    text = {k: v.detach().float().contiguous() for k, v in model.text.state_dict().items()}
    meta = {"format": TEXT_FORMAT, "config": json.dumps(model.cfg.to_dict()),
            "vocab": json.dumps(vocabulary(model.cfg)), "text_heads": "4", "step": str(step)}
    save_file(text, os.path.join(out, "text_encoder", "model.safetensors"), metadata=meta)


def load_folder(folder):
    """A model folder written by `save_folder`: (model, training step)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = os.path.join(folder, "text_encoder", "model.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != TEXT_FORMAT:
        raise SystemExit(f"{path}: not a TinyFLUX text encoder (format {meta.get('format')!r})")
    model = TinyFlux(FluxConfig(**json.loads(meta["config"])))
    model.text.load_state_dict(load_file(path))
    model.transformer = FluxTransformer2DModel.from_pretrained(os.path.join(folder, "transformer"))
    return model.eval(), int(meta.get("step", 0)) or None


def engine_noise(seed, n):
    """The engine's `noise(seed, n)`: SplitMix64 uniforms, Box-Muller pairs, f64 then f32."""
    mask = (1 << 64) - 1
    s = seed ^ 0x5DEECE66D1CE4E5D
    out = []

    def nxt():
        nonlocal s
        s = (s + 0x9E3779B97F4A7C15) & mask
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)

    while len(out) < n:
        u1, u2 = max(nxt(), 1e-300), nxt()
        r = math.sqrt(-2.0 * math.log(u1))
        out.append(r * math.cos(2.0 * math.pi * u2))
        out.append(r * math.sin(2.0 * math.pi * u2))
    return np.array(out[:n], dtype=np.float32)
