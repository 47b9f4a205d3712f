"""Golden file for FLUX.1 in the diffusers layout: a tiny random FluxTransformer2DModel
(diffusers, unmodified, f32 on CPU), its weights under diffusers' names, inputs and output.

    pip install torch diffusers safetensors
    python3 models/reference/flux_golden.py   # writes models/reference/flux_golden.safetensors

`models/tests/flux.rs` loads the weights through our diffusers-layout mapping and must
reproduce the output (max abs difference <= 1e-4). Tensors named `golden.*` are not weights.
"""
import os

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(2026)
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                               attention_head_dim=16, num_attention_heads=4,
                               joint_attention_dim=16, pooled_projection_dim=12,
                               guidance_embeds=True, axes_dims_rope=(4, 6, 6)).eval()
    with torch.no_grad():
        # Norm scales and biases too, so that a mapping error anywhere shows.
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    height, width, nt = 3, 4, 5
    img = torch.randn(1, height * width, 8)
    txt = torch.randn(1, nt, 16)
    pooled = torch.randn(1, 12)
    img_ids = torch.zeros(height * width, 3)
    for t in range(height * width):
        img_ids[t, 1], img_ids[t, 2] = t // width, t % width
    txt_ids = torch.zeros(nt, 3)
    t, g = torch.tensor([0.73]), torch.tensor([3.5])
    with torch.no_grad():
        out = m(hidden_states=img, encoder_hidden_states=txt, pooled_projections=pooled,
                timestep=t, img_ids=img_ids, txt_ids=txt_ids, guidance=g,
                return_dict=False)[0]
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    tensors.update({"golden.img": img[0], "golden.txt": txt[0], "golden.pooled": pooled[0],
                    "golden.t": t, "golden.guidance": g, "golden.out": out[0],
                    "golden.grid": torch.tensor([height, width], dtype=torch.float32)})
    save_file(tensors, os.path.join(HERE, "flux_golden.safetensors"),
              metadata={"diffusers": __import__("diffusers").__version__,
                        "torch": torch.__version__})
    print(f"wrote flux_golden.safetensors: output {tuple(out.shape)}, "
          f"max |out| {out.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
