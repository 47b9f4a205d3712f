"""The adapter common to every family: per-call and per-sample state, the change budget and
the gate, forecasts, the shared attention processor, and ``enable`` / ``disable`` / ``report``."""

from __future__ import annotations


import types


import warnings


from typing import Any, Dict, List, Optional


import numpy as np


from .. import Budget, Error, Gate, partition_saliency, salient_mask
from .._native import DEFAULTS


_ATTR = "_flashdiff_adapter"


# The transformers FlashDiff runs inside, by class name.
_KINDS = {"FluxTransformer2DModel": "flux", "SD3Transformer2DModel": "sd3", "WanTransformer3DModel": "wan"}

def _families() -> Dict[str, Any]:
    """Each family's module, by kind: it installs its processors and ``forward``."""
    from . import flux, sd3, wan

    return {"flux": flux, "sd3": sd3, "wan": wan}



def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise Error("flashdiff.diffusers needs PyTorch and diffusers installed") from e
    return torch


class _Row:
    """One sample of one call: its layout, gate and caches."""

    def __init__(self) -> None:
        self.layout = None
        self.gate: Optional[Gate] = None
        self.budget: Optional[Budget] = None
        self.signal: Optional[Any] = None  # first block's modulated input, last step (device)
        self.tokens: List[Any] = []  # image-token indices of each patch, on the device
        self.sizes: Optional[np.ndarray] = None
        self.kv: Dict[str, List[Any]] = {}  # block -> [k, v, k_slope, v_slope, last_step]
        self.vel: Optional[List[Any]] = None  # [v, slope, last_step]
        self.saliency: Optional[Any] = None  # summed image-to-text attention, (N, T)
        self.computed: List[int] = []  # image tokens computed per step after the warm-up


class _Call:
    """One pipeline call."""

    def __init__(self, timesteps: Any, steps: int, plain: bool) -> None:
        self.timesteps = timesteps
        self.steps = steps
        self.plain = plain
        self.rows: Dict[Any, _Row] = {}
        self.step = -1
        self.branch = 0


class _Ctx:
    """What the attention processors need during one forward of one row."""

    def __init__(self, row: _Row, mode: str, step: int, text: int) -> None:
        self.row = row
        self.mode = mode  # "record" (all tokens, natural order) or "partial"
        self.step = step
        self.text = text
        self.active_tokens = None  # partial: image-token indices, gathered order
        self.want_saliency = False
        self.salient = None  # bool (T,) tensor
        self.importance = None  # partial: (patches,) tensor


