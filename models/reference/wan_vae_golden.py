"""Golden file for Wan2.1's VAE decoder: a small random AutoencoderKLWan (diffusers,
unmodified, f32 on CPU) with the released structure (causal 3-D convolutions, RMS norms, a
mid attention block, two temporal and three spatial 2x upsamplings), its decoder weights
under diffusers' names, a latent of 3 frames and the decoded 9-frame video.

    pip install torch diffusers safetensors
    python3 models/reference/wan_vae_golden.py   # writes models/reference/wan_vae_golden.safetensors

The latent is given as WanPipeline hands it to the VAE (normalised); the golden output is
`vae.decode(latent / (1 / std) + mean)`, as the pipeline computes it. `models/tests/
wan_vae.rs` must reproduce it (max abs difference <= 1e-4). `golden.*` are not weights;
the config is written to wan_vae_golden.json.
"""
import json
import os
import sys

sys.modules.setdefault("transformers", None)  # diffusers alone

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(2031)
    mean = [0.1, -0.2, 0.05, 0.3]
    std = [1.5, 0.8, 2.0, 1.1]
    m = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                         temperal_downsample=[False, True, True], latents_mean=mean,
                         latents_std=std).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.04)
        z = torch.randn(1, 4, 3, 4, 5)
        zs = z / (1.0 / torch.tensor(std).view(1, 4, 1, 1, 1)) + torch.tensor(mean).view(1, 4, 1, 1, 1)
        video = m.decode(zs).sample
    t = {k: v.contiguous() for k, v in m.state_dict().items()
         if k.startswith("decoder.") or k.startswith("post_quant_conv.")}
    t["golden.z"] = z[0].contiguous()
    t["golden.video"] = video[0].contiguous()
    save_file(t, os.path.join(HERE, "wan_vae_golden.safetensors"))
    cfg = {k: v for k, v in m.config.items() if not k.startswith("_")}
    with open(os.path.join(HERE, "wan_vae_golden.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    print("video", tuple(video.shape), float(video.abs().max()), "saturated", float((video.abs() >= 0.999).float().mean()), "std", float(video.std()))
    print("\n".join(k for k in sorted(t) if "up_blocks.1" not in k and "up_blocks.2" not in k))


if __name__ == "__main__":
    main()
