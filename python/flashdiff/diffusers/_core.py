"""The adapter's public calls: ``enable`` / ``disable`` / ``set_salient`` / ``report`` /
``summary``. The parts: ``_base`` (shared names), ``_state`` (rows, groups, calls),
``_cost`` (FLOPs), ``_adapter`` (one transformer's adapter and its forecasts),
``_attention`` (the processor), ``_step`` (one forward)."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .. import Error
from .._native import DEFAULTS
from ._adapter import _Adapter, _summary
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
    outside the compiled graph and calls it for computed steps). A pipeline's second
    transformer (Wan 2.2's ``transformer_2``, the steps after the boundary) is adapted too,
    with the same settings, each stage warming up and deciding on its own steps.

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
    lead = _Adapter(outer, transformer, sched, pipe, settings)
    setattr(transformer, _ATTR, lead)
    second = _second(pipe)
    if second is not None:  # Wan 2.2: the low-noise stage after the boundary
        outer2, inner2 = second
        if type(inner2).__name__ != name:
            disable(target)
            raise Error(f"transformer_2 is a {type(inner2).__name__}, the first transformer a {name}: "
                        "FlashDiff adapts two transformers of one kind only")
        setattr(inner2, _ATTR, _Adapter(outer2, inner2, sched, pipe, settings, leader=lead))


def _second(pipe: Any) -> Any:
    """A pipeline's second transformer (Wan 2.2's ``transformer_2``), as (what the pipeline
    calls, the module inside), or None."""
    outer = getattr(pipe, "transformer_2", None) if pipe is not None else None
    if outer is None:
        return None
    return outer, getattr(outer, "_orig_mod", outer)


def disable(target: Any) -> None:
    """Puts back the processors, ``forward`` and scheduler method that ``enable`` replaced."""
    pipe, _, transformer, _ = _parts(target)
    second = _second(pipe)
    if second is not None and getattr(second[1], _ATTR, None) is not None:
        getattr(second[1], _ATTR).remove()
        delattr(second[1], _ATTR)
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
    pipe, _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None or a.call is None:
        raise Error("no call has run with FlashDiff enabled")
    out = _report(a)
    second = _second_adapter(pipe)
    if second is not None:
        out["transformer_2"] = _report(second)
    return out


def _second_adapter(pipe: Any) -> Any:
    """The adapter of a pipeline's second transformer, when it has run a call."""
    second = _second(pipe)
    a = getattr(second[1], _ATTR, None) if second is not None else None
    return a if a is not None and a.call is not None else None


def _report(a: _Adapter) -> Dict[str, Any]:
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


def summary(target: Any) -> Dict[str, Any]:
    """What the last call did: per row (branch, sample) the steps that computed anything and
    the steps computed whole (the warm-up's included), and the share of image tokens
    computed after the warm-up; the FLOPs run (forwards, signals and saliency, from the layers' sizes) as a
    fraction of full computation's; the wall time from the call's first transformer forward
    to the end of its last (``seconds``); transformer ``forwards`` run for the ``calls`` the
    pipeline made; the bytes FlashDiff holds for the call, by kind (``state_bytes``); and
    ``text``, one line that says what was skipped, or plainly that nothing was and why.
    The same line is logged at INFO (logger ``flashdiff.diffusers``) when a call ends.

    For a pipeline with a second transformer (Wan 2.2's ``transformer_2``, the steps after
    the boundary) the same for it under ``"transformer_2"``, its line appended to ``text``;
    each stage warms up, decides and forecasts on its own steps."""
    pipe, _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None or a.call is None:
        raise Error("no call has run with FlashDiff enabled")
    out = _summary(a)
    second = _second_adapter(pipe)
    if second is not None:
        out["transformer_2"] = _summary(second)
        out["text"] = f"{out['text']}; transformer_2: {out['transformer_2']['text']}"
    return out
