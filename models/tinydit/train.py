"""Train TinyDiT on procedural shapes. Resumable: rerun the same command to continue.

    nice -n 19 python3 models/tinydit/train.py --out models/tinydit/run --hours 2.5

Writes <out>/ckpt.pt (model, EMA, optimiser, step, RNG) every --save-every steps and
<out>/train.log (step, loss, seconds per step). Export with export.py.
"""
import argparse
import math
import copy
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import shapes
from model import Config, TinyDiT


class ImageTask:
    """What train.py trains: the data module (batch, VOCAB, MAX_TOKENS), the model class and
    its config. ../tinyvideo/train.py passes its own."""
    data, Model = shapes, TinyDiT

    @staticmethod
    def config(args):
        return Config(d=args.d, depth=args.depth, patch=args.patch, vocab=len(shapes.VOCAB),
                      max_tokens=shapes.MAX_TOKENS)


def lr_at(args, step):
    """Linear warm-up, then constant; with --anneal-from/--anneal-to a cosine decay to
    --lr-min between those steps. A function of the step alone, so resuming is exact."""
    lr = args.lr * min(1.0, (step + 1) / args.warmup)
    a, b = args.anneal_from, args.anneal_to
    if a is None or b is None or step < a:
        return lr
    if b <= a:
        raise SystemExit("--anneal-to must be greater than --anneal-from")
    started = [c for c in args.cycle or [] if step >= c[0]]
    if started:
        return cycle_lr(args, started[-1], step)
    frac = min(1.0, (step - a) / (b - a))
    return args.lr_min + (lr - args.lr_min) * 0.5 * (1 + math.cos(math.pi * frac))


def cycle_lr(args, cycle, step):
    """One more cycle after the first decay (--cycle FROM TO PEAK): a linear climb from
    --lr-min to PEAK over --warmup steps, then a cosine decay back to --lr-min at TO."""
    start, end, peak = int(cycle[0]), int(cycle[1]), cycle[2]
    if step < start + args.warmup:
        return args.lr_min + (peak - args.lr_min) * (step - start + 1) / args.warmup
    frac = min(1.0, (step - start - args.warmup) / (end - start - args.warmup))
    return args.lr_min + (peak - args.lr_min) * 0.5 * (1 + math.cos(math.pi * frac))


def main(task=ImageTask, patch=4):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--hours", type=float, default=2.0, help="wall-clock budget for this sitting")
    ap.add_argument("--max-steps", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--anneal-from", type=int, default=None,
                    help="step at which a cosine decay of the learning rate starts")
    ap.add_argument("--anneal-to", type=int, default=None,
                    help="step at which the decay reaches --lr-min (held afterwards)")
    ap.add_argument("--lr-min", type=float, default=6e-5)
    ap.add_argument("--cycle", type=float, nargs=3, action="append", default=None,
                    metavar=("FROM", "TO", "PEAK"),
                    help="after the first decay, climb again to PEAK from step FROM and decay "
                         "back to --lr-min at step TO (needs --anneal-from/--anneal-to); "
                         "repeat it for further cycles, each from the end of the last or later")
    ap.add_argument("--unshifted", type=float, default=0.0,
                    help="fraction of each batch whose times are drawn without --shift, so the "
                         "low-noise end, where edges are drawn, is trained too")
    ap.add_argument("--unshifted-from", type=int, default=0,
                    help="first step that draws unshifted times (for a run that began without)")
    ap.add_argument("--reset-ema", action="store_true",
                    help="on resume, restart the EMA from the current weights")
    ap.add_argument("--shift", type=float, default=1.0,
                    help="timestep shift towards noise (SD3): large latents need > 1, because "
                         "their many redundant values give the layout away early")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--patch", type=int, default=patch)
    if hasattr(task, "add_args"):
        task.add_args(ap)  # a task's own architecture flags
    args = ap.parse_args()
    if args.cycle is not None and (args.anneal_from is None or args.anneal_to is None):
        raise SystemExit("--cycle comes after the first decay: give --anneal-from and --anneal-to")
    if not 0.0 <= args.unshifted <= 1.0:
        raise SystemExit("--unshifted is a fraction in [0, 1]")
    previous_end = args.anneal_to
    for start, end, _ in args.cycle or []:
        if start < previous_end:
            raise SystemExit(f"--cycle {start:g}: starts before the previous decay ends "
                             f"(step {previous_end:g})")
        if end <= start + args.warmup:
            raise SystemExit(f"--cycle {start:g} {end:g}: TO must be more than --warmup "
                             f"({args.warmup}) steps after FROM")
        previous_end = end

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # adaLN-zero layers produce denormals: 3-15x slower without
    os.makedirs(args.out, exist_ok=True)
    ckpt_path = os.path.join(args.out, "ckpt.pt")

    cfg = task.config(args)
    data = task.data_for(args) if hasattr(task, "data_for") else task.data
    torch.manual_seed(args.seed)
    model = task.Model(cfg)
    step = 0
    if not os.path.exists(ckpt_path) and hasattr(task, "init"):
        step = task.init(model, args)  # a task's starting weights (and step), e.g. a smaller model's
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    rng = np.random.default_rng(args.seed + step)
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        rng.bit_generator.state = ck["np_rng"]
        torch.set_rng_state(ck["torch_rng"])
        if args.reset_ema:
            ema.load_state_dict(model.state_dict())
        print(f"resumed at step {step}", flush=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump({"model": cfg.to_dict(), "train": vars(args), "vocab": data.VOCAB}, f, indent=1)

    def save():
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "step": step, "np_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(), "config": cfg.to_dict()}, tmp)
        os.replace(tmp, ckpt_path)  # never leave a half-written checkpoint

    log = open(os.path.join(args.out, "train.log"), "a")
    deadline = time.time() + args.hours * 3600
    t0, losses = time.time(), []
    while step < args.max_steps and time.time() < deadline:
        x0, ids, _ = data.batch(rng, args.batch)
        x0 = model.patchify(torch.from_numpy(x0))
        ids = torch.from_numpy(ids)
        t = torch.sigmoid(torch.randn(args.batch))  # logit-normal timesteps (SD3)
        # SD3's resolution shift: more of the batch at high noise, where only the prompt
        # says what the sample shows (t -> s t / (1 + (s - 1) t); 1 leaves t as it is).
        shifted = args.shift * t / (1 + (args.shift - 1) * t)
        if args.unshifted > 0 and step >= args.unshifted_from:
            t = torch.where(torch.arange(args.batch) < round(args.unshifted * args.batch), t,
                            shifted)
        else:
            t = shifted
        noise = torch.randn_like(x0)
        xt = (1 - t)[:, None, None] * x0 + t[:, None, None] * noise
        loss = F.mse_loss(model(xt, t, ids), noise - x0)
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # EMA with a warm-up of its decay, so the initial weights do not linger in it.
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        step += 1
        losses.append(loss.item())
        if step % 50 == 0:
            dt = (time.time() - t0) / len(losses)
            line = f"step {step} loss {np.mean(losses):.4f} sec/step {dt:.3f}"
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
            t0, losses = time.time(), []
        if step % args.save_every == 0:
            save()
    save()
    print(f"stopped at step {step}", flush=True)


if __name__ == "__main__":
    main()
