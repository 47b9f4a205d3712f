"""Golden file for Stable Audio Open's VAE decoder: a small random AutoencoderOobleck
(diffusers, unmodified, f32 on CPU) with the released model's structure (five upsampling
blocks, Snake activations, weight-normalised convolutions), its decoder's weights under
diffusers' names, a latent and the decoded audio.

    pip install torch diffusers safetensors
    python3 models/reference/oobleck_golden.py   # writes models/reference/oobleck_golden.safetensors

`models/tests/oobleck.rs` must reproduce the audio (max abs difference <= 1e-4 of the
largest value). Tensors named `golden.*` are not weights. It also writes the same decoder
under stable-audio-tools' names (`pretransform.model.decoder.layers.*`, Snake parameters
1-D), the layout of the released `model.safetensors`, as `oobleck_official.safetensors`.
"""
import os
import sys

sys.modules.setdefault("transformers", None)  # diffusers alone; no text models needed

import torch
from diffusers import AutoencoderOobleck
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def official_name(name, blocks):
    """stable-audio-tools' name of a diffusers decoder tensor (the inverse of diffusers'
    scripts/convert_stable_audio.py renaming, written out here)."""
    p = "pretransform.model.decoder."
    rest = name[len("decoder."):]
    if rest.startswith("conv1."):
        return p + "layers.0." + rest[len("conv1."):]
    if rest.startswith("snake1."):
        return p + f"layers.{blocks + 1}." + rest[len("snake1."):]
    if rest.startswith("conv2."):
        return p + f"layers.{blocks + 2}." + rest[len("conv2."):]
    _, b, part, *tail = rest.split(".")
    head = p + f"layers.{int(b) + 1}."
    if part == "snake1":
        return head + "layers.0." + ".".join(tail)
    if part == "conv_t1":
        return head + "layers.1." + ".".join(tail)
    j = int(part[len("res_unit"):])
    inner = {"snake1": "0", "conv1": "1", "snake2": "2", "conv2": "3"}[tail[0]]
    return head + f"layers.{j + 1}.layers.{inner}." + ".".join(tail[1:])


def main():
    torch.manual_seed(2028)
    ratios = [2, 2, 4, 2, 2]
    m = AutoencoderOobleck(encoder_hidden_size=4, downsampling_ratios=ratios,
                           channel_multiples=[1, 2, 2, 3, 4], decoder_channels=4,
                           decoder_input_channels=6, audio_channels=2,
                           sampling_rate=8000).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("alpha") or n.endswith("beta"):
                p.copy_(torch.randn_like(p) * 0.3)
            elif n.endswith("weight_g"):
                p.copy_(torch.rand_like(p) + 0.5)
            else:
                p.copy_(torch.randn_like(p) * 0.3)
        z = torch.randn(1, 6, 5)
        audio = m.decode(z).sample
    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k.startswith("decoder.")}
    golden = dict(sd)
    golden["golden.z"] = z[0].contiguous()
    golden["golden.audio"] = audio[0].contiguous()
    save_file(golden, os.path.join(HERE, "oobleck_golden.safetensors"))
    official = {}
    for k, v in sd.items():
        if k.endswith(".alpha") or k.endswith(".beta"):
            v = v.reshape(-1)
        official[official_name(k, len(ratios))] = v.contiguous()
    save_file(official, os.path.join(HERE, "oobleck_official.safetensors"))
    print("audio", tuple(audio.shape), "max", float(audio.abs().max()), "hop", m.hop_length)
    print("\n".join(sorted(official)[:12]))


if __name__ == "__main__":
    main()
