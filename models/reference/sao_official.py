"""The DiT of `sao_golden.safetensors` under stable-audio-tools' names, as its released
single `model.safetensors` stores them: `model.model.` before every name, the blocks under
`transformer.layers.N` with `pre_norm` / `cross_attend_norm` / `ff_norm` (`gamma`, `beta`),
`self_attn.to_qkv` (Q, K, V stacked), `cross_attn.to_q` and `cross_attn.to_kv` (K, V
stacked), `to_out`, `ff.ff.0.proj` / `ff.ff.2`; `timestep_features.weight` as an n x 1
matrix; `to_timestep_embed`, `to_global_embed`, `to_cond_embed`,
`transformer.project_in` / `project_out`, `preprocess_conv` / `postprocess_conv`.

    pip install torch safetensors
    python3 models/reference/sao_official.py   # writes models/reference/sao_official.safetensors

`models/tests/sao.rs` loads it through `SaoCheckpoint` and must reproduce the golden output.
"""
import os
import re

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    d = {k: v for k, v in load_file(os.path.join(HERE, "sao_golden.safetensors")).items()
         if not k.startswith("golden.")}
    out = {}
    blocks = sorted({int(m.group(1)) for k in d for m in [re.match(r"transformer_blocks\.(\d+)\.", k)] if m})
    for i in blocks:
        b, l = f"transformer_blocks.{i}.", f"transformer.layers.{i}."
        for ours, theirs in [("norm1", "pre_norm"), ("norm2", "cross_attend_norm"), ("norm3", "ff_norm")]:
            out[l + theirs + ".gamma"] = d.pop(b + ours + ".weight")
            out[l + theirs + ".beta"] = d.pop(b + ours + ".bias")
        out[l + "self_attn.to_qkv.weight"] = torch.cat(
            [d.pop(b + f"attn1.to_{x}.weight") for x in "qkv"], 0)
        out[l + "self_attn.to_out.weight"] = d.pop(b + "attn1.to_out.0.weight")
        out[l + "cross_attn.to_q.weight"] = d.pop(b + "attn2.to_q.weight")
        out[l + "cross_attn.to_kv.weight"] = torch.cat(
            [d.pop(b + f"attn2.to_{x}.weight") for x in "kv"], 0)
        out[l + "cross_attn.to_out.weight"] = d.pop(b + "attn2.to_out.0.weight")
        for x in ["0.proj.weight", "0.proj.bias", "2.weight", "2.bias"]:
            out[l + "ff.ff." + x] = d.pop(b + "ff.net." + x)
    out["timestep_features.weight"] = d.pop("time_proj.weight").unsqueeze(1)
    for ours, theirs in [("timestep_proj", "to_timestep_embed"), ("global_proj", "to_global_embed"),
                         ("cross_attention_proj", "to_cond_embed"),
                         ("proj_in", "transformer.project_in"),
                         ("proj_out", "transformer.project_out")]:
        for k in [k for k in d if k.startswith(ours + ".")]:
            out[theirs + k[len(ours):]] = d.pop(k)
    for k in ["preprocess_conv.weight", "postprocess_conv.weight"]:
        out[k] = d.pop(k)
    assert not d, f"unmapped: {sorted(d)}"
    save_file({"model.model." + k: v.contiguous() for k, v in out.items()},
              os.path.join(HERE, "sao_official.safetensors"))
    print("\n".join(sorted(out)[:8]))


if __name__ == "__main__":
    main()
