#!/usr/bin/env python3
"""What FlashDiff's policies cost when called from Python, next to the forward they
accompany: per denoising step, the gate's decision and observation; per request, the
saliency map and the partition; per patch-step, a scheduler dispatch and completion. The
forward is a FLUX transformer (diffusers' FluxTransformer2DModel, TinyFLUX's configuration
with random weights) on one 32x32 image, 64 image and 16 text tokens.

    python3 studies/python_policies.py [--repeat N]

Prints median microseconds per call and the share of one forward.
"""

import argparse
import statistics
import time

import numpy as np

import flashdiff


def median_us(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    patches, tokens, words = 16, 64, 12

    gate = flashdiff.Gate(patches, epsilon=0.1, max_skip=3)
    imp = rng.random(patches, dtype=np.float32)

    def gate_step():
        active, _ = gate.decide()
        gate.observe(imp)

    attn = rng.random((tokens, words), dtype=np.float32)
    mask = np.ones(words, bool)
    sal = flashdiff.saliency_map(attn, mask)

    def partition():
        flashdiff.partition_saliency(flashdiff.saliency_map(attn, mask).reshape(8, 8), patches)

    sched = flashdiff.Scheduler(workers=2)
    state = {"id": 0}

    def patch_steps():
        # One request's warm-up and one step of 16 patches on two workers.
        state["id"] += 1
        r = state["id"]
        sched.admit(r)
        t = sched.dispatch(0)
        sched.complete(0, t["tag"])
        sched.submit_step(r, 1, [(p, 1.0) for p in range(patches)])
        for i in range(patches):
            w = i % 2
            t = sched.dispatch(w)
            sched.complete(w, t["tag"])
        sched.finish(r)

    rows = [
        ("gate: decide + observe (per step)", median_us(gate_step, a.repeat), 1),
        ("saliency map + partition (per request)", median_us(partition, max(1, a.repeat // 10)), 1),
        ("scheduler: warm-up + 16 patch-steps (per step, 17 dispatches)", median_us(patch_steps, max(1, a.repeat // 10)), 1),
    ]
    forward_us = None
    try:
        import torch
        from diffusers import FluxTransformer2DModel

        torch.manual_seed(0)
        t = FluxTransformer2DModel(patch_size=1, in_channels=48, out_channels=48, num_layers=2, num_single_layers=4,
                                   attention_head_dim=32, num_attention_heads=4, joint_attention_dim=128,
                                   pooled_projection_dim=128, guidance_embeds=False, axes_dims_rope=(8, 12, 12)).eval()
        x, e, p = torch.randn(1, 64, 48), torch.randn(1, 16, 128), torch.randn(1, 128)
        ids = torch.zeros(64, 3)
        ids[:, 1] = torch.arange(64) // 8
        ids[:, 2] = torch.arange(64) % 8

        def fwd():
            with torch.no_grad():
                t(x, encoder_hidden_states=e, pooled_projections=p, timestep=torch.tensor([0.5]),
                  img_ids=ids, txt_ids=torch.zeros(16, 3))

        forward_us = median_us(fwd, max(5, a.repeat // 50))
    except ImportError:
        pass
    print(f"{'what':66s} {'us':>9s}  share of one forward")
    for name, us, _ in rows:
        share = f"{100 * us / forward_us:.2f}%" if forward_us else "-"
        print(f"{name:66s} {us:9.1f}  {share}")
    if forward_us:
        print(f"{'TinyFLUX-sized FLUX transformer forward (CPU, torch)':66s} {forward_us:9.1f}")


if __name__ == "__main__":
    main()
