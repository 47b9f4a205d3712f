"""Golden files for SD3 and SD3.5's MMDiT: tiny random SD3Transformer2DModels (diffusers,
unmodified, f32 on CPU), their weights under diffusers' names, inputs and outputs.

    pip install torch diffusers safetensors
    python3 models/reference/mmdit_golden.py
    # writes models/reference/sd3_golden.safetensors (SD3: no Q/K norm, no dual attention)
    #    and models/reference/sd35_golden.safetensors (SD3.5 medium's structure: RMS Q/K
    #    norms, dual attention in block 0)

`models/tests/mmdit.rs` must reproduce the outputs (max abs difference <= 1e-4 of the
largest). Latent tokens are also stored in FlashDiff's layout (one 2x2 patch per token,
(row, column, channel) order), so the test compares exactly what the engine will see.
Tensors named `golden.*` are not weights.
"""
import os

import torch
from diffusers import SD3Transformer2DModel
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
P, C = 2, 4


def tokens(latent):
    """(1, C, H, W) -> (H/P * W/P, P * P * C), row-major tokens, (row, col, channel) inside."""
    _, c, h, w = latent.shape
    x = latent[0].reshape(c, h // P, P, w // P, P)
    return x.permute(1, 3, 2, 4, 0).reshape((h // P) * (w // P), P * P * c).contiguous()


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


if __name__ == "__main__":
    write("sd3")
    write("sd35", qk_norm="rms_norm", dual_attention_layers=(0,))