class _Adapter:
    def __init__(self, transformer: Any, scheduler: Any, pipe: Any, settings: Dict[str, Any]):
        self.transformer = transformer
        self.scheduler = scheduler
        self.pipe = pipe
        self.s = settings
        self.call: Optional[_Call] = None
        self.ctx: Optional[_Ctx] = None
        self.prompts: Optional[List[str]] = None
        self.salient: Any = None  # set_salient: bool (batch, text) for a bare transformer
        self.saved_processors = dict(transformer.attn_processors)
        self.orig_forward = transformer.forward
        names = list(self.saved_processors)
        self.kind = _KINDS[type(transformer).__name__]
        self.sd3 = self.kind == "sd3"
        self.hooks: List[Any] = []
        self.dual: List[str] = []
        family = _families()[self.kind]
        procs, forward = family.install(self, transformer, names)
        transformer.set_attn_processor(procs)
        transformer.forward = types.MethodType(forward, transformer)
        if pipe is not None and hasattr(pipe, "encode_prompt"):
            self.orig_encode = pipe.encode_prompt
            adapter = self

            def encode_prompt(self_pipe: Any, prompt: Any = None, *a: Any, **k: Any) -> Any:
                adapter.prompts = [prompt] if isinstance(prompt, str) else list(prompt or [])
                return adapter.orig_encode(prompt, *a, **k)

            pipe.encode_prompt = types.MethodType(encode_prompt, pipe)

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.transformer.set_attn_processor(self.saved_processors)
        del self.transformer.forward
        if self.pipe is not None and hasattr(self, "orig_encode"):
            del self.pipe.encode_prompt

    def begin(self) -> _Call:
        """The call this forward belongs to: a new one when the scheduler's timesteps are new."""
        ts = self.scheduler.timesteps
        if self.call is None or self.call.timesteps is not ts:
            steps = len(ts)
            plain = steps <= 8 and not self.s["force"]
            if plain:
                warnings.warn(
                    f"flashdiff: {steps} steps is a few-step schedule; running it unchanged "
                    "(pass force=True to enable() to skip anyway)",
                    stacklevel=3,
                )
            elif self.s["warmup"] >= steps:
                raise Error(f"warmup {self.s['warmup']}: must be below the call's {steps} steps")
            self.call = _Call(ts, steps, plain)
        c = self.call
        si = self.scheduler.step_index
        n = 0 if si is None else int(si)
        if n != c.step:
            c.step, c.branch = n, 0
        else:
            c.branch += 1
        return c

    def salient_tokens(self, row_index: int, batch: int, text: int, device: Any) -> Any:
        """Which text positions are the prompt's salient words (all, without a prompt)."""
        torch = _torch()
        if self.salient is not None:
            m = self.salient[min(row_index, self.salient.shape[0] - 1)]
            if m.shape[0] != text or not bool(m.any()):
                raise Error(f"set_salient: {m.shape[0]} positions with {int(m.sum())} salient; the text has {text}")
            return m.to(device)
        mask = torch.ones(text, dtype=torch.bool, device=device)
        # T5's pieces carry the words: FLUX's second tokenizer; SD3's third, whose rows follow
        # CLIP's 77; Wan's only one (UMT5).
        name, offset = {"sd3": ("tokenizer_3", 77), "flux": ("tokenizer_2", 0), "wan": ("tokenizer", 0)}[self.kind]
        tok = getattr(self.pipe, name, None) if self.pipe is not None else None
        if not self.prompts or tok is None:
            return mask
        per = max(1, batch // max(1, len(self.prompts)))
        prompt = self.prompts[min(row_index // per, len(self.prompts) - 1)]
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
        mask[offset : offset + len(m)] = torch.tensor(m, device=device)
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
    """Writes fresh rows at `pos` of a [last, slope, last_step] store, updating slopes; a
    second-order store ([..., curve, gap]) also keeps the second divided difference (Newton's
    form, so uneven gaps stay exact for a parabola) and the gap behind the slope."""
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


class _Processor:
    """FLUX's attention with FlashDiff's K/V cache (sequence dim 1: (B, L, H, D))."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, adapter: _Adapter, name: str) -> None:
        self.a = adapter
        self.name = name

    def __call__(
        self,
        attn: Any,
        hidden_states: Any,
        encoder_hidden_states: Any = None,
        attention_mask: Any = None,
        image_rotary_emb: Any = None,
    ) -> Any:
        if self.a.ctx is None:  # a call FlashDiff leaves alone: the processor it replaced
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, image_rotary_emb)
        torch = _torch()
        from diffusers.models.transformers import transformer_flux as tf

        q, k, v, eq, ek, ev = tf._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q = attn.norm_q(q.unflatten(-1, (-1, attn.head_dim)))
        k = attn.norm_k(k.unflatten(-1, (-1, attn.head_dim)))
        v = v.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            eq = attn.norm_added_q(eq.unflatten(-1, (-1, attn.head_dim)))
            ek = attn.norm_added_k(ek.unflatten(-1, (-1, attn.head_dim)))
            ev = ev.unflatten(-1, (-1, attn.head_dim))
            q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        if image_rotary_emb is not None:
            q = tf.apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = tf.apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = tf.dispatch_attention_fn(q, k, v, attn_mask=attention_mask, backend=self._attention_backend)
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is not None:
            eo, out = out.split_with_sizes([encoder_hidden_states.shape[1], out.shape[1] - encoder_hidden_states.shape[1]], 1)
            out = attn.to_out[1](attn.to_out[0](out.contiguous()))
            return out, attn.to_add_out(eo.contiguous())
        return out

    def keys_values(self, ctx: _Ctx, q: Any, k: Any, v: Any) -> Any:
        torch = _torch()
        row, n, extrap = ctx.row, ctx.step, self.a.s["reuse"] != "stale"
        k0, v0 = k[0].detach(), v[0].detach()
        if ctx.mode == "record":
            store = row.kv.get(self.name)
            if store is None:
                z = torch.zeros_like(k0)
                steps = torch.zeros(k0.shape[0], dtype=torch.long, device=k0.device)
                row.kv[self.name] = [[k0.clone(), z, steps.clone()], [v0.clone(), torch.zeros_like(v0), steps.clone()]]
            else:
                pos = torch.arange(k0.shape[0], device=k0.device)
                _refresh(store[0], pos, k0, n)
                _refresh(store[1], pos, v0, n)
            if ctx.want_saliency and self.name in self.a.dual:
                t = ctx.text
                probs = self.attention_probs(q[:, t:], k)  # (N, T + N)
                m = probs[:, :t][:, ctx.salient].mean(dim=1) if bool(ctx.salient.any()) else probs[:, :t].mean(dim=1)
                row.saliency = m if row.saliency is None else row.saliency + m
            return k, v
        ks, vs = row.kv[self.name]
        kf = _forecast(ks[0], ks[1], ks[2], n, extrap)
        vf = _forecast(vs[0], vs[1], vs[2], n, extrap)
        t = k0.shape[0] - ctx.active_tokens.numel()  # this block's text rows (0: image only)
        pos = torch.cat([torch.arange(t, device=k0.device), ctx.active_tokens + t])
        kf[pos] = k0
        vf[pos] = v0
        _refresh(ks, pos, k0, n)
        _refresh(vs, pos, v0, n)
        kf, vf = kf.unsqueeze(0), vf.unsqueeze(0)
        if self.name == self.a.importance_block:
            probs = self.attention_probs(q[:, t:], kf)[:, t:]  # (n_active, N)
            ctx.importance = self.patch_mass(ctx, probs)
        return kf, vf

    @staticmethod
    def attention_probs(q: Any, k: Any) -> Any:
        """Softmax attention of `q` rows over `k`, averaged over heads: (rows, keys)."""
        torch = _torch()
        scale = q.shape[-1] ** -0.5
        acc = None
        for h in range(q.shape[2]):
            p = torch.softmax((q[0, :, h].float() @ k[0, :, h].float().T) * scale, dim=-1)
            acc = p if acc is None else acc + p
        return acc / q.shape[2]

    @staticmethod
    def patch_mass(ctx: _Ctx, probs: Any) -> Any:
        """R_i = (1/|A_i|^2) sum over active tokens u of patch i of their mass into patch i."""
        torch = _torch()
        row = ctx.row
        patch_of = row.patch_of_t
        mine = patch_of[ctx.active_tokens]  # patch of each active query
        into = torch.zeros(probs.shape[0], len(row.tokens), device=probs.device, dtype=probs.dtype)
        into.index_add_(1, patch_of, probs)
        own = into.gather(1, mine.view(-1, 1)).squeeze(1)
        r = torch.zeros(len(row.tokens), device=probs.device, dtype=probs.dtype)
        r.index_add_(0, mine, own)
        return r / row.sizes_t.to(probs.dtype) ** 2


def _record_velocity(a: "_Adapter", row: _Row, v: Any, n: int) -> None:
    torch = _torch()
    if row.vel is None:
        row.vel = [v.clone(), torch.zeros_like(v), torch.full((v.shape[0],), n, dtype=torch.long, device=v.device)]
        if a.s["reuse"] == "extrapolate2":
            row.vel += [torch.zeros_like(v), torch.zeros((v.shape[0],), dtype=torch.long, device=v.device)]
    else:
        _refresh(row.vel, torch.arange(v.shape[0], device=v.device), v, n)


def _partition(a: _Adapter, row: _Row, grid: Any, dev: Any) -> None:
    """The saliency map of the last warm-up step, cut into patches by the Rust partitioner;
    `grid` is the latent's token grid, (height, width) or (frames, height, width)."""
    torch = _torch()
    sal = row.saliency.float().cpu().numpy().astype(np.float32)
    tokens = int(np.prod(grid))
    if sal.size != tokens:
        raise Error(f"latent of {sal.size} tokens is not the {'x'.join(map(str, grid))} grid its shape gives")
    patches = min(a.s["patches"], tokens)
    row.layout = partition_saliency(sal.reshape(grid), patches)
    row.tokens = [torch.from_numpy(row.layout.patch_tokens(p).astype(np.int64)).to(dev) for p in range(patches)]
    row.patch_of_t = torch.from_numpy(row.layout.patch_of.astype(np.int64)).to(dev)
    row.sizes_t = torch.from_numpy(row.layout.sizes().astype(np.int64)).to(dev)
    if a.s["rule"] == "budget":
        row.budget = Budget(patches, epsilon=a.s["epsilon"], share=0.0, max_skip=a.s["max_skip"])
    else:
        row.gate = Gate(patches, epsilon=a.s["epsilon"], max_skip=a.s["max_skip"])


def _budget_observe(row: _Row, now: Any) -> None:
    """Feeds the budget each patch's relative L1 change of the signal (tokens x width, on the
    device) since the last step, and the patch's share of it, summed over its tokens on the
    device: the step's one device-to-host read is the patches' changes and shares."""
    torch = _torch()
    patches = len(row.tokens)
    num = torch.zeros(patches, dtype=torch.float64, device=now.device)
    den = torch.zeros_like(num)
    num.index_add_(0, row.patch_of_t, (now - row.signal).abs().sum(dim=1, dtype=torch.float64))
    den.index_add_(0, row.patch_of_t, row.signal.abs().sum(dim=1, dtype=torch.float64))
    both = torch.stack([num / den.clamp(min=1e-12), den]).cpu().numpy().astype(np.float32)
    row.budget.observe(both[0], both[1])
    row.signal = now


def _choose(call: _Call, row: _Row) -> Any:
    """The step's active patches (all at the last step), their image tokens, and whether it
    is the last step."""
    torch = _torch()
    patches = len(row.tokens)
    last = call.step >= call.steps - 1
    if last:
        active = np.ones(patches, dtype=bool)
    elif row.budget is not None:
        active = row.budget.decide()
    else:
        active, _ = row.gate.decide()
    if not active.any():
        return active, None, last
    idx = torch.cat([row.tokens[p] for p in range(patches) if active[p]])
    return active, idx, last


def _observe(row: _Row, ctx: _Ctx, active: Any, last: bool) -> None:
    """Feeds the gate the step's importance: the step's one device-to-host read."""
    if row.gate is not None and not last and ctx.importance is not None:
        imp = ctx.importance.float().cpu().numpy().astype(np.float32)
        row.gate.observe(np.where(active, imp, 0.0).astype(np.float32))


def _decide(a: _Adapter, call: _Call, row: _Row, signal: Any) -> Any:
    """A step's decision after the warm-up: the budget reads `signal()` (the first block's
    modulated input of every token), the rule chooses the active patches, and when none runs
    every token advances on its forecast velocity. Returns (active, token ids or None, last
    step, the forecast velocities when nothing runs)."""
    if row.budget is not None:
        _budget_observe(row, signal())
    active, idx, last = _choose(call, row)
    if row.budget is not None:
        row.budget.ran(active)
    if idx is not None:
        return active, idx, last, None
    row.computed.append(0)
    return active, idx, last, _vel_forecast(a, row, call.step)


def _scatter_tokens(a: _Adapter) -> Any:
    """Before SD3's unpatchify: the computed tokens' outputs among every other token's
    forecast, which the row keeps (token space: patch x patch x channels)."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None:
            return out
        row, n = ctx.row, ctx.step
        fresh = out[0].detach()
        if ctx.mode == "record":
            _record_velocity(a, row, fresh, n)
            return out
        vel = _vel_forecast(a, row, n)
        idx = ctx.active_tokens
        vel[idx] = fresh
        _refresh(row.vel, idx, fresh, n)
        return vel.unsqueeze(0).to(out.dtype)

    return hook


def _output(out: Any, return_dict: bool) -> Any:
    """The transformer's output as its ``forward`` returns it."""
    if return_dict:
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        return Transformer2DModelOutput(sample=out)
    return (out,)


def _hooked_batch(a: _Adapter, call: _Call, samples: List[Any], text: int, grid: Any, dev: Any, run: Any,
                  signal: Any, unpatchify: Any) -> Any:
    """Every sample of a call (its forward's arguments, one row each) through
    [`_hooked_row`], each with the row of its branch and index; their outputs stacked."""
    torch = _torch()
    outs = []
    for b, args in enumerate(samples):
        row = call.rows.setdefault((call.branch, b), _Row())
        outs.append(_hooked_row(a, call, row, b, len(samples), text, grid, dev,
                                run=lambda args=args: run(*args), signal=lambda args=args: signal(args),
                                unpatchify=unpatchify))
    return torch.cat(outs, 0)


def _hooked_row(a: _Adapter, call: _Call, row: _Row, b: int, batch: int, text: int, grid: Any, dev: Any,
                run: Any, signal: Any, unpatchify: Any) -> Any:
    """One sample's step on a transformer whose hooks gather the active tokens after the
    patch embedding and scatter them among the forecast ones before the unpatchify (SD3,
    Wan). `run` calls the transformer, `signal` gives the first block's modulated input of
    every token (the budget's change), `unpatchify` turns forecast token velocities into the
    transformer's output shape for a step that runs no patch."""
    n, warm = call.step, a.s["warmup"]
    if n < warm:
        ctx = _Ctx(row, "record", n, text)
        ctx.want_saliency = n == warm - 1
        if ctx.want_saliency:
            ctx.salient = a.salient_tokens(b, batch, text, dev)
        a.ctx = ctx
        try:
            o = run()
        finally:
            a.ctx = None
        if ctx.want_saliency:
            _partition(a, row, grid, dev)
            if row.budget is not None:
                row.signal = signal()
        return o
    active, idx, last, vel = _decide(a, call, row, signal)
    if vel is not None:
        return unpatchify(vel.unsqueeze(0))
    ctx = _Ctx(row, "partial", n, text)
    ctx.active_tokens = idx
    a.ctx = ctx
    try:
        o = run()
    finally:
        a.ctx = None
    row.computed.append(int(idx.numel()))
    _observe(row, ctx, active, last)
    return o


def _parts(target: Any) -> Any:
    transformer = getattr(target, "transformer", None)
    if transformer is None:
        return None, target, None
    return target, transformer, getattr(target, "scheduler", None)


def enable(target: Any, epsilon: float = DEFAULTS["epsilon"], patches: int = DEFAULTS["patches"],
           max_skip: int = DEFAULTS["max_skip"], warmup: int = DEFAULTS["warmup"],
           reuse: str = "extrapolate", force: bool = False, scheduler: Any = None,
           rule: str = "budget") -> None:
    """Enables FlashDiff on a ``FluxPipeline``, ``StableDiffusion3Pipeline`` or ``WanPipeline``
    (or their transformer with the ``scheduler`` that drives it). ``rule`` is ``"budget"``
    (FlashDiff's change budget, the engine's rule) or ``"gate"`` (the paper's gate);
    ``epsilon`` is the budget a patch may use up between runs, or the gate's threshold (0
    never skips); ``patches`` the patch count, ``max_skip`` the longest run of skips,
    ``warmup`` the full steps before partitioning, ``reuse`` ``"extrapolate"``,
    ``"extrapolate2"`` (skipped velocities along the parabola through their last three
    computations; K/V as ``"extrapolate"``) or ``"stale"``."""
    pipe, transformer, sched = _parts(target)
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
    setattr(transformer, _ATTR, _Adapter(transformer, sched, pipe, settings))


def disable(target: Any) -> None:
    """Puts back the processors and ``forward`` that ``enable`` replaced."""
    _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None:
        return
    a.remove()
    delattr(transformer, _ATTR)


def set_salient(target: Any, mask: Any) -> None:
    """For a bare transformer, which text positions are the prompt's salient words: a bool
    array ``(batch, text)`` (or ``(text,)`` for every sample), used by the next calls'
    saliency maps. Without it every text position counts (a pipeline maps its tokenizer's
    pieces to words itself)."""
    torch = _torch()
    _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None:
        raise Error("FlashDiff is not enabled on this transformer: call enable() first")
    m = torch.as_tensor(np.asarray(mask, dtype=bool))
    a.salient = m.view(1, -1) if m.dim() == 1 else m


def report(target: Any) -> Dict[str, Any]:
    """The last call's work: steps, warm-up, and per sample its patches and the image tokens
    computed each step after the warm-up, against the tokens of a full step."""
    _, transformer, _ = _parts(target)
    a = getattr(transformer, _ATTR, None)
    if a is None or a.call is None:
        raise Error("no call has run with FlashDiff enabled")
    c = a.call
    rows = []
    for (branch, b), r in sorted(c.rows.items()):
        tokens = 0 if r.layout is None else int(r.layout.patch_of.size)
        rows.append(dict(branch=branch, sample=b, patches=0 if r.layout is None else r.layout.patches,
                         tokens=tokens, computed_per_step=list(r.computed)))
    return dict(steps=c.steps, warmup=a.s["warmup"], plain=c.plain, rule=a.s["rule"], samples=rows)
