"""TinyDiT: the built-in text-conditioned Diffusion Transformer (reference implementation).

Kept deliberately plain so that runtime/src/model.rs can re-implement it op for op:
  text:   ids (16) -> tok_emb + txt_pos -> 2 pre-LN encoder layers -> LN  = c_txt (16 x d)
  cond:   c = MLP(sinusoid(1000 t)) + W_pool mean(c_txt)
  latent: patchify 32x32x3 (patch 4) -> 64 tokens x 48 -> x_embed + pos_embed (fixed 2-D sin-cos)
  block:  (sh1, sc1, g1, sh2, sc2, g2) = adaLN(SiLU(c))
          x += g1 * SelfAttn(LN(x) * (1 + sc1) + sh1)
          x += CrossAttn(LN(x), c_txt)
          x += g2 * MLP(LN(x) * (1 + sc2) + sh2)          (MLP: d -> 4d, GELU tanh, -> d)
  final:  (sh, sc) = adaLN_f(SiLU(c)); out = Linear(LN(x) * (1 + sc) + sh) -> velocity tokens
LayerNorms in blocks and final have no affine parameters, eps 1e-6. Rectified flow:
x_t = (1 - t) x_0 + t noise, velocity target noise - x_0, sampling from t = 1 down to 0.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, image=32, patch=4, channels=3, d=128, depth=6, heads=4, text_layers=2,
                 vocab=22, max_tokens=16, mlp_ratio=4):
        self.image, self.patch, self.channels = image, patch, channels
        self.d, self.depth, self.heads = d, depth, heads
        self.text_layers, self.vocab, self.max_tokens = text_layers, vocab, max_tokens
        self.mlp_ratio = mlp_ratio

    @property
    def grid(self):
        return self.image // self.patch

    @property
    def tokens(self):
        return self.grid * self.grid

    @property
    def patch_dim(self):
        return self.patch * self.patch * self.channels

    def to_dict(self):
        return dict(self.__dict__)


def sincos_2d(d, grid):
    """Fixed 2-D sin-cos position table (grid*grid, d): first half encodes row, second column."""
    quarter = d // 4
    omega = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
    rows = torch.arange(grid, dtype=torch.float64).repeat_interleave(grid)
    cols = torch.arange(grid, dtype=torch.float64).repeat(grid)
    out = []
    for p in (rows, cols):
        a = p[:, None] * omega[None]
        out += [torch.sin(a), torch.cos(a)]
    return torch.cat(out, 1).float()


def timestep_embedding(t, dim=256):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = (1000.0 * t.float())[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


def ln(x):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


class Attention(nn.Module):
    def __init__(self, d, heads, cross=False):
        super().__init__()
        self.heads, self.cross = heads, cross
        if cross:
            self.q = nn.Linear(d, d)
            self.kv = nn.Linear(d, 2 * d)
        else:
            self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, ctx=None, return_probs=False):
        b, n, d = x.shape
        h = self.heads
        if self.cross:
            q = self.q(x)
            k, v = self.kv(ctx).chunk(2, -1)
        else:
            q, k, v = self.qkv(x).chunk(3, -1)
        q, k, v = (t.reshape(b, -1, h, d // h).transpose(1, 2) for t in (q, k, v))
        if return_probs:
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), -1)
            o = p @ v
        else:
            p = None
            o = F.scaled_dot_product_attention(q, k, v)
        o = o.transpose(1, 2).reshape(b, n, d)
        return self.proj(o), p


class Mlp(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class TextLayer(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn, self.mlp = Attention(d, heads), Mlp(d, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))[0]
        return x + self.mlp(self.ln2(x))


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.ada = nn.Linear(d, 6 * d)
        self.attn, self.cross, self.mlp = Attention(d, heads), Attention(d, heads, True), Mlp(d, hidden)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c, ctx, probs=None):
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(F.silu(c))[:, None].chunk(6, -1)
        a, sp = self.attn(ln(x) * (1 + sc1) + sh1, return_probs=probs is not None)
        x = x + g1 * a
        a, cp = self.cross(ln(x), ctx, return_probs=probs is not None)
        x = x + a
        x = x + g2 * self.mlp(ln(x) * (1 + sc2) + sh2)
        if probs is not None:
            probs.append((sp, cp))
        return x


class TinyDiT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        d, hidden = cfg.d, cfg.d * cfg.mlp_ratio
        self.tok_emb = nn.Embedding(cfg.vocab, d)
        self.txt_pos = nn.Parameter(torch.randn(cfg.max_tokens, d) * 0.02)
        self.text = nn.ModuleList([TextLayer(d, cfg.heads, hidden) for _ in range(cfg.text_layers)])
        self.txt_ln = nn.LayerNorm(d, eps=1e-6)
        self.t_mlp1, self.t_mlp2 = nn.Linear(256, d), nn.Linear(d, d)
        self.pool = nn.Linear(d, d)
        self.x_embed = nn.Linear(cfg.patch_dim, d)
        self.register_buffer("pos_embed", sincos_2d(d, cfg.grid), persistent=False)
        self.blocks = nn.ModuleList([Block(d, cfg.heads, hidden) for _ in range(cfg.depth)])
        self.final_ada = nn.Linear(d, 2 * d)
        self.final = nn.Linear(d, cfg.patch_dim)
        for m in (self.final_ada, self.final):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def patchify(self, img):
        b, c, hh, ww = img.shape
        p, g = self.cfg.patch, self.cfg.grid
        x = img.reshape(b, c, g, p, g, p).permute(0, 2, 4, 3, 5, 1)  # b, gy, gx, py, px, c
        return x.reshape(b, g * g, p * p * c)

    def unpatchify(self, x):
        b = x.shape[0]
        p, g, c = self.cfg.patch, self.cfg.grid, self.cfg.channels
        x = x.reshape(b, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(b, c, g * p, g * p)

    def encode_text(self, ids):
        x = self.tok_emb(ids) + self.txt_pos[None]
        for layer in self.text:
            x = layer(x)
        return self.txt_ln(x)

    def forward(self, xt_tokens, t, ids, probs=None):
        """xt_tokens: (b, 64, 48) patchified noisy image; returns velocity tokens (b, 64, 48)."""
        ctx = self.encode_text(ids)
        c = self.t_mlp2(F.silu(self.t_mlp1(timestep_embedding(t)))) + self.pool(ctx.mean(1))
        x = self.x_embed(xt_tokens) + self.pos_embed[None]
        for blk in self.blocks:
            x = blk(x, c, ctx, probs)
        sh, sc = self.final_ada(F.silu(c))[:, None].chunk(2, -1)
        return self.final(ln(x) * (1 + sc) + sh)


@torch.no_grad()
def sample(model, ids, noise_tokens, steps=50):
    """Euler rectified-flow sampler, t from 1 to 0 in `steps` uniform steps."""
    x = noise_tokens.clone()
    h = 1.0 / steps
    for n in range(steps):
        t = torch.full((x.shape[0],), 1.0 - n * h)
        x = x - h * model(x, t, ids)
    return x
