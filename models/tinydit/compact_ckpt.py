"""Shrinks a training checkpoint for committing: the trained weights stay f32, the EMA and
the optimiser's moments become bf16 (about 60% of the size).

    python3 models/tinydit/compact_ckpt.py RUN/ckpt.pt models/tinyvideo/checkpoint/ckpt.pt

train.py resumes from the result as from any checkpoint (load_state_dict casts back to
f32); the resumed run then differs from an uninterrupted one by the moments' and the
EMA's rounding (bf16 keeps 8 bits of mantissa), not by the trained weights.
"""
import argparse
import os

import torch


def compact(ck):
    out = dict(ck)
    out["ema"] = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                  for k, v in ck["ema"].items()}
    opt = dict(ck["opt"])
    opt["state"] = {
        i: {k: v.to(torch.bfloat16) if torch.is_tensor(v) and k.startswith("exp_avg") else v
            for k, v in s.items()}
        for i, s in ck["opt"]["state"].items()
    }
    out["opt"] = opt
    out["compact"] = "ema and optimiser moments in bf16"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    ck = torch.load(args.src, weights_only=False)
    tmp = args.dst + ".tmp"
    torch.save(compact(ck), tmp)
    os.replace(tmp, args.dst)
    print(f"wrote {args.dst}: step {ck['step']}, {os.path.getsize(args.dst) / 1e6:.1f} MB "
          f"(from {os.path.getsize(args.src) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
