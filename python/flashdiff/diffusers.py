"""FlashDiff inside a diffusers pipeline.

>>> from diffusers import FluxPipeline                          # doctest: +SKIP
>>> import flashdiff.diffusers
>>> pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev")   # doctest: +SKIP
>>> flashdiff.diffusers.enable(pipe, epsilon=0.1, patches=16)  # doctest: +SKIP
>>> image = pipe("a red fox in the snow").images[0]            # doctest: +SKIP
>>> flashdiff.diffusers.report(pipe)                           # doctest: +SKIP

What it does to each call, per sample (each row of the transformer's batch, so classifier-free
guidance and batches give every sample what it would get alone):

1. The first ``warmup`` steps run in full. The last of them also measures how much every
   image token attends to the prompt's salient words (the pipeline's T5 pieces mapped to
   words) in the joint attention (FLUX's dual-stream blocks, SD3's joint blocks) or the
   cross-attention (Wan); that saliency map (a frames x height x width one for Wan's video
   latents) is cut into ``patches`` patches by the Rust partitioner.
2. Each later step decides which patches run. By FlashDiff's change budget (``rule
   "budget"``, the engine's rule and the default): every patch adds up the relative change
   of the first block's modulated input over its tokens since it last ran; a step runs once
   a patch has used up ``epsilon`` or waited ``max_skip`` steps, and otherwise every token
   advances on its forecast velocity without calling the transformer. Or by the paper's gate
   (``rule "gate"``), from each patch's self-attention mass (the refinement importance,
   measured in the last joint or self-attention block). The transformer runs on the chosen
   patches' image tokens only (their RoPE angles or position embeddings gathered with them)
   and the whole text stream; attention reads the other image tokens' K/V from a per-block
   cache, forecast along their slope; skipped tokens' velocity is forecast the same way. The
   last step runs every patch.
3. Few-step models (at most 8 steps) run unchanged unless ``force=True``, with a warning.

It is installed per pipeline instance, through the attention-processor API and a wrapper of
the transformer's ``forward``; classes are never patched. ``disable`` puts back what was
there. State is per call (a call is recognised by the scheduler's new ``timesteps``) and is
sized by the call's real step count. One device-to-host read per sample per step (the
patches' changes or importance) and one host-to-device copy (the active tokens' indices).

Supported: ``FluxPipeline``, ``StableDiffusion3Pipeline`` (SD3 and SD3.5), ``WanPipeline``
(Wan 2.1 text-to-video; Wan 2.2's second, low-noise transformer is left as it is, and
per-token timesteps are refused) and their transformers (driven by a scheduler the caller
passes). Other pipelines are refused with an error that says so.
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

from . import Budget, Error, Gate, partition_saliency, salient_mask

_ATTR = "_flashdiff_adapter"

# The transformers FlashDiff runs inside, by class name.
_KINDS = {"FluxTransformer2DModel": "flux", "SD3Transformer2DModel": "sd3", "WanTransformer3DModel": "wan"}


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
        self.hooks = []
        if self.kind == "wan":
            # Self-attention over the image tokens (K/V cached, importance read in the last
            # block); the cross-attention to the prompt gives the saliency map.
            self.dual = []
            self.importance_block = [n for n in names if ".attn1." in n][-1]
            procs = {n: (_WanCrossProcessor if ".attn2." in n else _WanSelfProcessor)(self, n) for n in names}
            self.hooks = [transformer.rope.register_forward_hook(_gather_rope(self)),
                          transformer.patch_embedding.register_forward_hook(_gather_patches(self)),
                          transformer.proj_out.register_forward_hook(_scatter_tokens(self))]
            forward = _forward_wan
        else:
            # The joint (image + text) attention blocks: where saliency and importance are read.
            self.dual = [n for n in names if n.startswith("transformer_blocks.") and ".attn." in n]
            self.importance_block = self.dual[-1] if self.dual else names[-1]
            proc = _SD3Processor if self.sd3 else _Processor
            procs = {n: proc(self, n) for n in names}
            forward = _forward_sd3 if self.sd3 else _forward
            if self.sd3:
                self.hooks = [transformer.pos_embed.register_forward_hook(_gather_tokens(self)),
                              transformer.proj_out.register_forward_hook(_scatter_tokens(self))]
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


def _forward(self: Any, hidden_states: Any, encoder_hidden_states: Any = None, pooled_projections: Any = None,
             timestep: Any = None, img_ids: Any = None, txt_ids: Any = None, guidance: Any = None,
             joint_attention_kwargs: Any = None, return_dict: bool = True, **kw: Any) -> Any:
    torch = _torch()
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()

    def orig(hs: Any, ehs: Any, pooled: Any, t: Any, ids: Any, g: Any) -> Any:
        return a.orig_forward(hs, encoder_hidden_states=ehs, pooled_projections=pooled, timestep=t,
                              img_ids=ids, txt_ids=txt_ids, guidance=g,
                              joint_attention_kwargs=joint_attention_kwargs, return_dict=False, **kw)[0]

    if call.plain:
        a.ctx = None
        out = orig(hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, guidance)
    else:
        if img_ids.ndim == 3:
            img_ids = img_ids[0]
        n, warm, text = call.step, a.s["warmup"], encoder_hidden_states.shape[1]
        batch = hidden_states.shape[0]
        outs = []
        for b in range(batch):
            sl = slice(b, b + 1)
            row = call.rows.setdefault((call.branch, b), _Row())
            args = (encoder_hidden_states[sl], pooled_projections[sl], timestep[sl],
                    None if guidance is None else guidance[sl])
            if n < warm:
                ctx = _Ctx(row, "record", n, text)
                ctx.want_saliency = n == warm - 1
                if ctx.want_saliency:
                    ctx.salient = a.salient_tokens(b, batch, text, hidden_states.device)
                a.ctx = ctx
                o = orig(hidden_states[sl], args[0], args[1], args[2], img_ids, args[3])
                a.ctx = None
                _record_velocity(a, row, o[0].detach(), n)
                if ctx.want_saliency:
                    h = int(img_ids[:, 1].max().item()) + 1
                    w = int(img_ids[:, 2].max().item()) + 1
                    _partition(a, row, (h, w), img_ids.device)
                    if row.budget is not None:
                        row.signal = _flux_signal(self, hidden_states[sl], args)
            else:
                o = _partial(a, call, row, hidden_states[sl], img_ids, args, text, orig)
            outs.append(o)
        out = torch.cat(outs, 0)
    return _output(out, return_dict)


def _record_velocity(a: "_Adapter", row: _Row, v: Any, n: int) -> None:
    torch = _torch()
    if row.vel is None:
        row.vel = [v.clone(), torch.zeros_like(v), torch.full((v.shape[0],), n, dtype=torch.long, device=v.device)]
        if a.s["reuse"] == "extrapolate2":
            row.vel += [torch.zeros_like(v), torch.zeros((v.shape[0],), dtype=torch.long, device=v.device)]
    else:
        _refresh(row.vel, torch.arange(v.shape[0], device=v.device), v, n)


def _flux_signal(t: Any, hs: Any, args: Any) -> Any:
    """The first double-stream block's modulated input of every image token (tokens x width):
    the change the budget adds up, what whole-step caching watches."""
    torch = _torch()
    _, pooled, timestep, guidance = args
    with torch.no_grad():
        x = t.x_embedder(hs)
        ts = timestep.to(x.dtype) * 1000
        if guidance is None:
            temb = t.time_text_embed(ts, pooled)
        else:
            temb = t.time_text_embed(ts, guidance.to(x.dtype) * 1000, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    return m[0].detach().float()


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


def _partial(a: _Adapter, call: _Call, row: _Row, hs: Any, img_ids: Any, args: Any, text: int, orig: Any) -> Any:
    n = call.step
    active, idx, last, vel = _decide(a, call, row, lambda: _flux_signal(a.transformer, hs, args))
    if vel is not None:
        return vel.unsqueeze(0).to(hs.dtype)
    ctx = _Ctx(row, "partial", n, text)
    ctx.active_tokens = idx
    a.ctx = ctx
    try:
        o = orig(hs[:, idx], args[0], args[1], args[2], img_ids[idx], args[3])
    finally:
        a.ctx = None
    fresh = o[0].detach()
    vel = _vel_forecast(a, row, n)
    vel[idx] = fresh
    _refresh(row.vel, idx, fresh, n)
    row.computed.append(int(idx.numel()))
    _observe(row, ctx, active, last)
    return vel.unsqueeze(0).to(o.dtype)


class _SD3Processor(_Processor):
    """SD3 / SD3.5's joint attention (image rows first, then text; no RoPE) and their
    image-only second attention, with FlashDiff's K/V cache. Rows are put text first, the
    shared layout of the cache, for the attention, and back after."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.a.ctx is None:  # a call FlashDiff leaves alone: the processor it replaced
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, *args, **kwargs)
        torch = _torch()
        import torch.nn.functional as F

        b, heads = hidden_states.shape[0], attn.heads

        def split(x: Any) -> Any:
            return x.view(b, -1, heads, x.shape[-1] // heads)  # (B, L, H, D)

        q, k, v = split(attn.to_q(hidden_states)), split(attn.to_k(hidden_states)), split(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        n_img = q.shape[1]
        if encoder_hidden_states is not None:
            eq = split(attn.add_q_proj(encoder_hidden_states))
            ek = split(attn.add_k_proj(encoder_hidden_states))
            ev = split(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out.transpose(1, 2).reshape(b, -1, heads * q.shape[-1]).to(q.dtype)
        text = out.shape[1] - n_img
        img = attn.to_out[1](attn.to_out[0](out[:, text:]))
        if encoder_hidden_states is None:
            return img
        txt = out[:, :text]
        if not attn.context_pre_only:
            txt = attn.to_add_out(txt)
        return img, txt


def _gather_tokens(a: _Adapter) -> Any:
    """After SD3's patch embedding (positions added): only the active tokens go on."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return out[:, ctx.active_tokens]

    return hook


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


def _forward_sd3(self: Any, hidden_states: Any, encoder_hidden_states: Any = None, pooled_projections: Any = None,
                 timestep: Any = None, block_controlnet_hidden_states: Any = None, joint_attention_kwargs: Any = None,
                 return_dict: bool = True, skip_layers: Any = None) -> Any:
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()

    def orig(hs: Any, ehs: Any, pooled: Any, t: Any) -> Any:
        return a.orig_forward(hs, encoder_hidden_states=ehs, pooled_projections=pooled, timestep=t,
                              block_controlnet_hidden_states=block_controlnet_hidden_states,
                              joint_attention_kwargs=joint_attention_kwargs, return_dict=False,
                              skip_layers=skip_layers)[0]

    if call.plain:
        a.ctx = None
        out = orig(hidden_states, encoder_hidden_states, pooled_projections, timestep)
    else:
        if block_controlnet_hidden_states is not None:
            raise Error("flashdiff.diffusers: ControlNet residuals are not supported with FlashDiff enabled")
        text, p = encoder_hidden_states.shape[1], self.config.patch_size
        grid = (hidden_states.shape[-2] // p, hidden_states.shape[-1] // p)
        samples = [(hidden_states[b:b + 1], encoder_hidden_states[b:b + 1], pooled_projections[b:b + 1],
                    timestep[b:b + 1]) for b in range(hidden_states.shape[0])]
        out = _hooked_batch(a, call, samples, text, grid, hidden_states.device, run=orig,
                            signal=lambda args: _sd3_signal(self, args),
                            unpatchify=lambda v: _unpatchify_sd3(self, v, grid))
    return _output(out, return_dict)


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


def _sd3_signal(t: Any, args: Any) -> Any:
    """SD3's first joint block's modulated input of every image token (tokens x width)."""
    torch = _torch()
    hs, _, pooled, timestep = args
    with torch.no_grad():
        x = t.pos_embed(hs)
        temb = t.time_text_embed(timestep, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    return m[0].detach().float()


def _unpatchify_sd3(t: Any, v: Any, grid: Any) -> Any:
    """(1, h * w, p * p * c) token rows to SD3's (1, c, h * p, w * p) output."""
    torch = _torch()
    (h, w), p, c = grid, t.config.patch_size, t.out_channels
    v = torch.einsum("nhwpqc->nchpwq", v.reshape(1, h, w, p, p, c))
    return v.reshape(1, c, h * p, w * p)


def _wan_rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotates each (even, odd) pair of `x`'s last dimension by the angle whose cosine and
    sine the pair's entries of `cos` and `sin` hold (Wan's interleaved RoPE)."""
    torch = _torch()
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out.type_as(x)


class _WanSelfProcessor(_Processor):
    """Wan's self-attention over the image tokens (sequence dim 1: (B, L, H, D)), with
    FlashDiff's K/V cache."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, rotary_emb: Any = None) -> Any:
        if self.a.ctx is None:  # a call FlashDiff leaves alone: the processor it replaced
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, rotary_emb)
        from diffusers.models.transformers import transformer_wan as tw

        q, k, v = tw._get_qkv_projections(attn, hidden_states, None)
        q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
        v = v.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            q, k = _wan_rope(q, *rotary_emb), _wan_rope(k, *rotary_emb)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = tw.dispatch_attention_fn(q, k, v, attn_mask=attention_mask, backend=self._attention_backend)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _WanCrossProcessor(_Processor):
    """Wan's cross-attention to the prompt, unchanged; at the last warm-up step it also adds
    up how much every image token attends to the prompt's salient words."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, rotary_emb: Any = None) -> Any:
        ctx = self.a.ctx
        if ctx is not None and ctx.want_saliency:
            from diffusers.models.transformers import transformer_wan as tw

            text = encoder_hidden_states
            if attn.add_k_proj is not None:  # image-to-video: the prompt's rows follow the image's
                text = text[:, text.shape[1] - ctx.text:]
            q, k, _ = tw._get_qkv_projections(attn, hidden_states, text)
            q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
            k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
            probs = self.attention_probs(q, k)  # (N, T)
            sal = ctx.salient
            m = probs[:, sal].mean(dim=1) if bool(sal.any()) else probs.mean(dim=1)
            row = ctx.row
            row.saliency = m if row.saliency is None else row.saliency + m
        return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                  attention_mask, rotary_emb)


def _gather_rope(a: _Adapter) -> Any:
    """Wan's rotary angles of the active tokens only."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return tuple(f[:, ctx.active_tokens] for f in out)

    return hook


def _gather_patches(a: _Adapter) -> Any:
    """After Wan's patch embedding, (B, C, F, H, W): the active tokens as (B, C, n, 1, 1),
    which the transformer flattens into its n rows."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return out.flatten(2)[:, :, ctx.active_tokens][..., None, None]

    return hook


def _wan_signal(t: Any, args: Any) -> Any:
    """Wan's first block's modulated self-attention input of every token (tokens x width)."""
    torch = _torch()
    hs, timestep, ehs, image = args
    with torch.no_grad():
        x = t.patch_embedding(hs).flatten(2).transpose(1, 2)
        _, proj, _, _ = t.condition_embedder(timestep, ehs, image)
        block = t.blocks[0]
        shift, scale = (block.scale_shift_table + proj.unflatten(1, (6, -1)).float()).chunk(6, dim=1)[:2]
        m = block.norm1(x.float()) * (1 + scale) + shift
    return m[0].detach().float()


def _unpatchify_wan(t: Any, v: Any, grid: Any) -> Any:
    """(1, f * h * w, pt * ph * pw * c) token rows to Wan's (1, c, f * pt, h * ph, w * pw)."""
    (f, h, w), (pt, ph, pw) = grid, t.config.patch_size
    v = v.reshape(1, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return v.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def _forward_wan(self: Any, hidden_states: Any, timestep: Any = None, encoder_hidden_states: Any = None,
                 encoder_hidden_states_image: Any = None, return_dict: bool = True,
                 attention_kwargs: Any = None) -> Any:
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()

    def orig(hs: Any, t: Any, ehs: Any, image: Any) -> Any:
        return a.orig_forward(hs, timestep=t, encoder_hidden_states=ehs, encoder_hidden_states_image=image,
                              return_dict=False, attention_kwargs=attention_kwargs)[0]

    if call.plain:
        a.ctx = None
        out = orig(hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image)
    else:
        if timestep.ndim == 2:
            raise Error("flashdiff.diffusers: per-token timesteps (Wan 2.2 TI2V) are not supported")
        pt, ph, pw = self.config.patch_size
        grid = (hidden_states.shape[2] // pt, hidden_states.shape[3] // ph, hidden_states.shape[4] // pw)
        image = encoder_hidden_states_image
        samples = [(hidden_states[b:b + 1], timestep[b:b + 1], encoder_hidden_states[b:b + 1],
                    None if image is None else image[b:b + 1]) for b in range(hidden_states.shape[0])]
        out = _hooked_batch(a, call, samples, encoder_hidden_states.shape[1], grid, hidden_states.device, run=orig,
                            signal=lambda args: _wan_signal(self, args),
                            unpatchify=lambda v: _unpatchify_wan(self, v, grid))
    return _output(out, return_dict)


def _parts(target: Any) -> Any:
    transformer = getattr(target, "transformer", None)
    if transformer is None:
        return None, target, None
    return target, transformer, getattr(target, "scheduler", None)


def enable(target: Any, epsilon: float = 0.1, patches: int = 16, max_skip: int = 3, warmup: int = 5,
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
