"""Golden file for Stable Audio Open's DiT: a tiny random StableAudioDiTModel (diffusers,
unmodified, f32 on CPU), its weights under diffusers' names, inputs and output.

    pip install torch diffusers safetensors
    python3 models/reference/sao_golden.py   # writes models/reference/sao_golden.safetensors

`models/tests/sao.rs` must reproduce the output (max abs difference <= 1e-4 of the largest).
The rotary table is the one diffusers' StableAudioPipeline builds (half the head width,
positions 0 .. 1 + latent length, the global token first). Tensors named `golden.*` are not
weights.
"""
import os

import torch
from diffusers import StableAudioDiTModel
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(2027)
    m = StableAudioDiTModel(sample_size=16, in_channels=8, num_layers=2, attention_head_dim=16,
                            num_attention_heads=4, num_key_value_attention_heads=2,
                            out_channels=8, cross_attention_dim=24, time_proj_dim=32,
                            global_states_input_dim=20, cross_attention_input_dim=12).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    frames, ne = 10, 5
    latent = torch.randn(1, 8, frames)
    enc = torch.randn(1, ne, 12)
    glob = torch.randn(1, 1, 20)
    t = torch.tensor([0.37])
    rope = get_1d_rotary_pos_embed(16 // 2, frames + 1, use_real=True,
                                   repeat_interleave_real=False)
    with torch.no_grad():
        out = m(latent, t, encoder_hidden_states=enc, global_hidden_states=glob,
                rotary_embedding=rope, return_dict=False)[0]
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    tensors.update({"golden.x": latent[0].T.contiguous(), "golden.out": out[0].T.contiguous(),
                    "golden.enc": enc[0], "golden.global": glob[0, 0], "golden.t": t})
    save_file(tensors, os.path.join(HERE, "sao_golden.safetensors"),
              metadata={"diffusers": __import__("diffusers").__version__,
                        "torch": torch.__version__})
    print(f"wrote sao_golden.safetensors: max |out| {out.abs().max().item():.3f}")
    for k, v in m.state_dict().items():
        if "transformer_blocks.1" not in k:
            print(k, tuple(v.shape))


if __name__ == "__main__":
    main()
