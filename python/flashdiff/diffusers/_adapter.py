"""The adapter of one transformer: its installed processors and wrapped forward, the
call it is in, and the forecasts of velocity and K/V."""

from __future__ import annotations

import functools
import time
import types
import warnings
from typing import Any, Dict, List, Optional

from .. import Error, salient_mask
from ._base import _KINDS, _families, _torch
from ._cost import _Cost, _controlnets, _stream
from ._state import _Call, _Ctx, _Row


class _Adapter:
    def __init__(self, outer: Any, transformer: Any, scheduler: Any, pipe: Any, settings: Dict[str, Any],
                 leader: Optional["_Adapter"] = None):
        # A pipeline's second transformer (Wan 2.2's low-noise stage) follows the first one's
        # adapter, the `leader`: it alone wraps the scheduler and the prompt encoder and tells
        # its followers when a call starts and with which prompts.
        self.leader = leader
        self.followers: List["_Adapter"] = []
        self.outer = outer  # what the pipeline calls: the transformer, or torch.compile's wrapper of it
        self.transformer = transformer
        self.scheduler = scheduler
        self.pipe = pipe
        self.s = settings
        self.regional = settings["rule"] == "gate"
        self.call: Optional[_Call] = None
        self.ctx: Optional[_Ctx] = None
        self.fresh = False  # set_timesteps ran: the next forward starts a call
        self.pending: List[List[str]] = []  # prompts the pipeline encoded since the last call
        self.prompts: Optional[List[str]] = None  # the positive prompts of the call being set up
        self.salient: Any = None  # set_salient: bool (batch, text) for a bare transformer
        self.saved_processors = dict(transformer.attn_processors)
        self.saved_forward = outer.__dict__.get("forward")
        self.orig_forward = outer.forward
        # Forwards with a FlashDiff context (the saliency step once per call; every forward of
        # the regional rule, whose K/V caches change each step) run outside torch.compile's
        # graph: they read values back to the host and would only add graphs.
        self.eager_forward = transformer.forward if outer is not transformer else outer.forward
        self.forward_fn = self.orig_forward
        self.removed = False
        names = list(self.saved_processors)
        self.kind = _KINDS[type(transformer).__name__]
        self.sd3 = self.kind == "sd3"
        self.hooks: List[Any] = []
        self.dual: List[str] = []
        family = _families()[self.kind]
        procs, forward = family.install(self, transformer, names)
        self.installed = dict(procs)
        self.cost = _Cost(transformer, _stream, family.attention_kind, family.signal_module)
        width = {name + ".processor": (kind, inner) for name, kind, inner in self.cost.attn}
        # The saliency pass (once per call) and the gate's importance (each regional step)
        # read attention probabilities in these blocks: their FLOPs are counted too.
        self.saliency_blocks = [width[n] for n in getattr(self, "saliency_names", self.dual) if n in width]
        self.importance = width.get(self.importance_block, ("self", 0)) if self.regional else ("self", 0)
        transformer.set_attn_processor(procs)
        adapter = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if adapter.removed:  # disabled while something else wrapped this forward
                return adapter.orig_forward(*args, **kwargs)
            return forward(transformer, *args, **kwargs)

        outer.forward = wrapper
        self.wrapper = wrapper
        if leader is not None:
            self.wrapped_sched, self.sched_hooked = scheduler, False
            self.control: List[Any] = []
            leader.followers.append(self)
            return
        self._wrap_scheduler(scheduler)
        # A ControlNet runs in full every step, whatever the transformer skips: its FLOPs
        # count in both the run's and full computation's, at the next transformer forward's
        # token counts.
        self.control: List[Any] = []
        for net in _controlnets(pipe):
            cost = _Cost(net, _stream, family.attention_kind, family.signal_module)
            text = getattr(net, "context_embedder", True) is not None

            def counted(module: Any, args: Any, kwargs: Any, out: Any, cost: Any = cost, text: bool = text) -> None:
                x = kwargs.get("hidden_states", args[0] if args else None)
                self.control.append((cost, int(x.shape[0]) if x is not None else 1, text))

            self.hooks.append(net.register_forward_hook(counted, with_kwargs=True))
        if pipe is not None and hasattr(pipe, "encode_prompt"):
            self.orig_encode = pipe.encode_prompt

            # The prompt T5 reads carries the salient words: FLUX's `prompt_2` and SD3's
            # `prompt_3` where given, else `prompt`.
            t5_arg = {"flux": "prompt_2", "sd3": "prompt_3"}.get(self.kind)

            def encode_prompt(self_pipe: Any, prompt: Any = None, *a: Any, **k: Any) -> Any:
                words = k.get(t5_arg) if t5_arg else None
                words = prompt if words is None else words
                adapter.pending.append([words] if isinstance(words, str) else list(words or []))
                return adapter.orig_encode(prompt, *a, **k)

            pipe.encode_prompt = types.MethodType(encode_prompt, pipe)

    def _wrap_scheduler(self, scheduler: Any) -> None:
        """Every ``set_timesteps`` starts a new call, whatever tensor the scheduler keeps."""
        self.wrapped_sched = scheduler
        self.sched_saved = scheduler.__dict__.get("set_timesteps")
        orig = getattr(scheduler, "set_timesteps", None)
        if orig is None:  # a bare clock (timesteps and step_index): new tensors mark new calls
            self.sched_hooked = False
            return
        self.sched_hooked = True
        adapter = self

        @functools.wraps(orig)  # pipelines read its signature (sigmas, timesteps)
        def set_timesteps(*a: Any, **k: Any) -> Any:
            adapter.fresh = True
            adapter.prompts = adapter.pending[0] if adapter.pending else None
            adapter.pending = []
            for f in adapter.followers:
                f.fresh, f.prompts = True, adapter.prompts
            return orig(*a, **k)

        scheduler.set_timesteps = set_timesteps

    def _unwrap_scheduler(self) -> None:
        s = self.wrapped_sched
        if not self.sched_hooked:
            return
        if self.sched_saved is not None:
            s.set_timesteps = self.sched_saved
        elif "set_timesteps" in s.__dict__:
            del s.set_timesteps

    def _adopt_processors(self) -> None:
        """Processors installed after ``enable`` (an IP-Adapter's, ``set_attention_backend``)
        become the ones FlashDiff's processors call where they run the pipeline's own
        attention, and the ones ``disable`` puts back; FlashDiff's go back in their place,
        so the saliency step and the gate's K/V caches keep working."""
        current = self.transformer.attn_processors
        replaced = {n: p for n, p in current.items() if p is not self.installed.get(n)}
        if not replaced:
            return
        self.saved_processors.update(replaced)
        self.transformer.set_attn_processor({**current, **{n: self.installed[n] for n in replaced if n in self.installed}})

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self._adopt_processors()
        self.transformer.set_attn_processor(self.saved_processors)
        # By identity: accelerate's hooks copy the wrapped function's name onto their own.
        if self.outer.__dict__.get("forward") is self.wrapper:
            if self.saved_forward is not None:
                self.outer.forward = self.saved_forward
            else:
                del self.outer.forward
        else:  # something wrapped FlashDiff's forward after enable(): pass through from now on
            self.removed = True
        self._unwrap_scheduler()
        if self.leader is not None and self in self.leader.followers:
            self.leader.followers.remove(self)
        if self.pipe is not None and hasattr(self, "orig_encode"):
            del self.pipe.encode_prompt

    def begin(self) -> _Call:
        """The call this forward belongs to: a new one after ``set_timesteps``, on new
        ``timesteps``, or when the step index goes back."""
        sched = self.pipe.scheduler if self.pipe is not None and hasattr(self.pipe, "scheduler") else self.scheduler
        if sched is not self.wrapped_sched:  # the pipeline's scheduler was replaced
            if self.leader is None:
                self._unwrap_scheduler()
                self._wrap_scheduler(sched)
            else:  # (the leader wraps the new one when it next runs)
                self.wrapped_sched = sched
            self.scheduler = sched
            self.fresh = True
        ts = sched.timesteps
        si = sched.step_index
        # Before its first step a scheduler has no index; an img2img call begins later.
        n = int(si) if si is not None else int(getattr(sched, "begin_index", None) or 0)
        c = self.call
        if self.fresh or c is None or c.timesteps is not ts or n < c.step:
            self.fresh = False
            self._adopt_processors()
            steps = len(ts)
            plain = steps <= 8 and not self.s["force"]
            if plain:
                warnings.warn(
                    f"flashdiff: {steps} steps is a few-step schedule; running it unchanged "
                    "(pass force=True to enable() to skip anyway)",
                    stacklevel=4,
                )
            elif self.s["warmup"] >= steps:
                raise Error(f"warmup {self.s['warmup']}: must be below the call's {steps} steps")
            self.call = _Call(ts, steps, plain, self.prompts)
            self.call.first = n
        c = self.call
        if n != c.step:
            c.step, c.branch = n, 0
        else:
            c.branch += 1
            c.branches = max(c.branches, c.branch + 1)
        c.branches_at[n] = c.branch + 1
        if c.t0 is None:
            c.t0 = time.perf_counter()
        return c

    def grouping(self, call: _Call, batch: int) -> Any:
        """Each row's group, and whether the row carries the group's prompt (its attention
        gives the group's saliency). Under SD3's classifier-free guidance the batch is
        [negatives..., positives...]: row b and row b + batch / 2 are one sample. A later
        call of a step with fewer rows (SD3's skip-layer guidance, which runs the positive
        rows alone) takes the groups of the first call's rows it repeats, the last ones."""
        if call.branch > 0 and call.batch0 and batch != call.batch0:
            groups = call.groups0
            return [groups[call.batch0 - batch + b] for b in range(batch)], [False] * batch
        cfg = self.sd3 and batch % 2 == 0 and bool(getattr(self.pipe, "do_classifier_free_guidance", False))
        half = batch // 2 if cfg else batch
        gid = [b % half for b in range(batch)]
        if call.branch == 0:
            call.batch0, call.groups0 = batch, gid
        return gid, [(b >= half) if cfg else True for b in range(batch)]

    def salient_tokens(self, call: _Call, b: int, g: int, groups: int, text: int, device: Any) -> Any:
        """Which text positions of row `b` (group `g` of `groups`) are its prompt's salient
        words (all, without a prompt)."""
        torch = _torch()
        if self.salient is not None:
            m = self.salient[min(b, self.salient.shape[0] - 1)]
            if m.shape[0] != text or not bool(m.any()):
                raise Error(f"set_salient: {m.shape[0]} positions with {int(m.sum())} salient; the text has {text}")
            return m.to(device)
        mask = torch.ones(text, dtype=torch.bool, device=device)
        # T5's pieces carry the words: FLUX's second tokenizer; SD3's third, whose rows follow
        # CLIP's (77 in SD3's releases); Wan's only one (UMT5).
        name = {"sd3": "tokenizer_3", "flux": "tokenizer_2", "wan": "tokenizer"}[self.kind]
        offset = int(getattr(self.pipe, "tokenizer_max_length", 77)) if self.sd3 else 0
        tok = getattr(self.pipe, name, None) if self.pipe is not None else None
        prompts = call.prompts
        if not prompts or tok is None or groups % len(prompts):
            return mask
        # Rows are prompts x images per prompt, each prompt's images together.
        prompt = prompts[g // (groups // len(prompts))]
        pieces = tok.tokenize(prompt)
        words: List[str] = []
        word_of: List[int] = []
        for p in pieces:
            if p.startswith("\u2581") or not words:
                words.append(p.lstrip("\u2581"))
            else:
                words[-1] += p
            word_of.append(len(words) - 1)
        sal = salient_mask(words)
        m = [bool(sal[w]) for w in word_of][: max(0, text - offset)]
        if not any(m):
            return mask
        mask[:] = False
        mask[offset: offset + len(m)] = torch.tensor(m, device=device)
        return mask


def _forecast(last: Any, slope: Any, last_step: Any, n: int, extrapolate: bool,
              curve: Any = None, gap: Any = None) -> Any:
    """Rows forecast to step `n` from their last computation: along the slope, plus, with a
    second-order store's `curve` and `gap`, the parabola through the last three."""
    if not extrapolate:
        return last.clone()
    shape = (-1, *([1] * (last.dim() - 1)))
    ahead = (n - last_step).to(last.dtype)
    out = last + ahead.view(shape) * slope
    if curve is not None:
        out = out + (ahead * (ahead + gap.to(last.dtype))).view(shape) * curve
    return out


def _refresh(store: List[Any], pos: Any, fresh: Any, n: int) -> None:
    """Writes fresh rows at `pos` (an index tensor, or ``slice(None)`` for every row) of a
    [last, slope, last_step] store, updating slopes; a second-order store ([..., curve, gap])
    also keeps the second divided difference (Newton's form, so uneven gaps stay exact for a
    parabola) and the gap behind the slope."""
    torch = _torch()
    last, slope, last_step = store[:3]
    shape = (-1, *([1] * (fresh.dim() - 1)))
    gap = (n - last_step[pos]).to(fresh.dtype).clamp(min=1)
    measured = (fresh - last[pos]) / gap.view(shape)
    if len(store) == 5:
        curve, before = store[3], store[4]
        b = before[pos].to(fresh.dtype)
        to_curve = torch.where(b > 0, 1.0 / (gap + b), torch.zeros_like(b))
        curve[pos] = (measured - slope[pos]) * to_curve.view(shape)
        before[pos] = gap.to(before.dtype)
    slope[pos] = measured
    last[pos] = fresh
    last_step[pos] = n


def _vel_forecast(a: "_Adapter", row: "_Row", n: int) -> Any:
    """Every token's velocity forecast to step `n` at the adapter's `reuse`."""
    return _forecast(*row.vel[:3], n, a.s["reuse"] != "stale", *row.vel[3:])


def _record_velocity(a: "_Adapter", row: _Row, v: Any, n: int) -> None:
    torch = _torch()
    v = v.detach().float()  # a half-precision history would round the second differences away
    if row.vel is None:
        row.vel = [v.clone(), torch.zeros_like(v), torch.full((v.shape[0],), n, dtype=torch.long, device=v.device)]
        if a.s["reuse"] == "extrapolate2":
            row.vel += [torch.zeros_like(v), torch.zeros((v.shape[0],), dtype=torch.long, device=v.device)]
    else:
        _refresh(row.vel, slice(None), v, n)  # every row: whole slices, no index tensors


def _summary(a: _Adapter) -> Dict[str, Any]:
    """What the adapter's last call did (see ``summary``)."""
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
