"""Golden files for SD3 and SD3.5's MMDiT: tiny random SD3Transformer2DModels (diffusers,
unmodified, f32 on CPU), their weights under diffusers' names, inputs and outputs.

    pip install torch diffusers safetensors
    python3 models/reference/mmdit_golden.py
    # writes models/reference/sd3_golden.safetensors (SD3: no Q/K norm, no dual attention)
    #    and models/reference/sd35_golden.safetensors (SD3.5 medium's structure: RMS Q/K
    #    norms, dual attention in block 0), and sd35_stability.safetensors: the same SD3.5
    #    weights in Stability's single-file layout (`model.diffusion_model.joint_blocks...`),
    #    checked by converting them back with diffusers' own converter.

`models/tests/mmdit.rs` must reproduce the outputs (max abs difference <= 1e-4 of the
largest). Latent tokens are also stored in FlashDiff's layout (one 2x2 patch per token,
(row, column, channel) order), so the test compares exactly what the engine will see.
Tensors named `golden.*` are not weights.
"""
import os

import torch
from diffusers import SD3Transformer2DModel
from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
P, C = 2, 4


def tokens(latent):
    """(1, C, H, W) -> (H/P * W/P, P * P * C), row-major tokens, (row, col, channel) inside."""
    _, c, h, w = latent.shape
    x = latent[0].reshape(c, h // P, P, w // P, P)
    return x.permute(1, 3, 2, 4, 0).reshape((h // P) * (w // P), P * P * c).contiguous()


def swap(t):
    """(a, b) halves along dim 0 -> (b, a): diffusers' continuous norms are (scale, shift)."""
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a])


def to_stability(sd, depth, dual):
    """diffusers' names -> Stability's single-file names (prefix included)."""
    out = {"pos_embed": sd["pos_embed.pos_embed"]}
    for w in ["weight", "bias"]:
        out[f"x_embedder.proj.{w}"] = sd[f"pos_embed.proj.{w}"]
        out[f"context_embedder.{w}"] = sd[f"context_embedder.{w}"]
        out[f"final_layer.linear.{w}"] = sd[f"proj_out.{w}"]
        out[f"final_layer.adaLN_modulation.1.{w}"] = swap(sd[f"norm_out.linear.{w}"])
        for a, b in [("t_embedder", "timestep_embedder"), ("y_embedder", "text_embedder")]:
            out[f"{a}.mlp.0.{w}"] = sd[f"time_text_embed.{b}.linear_1.{w}"]
            out[f"{a}.mlp.2.{w}"] = sd[f"time_text_embed.{b}.linear_2.{w}"]
        for i in range(depth):
            d, j = f"transformer_blocks.{i}", f"joint_blocks.{i}"
            last = i == depth - 1
            out[f"{j}.x_block.attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.to_{x}.{w}"] for x in "qkv"])
            out[f"{j}.context_block.attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.add_{x}_proj.{w}"] for x in "qkv"])
            out[f"{j}.x_block.attn.proj.{w}"] = sd[f"{d}.attn.to_out.0.{w}"]
            out[f"{j}.x_block.adaLN_modulation.1.{w}"] = sd[f"{d}.norm1.linear.{w}"]
            ctx = sd[f"{d}.norm1_context.linear.{w}"]
            out[f"{j}.context_block.adaLN_modulation.1.{w}"] = swap(ctx) if last else ctx
            out[f"{j}.x_block.mlp.fc1.{w}"] = sd[f"{d}.ff.net.0.proj.{w}"]
            out[f"{j}.x_block.mlp.fc2.{w}"] = sd[f"{d}.ff.net.2.{w}"]
            if not last:
                out[f"{j}.context_block.attn.proj.{w}"] = sd[f"{d}.attn.to_add_out.{w}"]
                out[f"{j}.context_block.mlp.fc1.{w}"] = sd[f"{d}.ff_context.net.0.proj.{w}"]
                out[f"{j}.context_block.mlp.fc2.{w}"] = sd[f"{d}.ff_context.net.2.{w}"]
            if i in dual:
                out[f"{j}.x_block.attn2.qkv.{w}"] = torch.cat(
                    [sd[f"{d}.attn2.to_{x}.{w}"] for x in "qkv"])
                out[f"{j}.x_block.attn2.proj.{w}"] = sd[f"{d}.attn2.to_out.0.{w}"]
    for i in range(depth):
        d, j = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        for a, b in [("x_block.attn.ln_q", "attn.norm_q"), ("x_block.attn.ln_k", "attn.norm_k"),
                     ("context_block.attn.ln_q", "attn.norm_added_q"),
                     ("context_block.attn.ln_k", "attn.norm_added_k"),
                     ("x_block.attn2.ln_q", "attn2.norm_q"), ("x_block.attn2.ln_k", "attn2.norm_k")]:
            if f"{d}.{b}.weight" in sd:
                out[f"{j}.{a}.weight"] = sd[f"{d}.{b}.weight"]
    return {f"model.diffusion_model.{k}": v.contiguous() for k, v in out.items()}


def write(name, **kw):
    torch.manual_seed(2026 + len(name))
    m = SD3Transformer2DModel(sample_size=8, patch_size=P, in_channels=C, num_layers=3,
                              attention_head_dim=16, num_attention_heads=4,
                              joint_attention_dim=16, caption_projection_dim=64,
                              pooled_projection_dim=12, out_channels=C, pos_embed_max_size=6,
                              **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        m.pos_embed.pos_embed.copy_(torch.randn_like(m.pos_embed.pos_embed) * 0.2)
    latent = torch.randn(1, C, 6, 8)  # a 3 x 4 token grid, cropped from the 6 x 6 positions
    txt = torch.randn(1, 5, 16)
    pooled = torch.randn(1, 12)
    t = 0.73
    with torch.no_grad():
        out = m(hidden_states=latent, encoder_hidden_states=txt, pooled_projections=pooled,
                timestep=torch.tensor([t * 1000.0]), return_dict=False)[0]
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    tensors.update({"golden.x": tokens(latent), "golden.out": tokens(out), "golden.txt": txt[0],
                    "golden.pooled": pooled[0], "golden.t": torch.tensor([t]),
                    "golden.grid": torch.tensor([3.0, 4.0])})
    save_file(tensors, os.path.join(HERE, f"{name}_golden.safetensors"),
              metadata={"diffusers": __import__("diffusers").__version__,
                        "torch": torch.__version__})
    print(f"wrote {name}_golden.safetensors: max |out| {out.abs().max().item():.3f}")
    if kw.get("dual_attention_layers"):
        sd = m.state_dict()
        stab = to_stability(sd, 3, kw["dual_attention_layers"])
        back = convert_sd3_transformer_checkpoint_to_diffusers(dict(stab))
        assert set(back) == set(sd), sorted(set(back) ^ set(sd))
        for k in sd:
            assert torch.equal(back[k], sd[k]), k
        save_file(stab, os.path.join(HERE, f"{name}_stability.safetensors"))
        print(f"wrote {name}_stability.safetensors ({len(stab)} tensors; diffusers' converter "
              "maps them back exactly)")


if __name__ == "__main__":
    write("sd3")
    write("sd35", qk_norm="rms_norm", dual_attention_layers=(0,))
