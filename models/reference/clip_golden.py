"""Golden file for CLIP's text encoder as SD3 reads it: two tiny random
CLIPTextModelWithProjection models (transformers, unmodified, f32 on CPU), one with gelu
(CLIP-G's activation) and one with quick_gelu (CLIP-L's), their weights under transformers'
names, token ids, the penultimate layer's states and the projected pooled vector.

    pip install torch transformers safetensors
    python3 models/reference/clip_golden.py
    # writes models/reference/clip_gelu_golden.safetensors and clip_quick_golden.safetensors

`models/tests/pipeline.rs` must reproduce both outputs (max abs difference <= 1e-4).
Tensors named `golden.*` are not weights.
"""
import os

import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModelWithProjection

HERE = os.path.dirname(os.path.abspath(__file__))


def write(act, name, seed):
    torch.manual_seed(seed)
    cfg = CLIPTextConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=12,
        hidden_act=act,
        projection_dim=24,
        # eos_token_id 2 is transformers' legacy rule: the pooled row is at the largest id.
        eos_token_id=2,
    )
    model = CLIPTextModelWithProjection(cfg).eval()
    # Non-trivial norms and biases, so that a wrong one shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "layer_norm" in n or "bias" in n:
                p.add_(0.1 * torch.randn_like(p))
    # BOS 97, words, EOS 98 (the largest id), then "!"-style padding (id 0).
    ids = torch.tensor([[97, 5, 17, 33, 61, 98, 0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors.pop("text_model.embeddings.position_ids", None)
    tensors["golden.ids"] = ids[0].to(torch.int64)
    tensors["golden.penultimate"] = out.hidden_states[-2][0].contiguous()
    tensors["golden.pooled"] = out.text_embeds[0].contiguous()
    save_file(tensors, os.path.join(HERE, name))
    print(name, "pooled", out.text_embeds[0, :4].tolist())


write("gelu", "clip_gelu_golden.safetensors", 0)
write("quick_gelu", "clip_quick_golden.safetensors", 1)
