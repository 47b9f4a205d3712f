"""The adapter's public calls: ``enable`` / ``disable`` / ``set_salient`` / ``report`` /
``summary``. The parts: ``_base`` (shared names), ``_state`` (rows, groups, calls),
``_cost`` (FLOPs), ``_adapter`` (one transformer's adapter and its forecasts),
``_attention`` (the processor), ``_step`` (one forward)."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from .. import Error
from .._native import DEFAULTS
from ._adapter import _Adapter
from ._base import _ATTR, _KINDS, _torch


def _parts(target: Any) -> Any:
    """(pipeline or None, what the pipeline calls, the transformer inside it, scheduler)."""
    outer = getattr(target, "transformer", None)
    pipe = target
    if outer is None:
        outer, pipe = target, None
    inner = getattr(outer, "_orig_mod", outer)  # torch.compile's wrapper holds the module
    return pipe, outer, inner, getattr(pipe, "scheduler", None) if pipe is not None else None


def enable(target: Any, epsilon: float = DEFAULTS["epsilon"], patches: int = DEFAULTS["patches"],
           max_skip: int = DEFAULTS["max_skip"], warmup: int = DEFAULTS["warmup"],
           reuse: str = "extrapolate", force: bool = False, scheduler: Any = None,
           rule: str = "budget") -> None:
    """Enables FlashDiff on a ``FluxPipeline``, ``StableDiffusion3Pipeline`` or ``WanPipeline``
    (their ControlNet pipelines too), or on their transformer with the ``scheduler`` that
    drives it; after ``torch.compile``, the compiled transformer (the adapter decides
    outside the compiled graph and calls it for computed steps).

    ``rule`` is ``"budget"`` (the engine's whole-step rule: a step runs every row of a
    sample once one of its patches has changed by ``epsilon``, or after ``max_skip`` skipped
    steps; otherwise the sample advances on its forecast velocity) or ``"gate"`` (the paper's
    gate, a regional rule: each step runs the patches whose attention importance is above
    ``epsilon``, with the others' K/V forecast). ``epsilon`` 0 never skips; ``patches`` the
    patch count, ``warmup`` the full steps before the saliency cut, ``reuse``
    ``"extrapolate"``, ``"extrapolate2"`` (velocities along the parabola through their last
    three computations) or ``"stale"``."""
    pipe, outer, transformer, sched = _parts(target)
    sched = scheduler or sched
    name = type(transformer).__name__
    if name not in _KINDS:
        raise Error(f"{type(target).__name__}: not supported (FluxPipeline, StableDiffusion3Pipeline, WanPipeline "
                    "and their transformers are)")
    if sched is None:
        raise Error("a bare transformer needs the scheduler that drives it: enable(t, scheduler=...)")
    if not (0.0 <= epsilon <= 1.0):
        raise Error(f"epsilon {epsilon}: must be in [0, 1]")
    if patches < 1 or max_skip < 0 or warmup < 1:
        raise Error(f"patches {patches}, max_skip {max_skip}, warmup {warmup}: need patches >= 1, max_skip >= 0, warmup >= 1")
    if reuse not in ("extrapolate", "extrapolate2", "stale"):
        raise Error(f"reuse {reuse!r}: expected extrapolate, extrapolate2 or stale (the resume correction, "
                    "corrected / corrected2, runs in the engine only)")
    if rule not in ("budget", "gate"):
        raise Error(f"rule {rule!r}: expected budget or gate")
    if getattr(transformer, _ATTR, None) is not None:
        disable(target)
    settings = dict(epsilon=epsilon, patches=patches, max_skip=max_skip, warmup=warmup, reuse=reuse, force=force,
                    rule=rule)
    setattr(transformer, _ATTR, _Adapter(outer, transformer, sched, pipe, settings))


def disable(target: Any) -> None:
    """Puts back the processors, ``forward`` and scheduler method that ``enable`` replaced."""
    _, _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None:
        return
    a.remove()
    delattr(transformer, _ATTR)


def _adapter(target: Any) -> _Adapter:
    _, _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None:
        raise Error("FlashDiff is not enabled on this transformer: call enable() first")
    return a


def set_salient(target: Any, mask: Any) -> None:
    """For a bare transformer, which text positions are the prompt's salient words: a bool
    array ``(batch, text)`` (or ``(text,)`` for every sample), used by the next calls'
    saliency maps. Without it every text position counts (a pipeline maps its tokenizer's
    pieces to words itself)."""
    torch = _torch()
    a = _adapter(target)
    m = torch.as_tensor(np.asarray(mask, dtype=bool))
    a.salient = m.view(1, -1) if m.dim() == 1 else m


def report(target: Any) -> Dict[str, Any]:
    """The last call's work: steps, warm-up, and per row (branch and batch row) its group,
    patches and the image tokens computed each step after the warm-up."""
    a = getattr(_parts(target)[2], _ATTR, None)
    if a is None or a.call is None:
        raise Error("no call has run with FlashDiff enabled")
    c = a.call
    ids = {id(g): k for k, g in c.groups.items()}
    rows = []
    for (branch, b), r in sorted(c.rows.items()):
        layout = r.group.layout
        rows.append(dict(branch=branch, sample=b, group=ids[id(r.group)],
                         patches=0 if layout is None else layout.patches,
                         tokens=0 if layout is None else int(layout.patch_of.size),
                         computed_per_step=list(r.computed)))
    return dict(steps=c.steps, warmup=a.s["warmup"], plain=c.plain, rule=a.s["rule"], samples=rows)


def _summary(a: _Adapter) -> Dict[str, Any]:
    c = a.call
    s = a.s
    run = c.steps - c.first  # the steps this call ran (an img2img call starts later)
    warm = 0 if c.plain else min(s["warmup"], run)
    rows = []
    for (branch, b), r in sorted(c.rows.items()):
        tokens = 0 if r.group.layout is None else int(r.group.layout.patch_of.size)
        whole = warm + sum(1 for x in r.computed if tokens and x >= tokens)
        some = warm + sum(1 for x in r.computed if x)
        share = (sum(r.computed) / (tokens * len(r.computed))) if tokens and r.computed else 1.0
        rows.append(dict(branch=branch, sample=b, steps_computed=run if c.plain else some,
                         steps_whole=run if c.plain else whole, token_share=share))
    state: Dict[str, int] = {"velocity": 0, "kv": 0, "signal": 0, "layout": 0}
    for r in c.rows.values():
        for k, x in r.nbytes().items():
            state[k] += x
    for g in c.groups.values():
        for k, x in g.nbytes().items():
            state[k] += x
    frac = 1.0 if c.plain or c.flops_full == 0 else c.flops_run / c.flops_full
    seconds = 0.0 if c.t0 is None or c.t1 is None else c.t1 - c.t0
    whole = [r["steps_whole"] for r in rows]
    some = [r["steps_computed"] for r in rows]

    def span(xs: List[int]) -> str:
        return f"{min(xs)}-{max(xs)}" if min(xs) != max(xs) else f"{xs[0]}"

    if c.plain:
        why = (f"nothing was skipped: {c.steps} steps is a few-step schedule, run unchanged "
               "(enable(..., force=True) skips anyway)")
    elif rows and min(whole) >= run:
        if s["epsilon"] == 0:
            reason = "epsilon 0 never skips"
        elif s["max_skip"] == 0:
            reason = "max_skip 0 never skips"
        elif s["warmup"] >= run - 1:
            reason = f"the warm-up of {s['warmup']} steps covers the call"
        else:
            reason = (f"every step's change used up epsilon {s['epsilon']} (a larger epsilon skips; "
                      "the change is measured per patch)")
        why = f"nothing was skipped: {reason}"
    elif a.regional:
        share = min(r["token_share"] for r in rows), max(r["token_share"] for r in rows)
        shares = f"{share[0]:.2f}" if share[0] == share[1] else f"{share[0]:.2f}-{share[1]:.2f}"
        why = (f"computed {shares} of the image tokens after the warm-up per row ({span(some)} of "
               f"{run} steps ran some patches, {span(whole)} all)")
    else:
        why = f"computed {span(some)} of {run} steps per row"
    text = (f"{why}; {frac:.2f} of full computation's FLOPs; denoising {seconds:.2f} s; "
            f"{c.forwards} transformer forwards for {c.calls} calls; state {sum(state.values())} bytes")
    return dict(steps=c.steps, warmup=s["warmup"], rule=s["rule"], plain=c.plain, rows=rows, flops_fraction=frac,
                seconds=seconds, forwards=c.forwards, calls=c.calls, state_bytes=state, text=text)


def summary(target: Any) -> Dict[str, Any]:
    """What the last call did: per row (branch, sample) the steps that computed anything and
    the steps computed whole (the warm-up's included), and the share of image tokens
    computed after the warm-up; the FLOPs run (forwards, signals and saliency, from the layers' sizes) as a
    fraction of full computation's; the wall time from the call's first transformer forward
    to the end of its last (``seconds``); transformer ``forwards`` run for the ``calls`` the
    pipeline made; the bytes FlashDiff holds for the call, by kind (``state_bytes``); and
    ``text``, one line that says what was skipped, or plainly that nothing was and why.
    The same line is logged at INFO (logger ``flashdiff.diffusers``) when a call ends."""
    a = getattr(_parts(target)[2], _ATTR, None)
    if a is None or a.call is None:
        raise Error("no call has run with FlashDiff enabled")
    return _summary(a)
