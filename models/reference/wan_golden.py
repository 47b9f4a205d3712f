"""Golden file for Wan2.1's text-to-video transformer: a tiny random WanTransformer3DModel
(diffusers, unmodified, f32 on CPU) with Wan2.1's structure, its weights under diffusers'
names, inputs and output.

    pip install torch diffusers safetensors
    python3 models/reference/wan_golden.py
    # writes models/reference/wan_golden.safetensors, and wan_official.safetensors: the same
    # weights in Wan-AI's own layout (`blocks.N.self_attn.q.weight`, ...), checked by
    # converting them back with diffusers' own converter

`models/tests/wan.rs` must reproduce the output (max abs difference <= 1e-4 of the largest).
Latent tokens are stored in FlashDiff's layout too (one 1x2x2 patch per token, frame-major,
(frame, row, column, channel) order inside). Tensors named `golden.*` are not weights.
"""
import os

import torch
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
PT, PH, PW, C = 1, 2, 2, 4


def tokens(latent):
    """(1, C, F, H, W) -> (F' H' W', PT PH PW C)."""
    _, c, f, h, w = latent.shape
    x = latent[0].reshape(c, f // PT, PT, h // PH, PH, w // PW, PW)
    x = x.permute(1, 3, 5, 2, 4, 6, 0)
    return x.reshape((f // PT) * (h // PH) * (w // PW), PT * PH * PW * c).contiguous()


OFFICIAL = [  # diffusers' name part -> Wan-AI's, applied in order
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
    (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."), (".to_out.0.", ".o."),
    (".norm2.", ".norm3."), (".scale_shift_table", ".modulation"),
    (".ffn.net.0.proj.", ".ffn.0."), (".ffn.net.2.", ".ffn.2."),
    ("proj_out.", "head.head."),
]


def to_official(sd):
    out = {}
    for k, v in sd.items():
        n = "head.modulation" if k == "scale_shift_table" else k
        for a, b in OFFICIAL:
            n = n.replace(a, b)
        out[n] = v.contiguous()
    return out


def main():
    torch.manual_seed(2028)
    m = WanTransformer3DModel(patch_size=(PT, PH, PW), num_attention_heads=2,
                              attention_head_dim=12, in_channels=C, out_channels=C, text_dim=16,
                              freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                              rope_max_seq_len=32).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    latent = torch.randn(1, C, 3, 4, 6)  # 3 frames of 2 x 3 tokens
    txt = torch.randn(1, 5, 16)
    t = 730.0
    with torch.no_grad():
        out = m(hidden_states=latent, timestep=torch.tensor([t]), encoder_hidden_states=txt,
                return_dict=False)[0]
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    tensors.update({"golden.x": tokens(latent), "golden.out": tokens(out), "golden.txt": txt[0],
                    "golden.t": torch.tensor([t]), "golden.grid": torch.tensor([3.0, 2.0, 3.0])})
    save_file(tensors, os.path.join(HERE, "wan_golden.safetensors"),
              metadata={"diffusers": __import__("diffusers").__version__,
                        "torch": torch.__version__})
    print(f"wrote wan_golden.safetensors: max |out| {out.abs().max().item():.3f}")
    sd = m.state_dict()
    official = to_official(sd)
    back = convert_wan_transformer_to_diffusers(dict(official))
    assert set(back) == set(sd), sorted(set(back) ^ set(sd))
    for k in sd:
        assert torch.equal(back[k], sd[k]), k
    save_file(official, os.path.join(HERE, "wan_official.safetensors"))
    print(f"wrote wan_official.safetensors ({len(official)} tensors; diffusers' converter maps "
          "them back exactly)")


if __name__ == "__main__":
    main()
