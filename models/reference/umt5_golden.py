"""Golden file for Wan2.1's text encoder (umT5: T5 with a relative position bias in every
layer): a small random UMT5EncoderModel (transformers, unmodified, f32 on CPU), its weights
under transformers' names, token ids and the final states.

    pip install torch transformers safetensors
    python3 models/reference/umt5_golden.py   # writes models/reference/umt5_golden.safetensors

`models/tests/umt5.rs` must reproduce the states (max abs difference <= 1e-4 of the
largest). The ids run past the exact buckets into the logarithmic ones (positions up to 40
with max_exact 4 and max_distance 32). Tensors named `golden.*` are not weights.
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import UMT5Config, UMT5EncoderModel

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(2030)
    cfg = UMT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
                     relative_attention_num_buckets=16, relative_attention_max_distance=32,
                     feed_forward_proj="gated-gelu", dropout_rate=0.0)
    m = UMT5EncoderModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ids = torch.randint(0, 64, (1, 41))
    with torch.no_grad():
        out = m(input_ids=ids).last_hidden_state
    # The embedding is tied (shared.weight = encoder.embed_tokens.weight): saved once, as
    # the released checkpoints have it.
    t = {k: v.clone().contiguous() for k, v in m.state_dict().items()
         if k != "encoder.embed_tokens.weight"}
    t["golden.ids"] = ids[0].to(torch.int64)
    t["golden.out"] = out[0].contiguous()
    save_file(t, os.path.join(HERE, "umt5_golden.safetensors"))
    with open(os.path.join(HERE, "umt5_golden.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1, sort_keys=True)
    print("out", tuple(out.shape), float(out.abs().max()))
    print(sorted(k for k in t if "block.1" not in k and "block.2" not in k))


if __name__ == "__main__":
    main()
