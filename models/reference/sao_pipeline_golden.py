"""Golden file for Stable Audio Open's pipeline parts around the DiT (diffusers,
unmodified, f32 on CPU): the cosine scheduler's timesteps and a small random
StableAudioProjectionModel (the seconds' number embedders) with its outputs.

    pip install torch diffusers safetensors torchsde
    python3 models/reference/sao_pipeline_golden.py   # writes models/reference/sao_pipeline_golden.safetensors

`models/tests/sao_pipeline.rs` checks `Schedule::Cosine` against the timesteps (the
scheduler's `t = atan(sigma) 2 / pi` of 10 exponentially spaced sigmas from 500 to 0.3)
and our seconds embeddings against the projection model's (0.0 and 0.05 s; 700 s, which
the model clamps to its 512).
"""
import os
import sys

sys.modules.setdefault("transformers", None)  # diffusers alone; no text models needed

import torch
from diffusers import CosineDPMSolverMultistepScheduler
# The module itself: the pipeline package's lazy import asks for transformers.
from diffusers.pipelines.stable_audio.modeling_stable_audio import StableAudioProjectionModel
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(2029)
    s = CosineDPMSolverMultistepScheduler(sigma_min=0.3, sigma_max=500.0, sigma_data=1.0,
                                          sigma_schedule="exponential",
                                          prediction_type="v_prediction")
    s.set_timesteps(10)
    p = StableAudioProjectionModel(text_encoder_dim=32, conditioning_dim=32, min_value=0,
                                   max_value=512).eval()
    with torch.no_grad():
        for q in p.parameters():
            q.copy_(torch.randn_like(q) * 0.5)
        start = p(start_seconds=torch.tensor([0.0])).seconds_start_hidden_states
        end = p(end_seconds=torch.tensor([0.05])).seconds_end_hidden_states
        clamped = p(end_seconds=torch.tensor([700.0])).seconds_end_hidden_states
    out = {k: v.contiguous() for k, v in p.state_dict().items()}
    out["golden.timesteps"] = s.timesteps.float().contiguous()
    out["golden.sigmas"] = s.sigmas.float().contiguous()
    out["golden.start"] = start.reshape(-1).contiguous()
    out["golden.end"] = end.reshape(-1).contiguous()
    out["golden.end_700"] = clamped.reshape(-1).contiguous()
    save_file(out, os.path.join(HERE, "sao_pipeline_golden.safetensors"))
    print("timesteps", s.timesteps.tolist())
    print("sigmas", s.sigmas.tolist())
    print(sorted(k for k in out if not k.startswith("golden")))


if __name__ == "__main__":
    main()
