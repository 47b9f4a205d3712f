"""Golden files for the Rust runtime's parity tests, from the reference implementation.

    python3 models/tinydit/golden.py --weights models/tinydit/tinydit.safetensors \
        --out models/tinydit/golden.safetensors

Fixed inputs (seeded): a noisy latent at t = 0.7 and a prompt. Outputs:
- velocity of the full forward;
- per-layer cross-attention probabilities averaged over heads (layers x 64 x 16);
- refinement importance R_i for a fixed 4-patch layout (self-attention averaged over heads and
  layers, R_i = (1/|A_i|^2) sum_{u,v in A_i} SA[u, v], paper §4.2);
- a token-subset forward: K/V cache from a full forward at an earlier (x', t'), then only the
  active tokens recomputed at (x, t), reading cached K/V for every other token (displaced
  K/V): velocity and fresh K/V of the active tokens.
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from safetensors import safe_open

import shapes
from model import Config, TinyDiT, ln, timestep_embedding

PROMPT = "a red circle top left and a blue square bottom right on a white background"


def load_model(path):
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    cfg = Config(**json.loads(meta["config"]))
    model = TinyDiT(cfg)
    sd = load_file(path)
    sd.pop("pos_embed")
    model.load_state_dict(sd)
    model.eval()
    return model


def heads(x, h):
    b, n, d = x.shape
    return x.reshape(b, n, h, d // h).transpose(1, 2)


@torch.no_grad()
def subset_forward(model, x_tokens, t, ids, active, cache):
    """Reference regional execution. cache: list per layer of (K, V), each (1, 64, d), from the
    start of the step. Returns velocity of active tokens and their fresh per-layer K/V."""
    cfg = model.cfg
    d, h = cfg.d, cfg.heads
    ctx = model.encode_text(ids)
    c = model.t_mlp2(F.silu(model.t_mlp1(timestep_embedding(t)))) + model.pool(ctx.mean(1))
    idx = torch.tensor(active)
    x = model.x_embed(x_tokens[:, idx]) + model.pos_embed[idx][None]
    fresh = []
    for li, blk in enumerate(model.blocks):
        sh1, sc1, g1, sh2, sc2, g2 = blk.ada(F.silu(c))[:, None].chunk(6, -1)
        q, k, v = blk.attn.qkv(ln(x) * (1 + sc1) + sh1).chunk(3, -1)
        K, V = cache[li][0].clone(), cache[li][1].clone()
        K[:, idx], V[:, idx] = k, v
        fresh.append((k, v))
        p = torch.softmax(heads(q, h) @ heads(K, h).transpose(-1, -2) / math.sqrt(d // h), -1)
        o = (p @ heads(V, h)).transpose(1, 2).reshape(1, len(active), d)
        x = x + g1 * blk.attn.proj(o)
        x = x + blk.cross(ln(x), ctx)[0]
        x = x + g2 * blk.mlp(ln(x) * (1 + sc2) + sh2)
    sh, sc = model.final_ada(F.silu(c))[:, None].chunk(2, -1)
    return model.final(ln(x) * (1 + sc) + sh), fresh


@torch.no_grad()
def full_kv(model, x_tokens, t, ids):
    """Per-layer K/V of a full forward (what warm-up leaves in the cache)."""
    cache = []
    orig = []
    for blk in model.blocks:
        def hook(mod, inp, out, store=cache):
            q, k, v = out.chunk(3, -1)
            store.append((k.clone(), v.clone()))
        orig.append(blk.attn.qkv.register_forward_hook(hook))
    model(x_tokens, t, ids)
    for hnd in orig:
        hnd.remove()
    return cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(1234)
    model = load_model(args.weights)
    ids = torch.tensor([shapes.tokenize(PROMPT)])
    x0 = torch.randn(1, 64, model.cfg.patch_dim)
    x1 = torch.randn(1, 64, model.cfg.patch_dim)
    t0, t1 = torch.tensor([0.8]), torch.tensor([0.7])

    probs = []
    with torch.no_grad():
        vel = model(x1, t1, ids, probs=probs)
    cross = torch.stack([cp.mean(1)[0] for _, cp in probs])  # layers x 64 x 16
    sa = torch.stack([sp.mean(1)[0] for sp, _ in probs]).mean(0)  # 64 x 64, heads+layers avg
    # Layout: four 4x4 quadrants of the 8x8 grid, patch = 2 * (row >= 4) + (col >= 4).
    layout = torch.tensor([2 * (i // 8 >= 4) + (i % 8 >= 4) for i in range(64)])
    imp = torch.stack([sa[layout == p][:, layout == p].sum() / (layout == p).sum() ** 2
                       for p in range(4)])

    cache = full_kv(model, x0, t0, ids)
    active = [i for i in range(64) if layout[i] in (0, 3)]
    vs, fresh = subset_forward(model, x1, t1, ids, active, cache)
    # Sanity: all tokens active with any cache equals the full forward.
    vall, _ = subset_forward(model, x1, t1, ids, list(range(64)), cache)
    assert torch.allclose(vall, vel, atol=1e-5), (vall - vel).abs().max()

    out = {
        "ids": ids[0].to(torch.int64),
        "x": x1[0], "t": t1, "x_prev": x0[0], "t_prev": t0,
        "velocity": vel[0],
        "cross_attn": cross,
        "layout": layout.to(torch.int64),
        "importance": imp,
        "active": torch.tensor(active, dtype=torch.int64),
        "subset_velocity": vs[0],
    }
    for li, (k, v) in enumerate(cache):
        out[f"cache_k.{li}"], out[f"cache_v.{li}"] = k[0], v[0]
    for li, (k, v) in enumerate(fresh):
        out[f"fresh_k.{li}"], out[f"fresh_v.{li}"] = k[0], v[0]
    save_file({k: v.contiguous() for k, v in out.items()}, args.out,
              metadata={"prompt": PROMPT})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
