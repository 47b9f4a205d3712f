"""Golden FLOP counts for the joint models' cost model: torch's own count of one forward of
diffusers' unmodified SD3Transformer2DModel (SD3, and SD3.5 medium's structure with a dual
attention block), WanTransformer3DModel and StableAudioDiTModel, on small configs.

    pip install torch diffusers
    python3 models/reference/flops_golden.py
    # writes models/reference/flops_golden.json

For each model: its config (in FlashDiff's field names, which `models/tests/flops.rs`
builds the same model from), the image (or frame) tokens N and text tokens T of the forward,
`forward`: the FLOPs `torch.utils.flop_counter.FlopCounterMode` counts for the whole
forward, and `once`: the FLOPs of the modules FlashDiff runs once per request instead of in
every forward (the text and pooled / global projections), counted by the same counter on
those modules alone. FlashDiff's `Flops` of a full step must be `forward - once`. The
weights do not change a FLOP count, so they are left as diffusers initialises them.
"""
import json
import os

import torch
from diffusers import SD3Transformer2DModel, StableAudioDiTModel, WanTransformer3DModel
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from torch.utils.flop_counter import FlopCounterMode

HERE = os.path.dirname(os.path.abspath(__file__))


def count(fn):
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def sd3(name, dual):
    cfg = dict(patch=2, in_channels=4, out_channels=4, hidden=64, heads=4, depth=3, pos_max=8,
               context_in_dim=16, pooled_dim=12, qk_norm=bool(dual), dual=list(dual))
    kw = dict(qk_norm="rms_norm", dual_attention_layers=tuple(dual)) if dual else {}
    m = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3,
                              attention_head_dim=16, num_attention_heads=4, joint_attention_dim=16,
                              caption_projection_dim=64, pooled_projection_dim=12, out_channels=4,
                              pos_embed_max_size=8, **kw).eval()
    h, w, t = 12, 16, 7  # a 6 x 8 token grid
    latent, txt, pooled = torch.randn(1, 4, h, w), torch.randn(1, t, 16), torch.randn(1, 12)
    forward = count(lambda: m(hidden_states=latent, encoder_hidden_states=txt,
                              pooled_projections=pooled, timestep=torch.tensor([730.0])))
    once = count(lambda: m.context_embedder(txt)) + count(
        lambda: m.time_text_embed.text_embedder(pooled))
    return dict(family="sd3", name=name, config=cfg, tokens=(h // 2) * (w // 2), text_tokens=t,
                forward=forward, once=once)


def wan():
    cfg = dict(patch=[1, 2, 2], in_channels=4, out_channels=4, heads=2, head_dim=12, depth=2,
               ffn_dim=64, text_dim=16, freq_dim=32, cross_attn_norm=True)
    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                              in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64,
                              num_layers=2, cross_attn_norm=True, rope_max_seq_len=32).eval()
    latent, t = torch.randn(1, 4, 2, 8, 12), 9  # 2 frames of 4 x 6 tokens
    txt = torch.randn(1, t, 16)
    forward = count(lambda: m(hidden_states=latent, timestep=torch.tensor([730.0]),
                              encoder_hidden_states=txt))
    once = count(lambda: m.condition_embedder.text_embedder(txt))
    return dict(family="wan", name="wan2.1", config=cfg, tokens=2 * 4 * 6, text_tokens=t,
                forward=forward, once=once)


def sao():
    cfg = dict(in_channels=8, out_channels=8, heads=4, kv_heads=2, head_dim=16, depth=2,
               cross_dim=24, cross_in=12, global_in=20, time_proj_dim=32)
    m = StableAudioDiTModel(sample_size=16, in_channels=8, num_layers=2, attention_head_dim=16,
                            num_attention_heads=4, num_key_value_attention_heads=2,
                            out_channels=8, cross_attention_dim=24, time_proj_dim=32,
                            global_states_input_dim=20, cross_attention_input_dim=12).eval()
    frames, t = 40, 9
    latent, enc, glob = torch.randn(1, 8, frames), torch.randn(1, t, 12), torch.randn(1, 1, 20)
    rope = get_1d_rotary_pos_embed(16 // 2, frames + 1, use_real=True, repeat_interleave_real=False)
    forward = count(lambda: m(latent, torch.tensor([0.73]), encoder_hidden_states=enc,
                              global_hidden_states=glob, rotary_embedding=rope))
    once = count(lambda: m.cross_attention_proj(enc)) + count(lambda: m.global_proj(glob))
    return dict(family="sao", name="stable-audio-open", config=cfg, tokens=frames, text_tokens=t,
                forward=forward, once=once)


if __name__ == "__main__":
    import diffusers

    models = [sd3("sd3", ()), sd3("sd3.5", (0,)), wan(), sao()]
    out = dict(diffusers=diffusers.__version__, torch=torch.__version__.split("+")[0],
               models=models)
    with open(os.path.join(HERE, "flops_golden.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for m in models:
        print(f"{m['name']}: {m['forward']} FLOPs a forward, {m['once']} of them once per request")
