"""The adapter common to every family: calls, rows and the groups that decide together, the
change budget and the gate, forecasts, the shared attention processor, FLOPs and memory
accounting, and ``enable`` / ``disable`` / ``report`` / ``summary``."""

from __future__ import annotations

import functools
import logging
import re
import time
import types
import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .. import Budget, Error, Gate, partition_saliency, salient_mask
from .._native import DEFAULTS

_ATTR = "_flashdiff_adapter"
_log = logging.getLogger("flashdiff.diffusers")

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


def _nbytes(x: Any) -> int:
    """Bytes of the tensors in `x` (a tensor, or lists and dicts of them)."""
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    if isinstance(x, dict):
        return sum(_nbytes(y) for y in x.values())
    return int(x.numel() * x.element_size()) if hasattr(x, "element_size") else 0


class _Group:
    """The rows that decide together: one sample's guidance rows (SD3's negative and positive
    rows of one image in one forward; FLUX's true CFG and Wan, which call the transformer
    once with the prompt and once with the negative prompt, follow the first call's decision
    in the second). Its layout, budget or gate, signal and decisions."""

    def __init__(self) -> None:
        self.layout = None
        self.tokens: List[Any] = []  # image-token indices of each patch, on the device
        self.patch_of_t: Any = None
        self.sizes_t: Any = None
        self.budget: Optional[Budget] = None
        self.gate: Optional[Gate] = None
        self.signal: Optional[Any] = None  # the group's rows' first-block modulated input (rows, N, W)
        self.saliency: Optional[Any] = None  # the prompt row's image-to-salient-words attention (N,)
        self.decided: Dict[int, np.ndarray] = {}  # step -> active patches

    def nbytes(self) -> Dict[str, int]:
        layout = _nbytes(self.tokens) + _nbytes(self.patch_of_t) + _nbytes(self.sizes_t)
        return {"signal": _nbytes(self.signal), "layout": layout + _nbytes(self.saliency)}


class _Row:
    """One row of the transformer's batch in one branch (a branch is one of a step's calls):
    its velocity history and, under the regional rule, its per-block K/V caches."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.vel: Optional[List[Any]] = None  # [v, slope, last_step(, curve, gap)] in token rows
        self.kv: Dict[str, List[Any]] = {}  # block -> [[k, k_slope, last], [v, v_slope, last]]
        self.computed: List[int] = []  # image tokens computed per step after the warm-up

    def nbytes(self) -> Dict[str, int]:
        return {"velocity": _nbytes(self.vel), "kv": _nbytes(self.kv)}


class _Call:
    """One pipeline call: from the scheduler's ``set_timesteps`` to the last step."""

    def __init__(self, timesteps: Any, steps: int, plain: bool, prompts: Optional[List[str]]) -> None:
        self.timesteps = timesteps
        self.steps = steps
        self.plain = plain
        self.prompts = prompts
        self.rows: Dict[Any, _Row] = {}
        self.groups: Dict[int, _Group] = {}
        self.step = -1
        self.branch = 0
        self.branches = 1
        self.first = 0  # the first step index the call ran (img2img pipelines start later)
        self.batch0 = 0  # the batch of each step's first call, and its rows' groups
        self.groups0: List[int] = []
        self.branches_at: Dict[int, int] = {}  # step -> calls it took
        self.forwards = 0  # transformer forwards run
        self.calls = 0  # forwards the pipeline asked for
        self.flops_run = 0.0
        self.flops_full = 0.0
        self.t0: Optional[float] = None
        self.t1: Optional[float] = None
        self.logged = False

    def row(self, branch: int, b: int, g: int) -> _Row:
        group = self.groups.setdefault(g, _Group())
        return self.rows.setdefault((branch, b), _Row(group))


class _Ctx:
    """What the attention processors need during one forward: its rows, in batch order."""

    def __init__(self, rows: List[_Row], mode: str, step: int, text: int) -> None:
        self.rows = rows
        self.mode = mode  # "saliency" (last warm-up step), "record" (all tokens) or "partial"
        self.step = step
        self.text = text
        self.active_tokens = None  # partial: image-token indices, gathered order
        self.n_tokens = 0  # partial: the image tokens of a whole step
        self.salient: List[Any] = [None] * len(rows)  # saliency: per row, bool (T,) or None
        self.importance: List[Any] = [None] * len(rows)  # partial: per row, (patches,)


class _Cost:
    """Model FLOPs of one row's forward from the transformer's own layers: 2 x in x out per
    input row of every linear layer (and per output position of the patch-embedding
    convolution), by the stream of tokens it runs on (image, text, both, or once per
    sample), plus 4 x width x queries x keys per attention. The rules are those of
    FlopCounterMode for matrix products and attention, which a test holds it to."""

    def __init__(self, transformer: Any, stream: Callable[[str], str], attention: Callable[[str], Optional[str]],
                 signal: Callable[[str], bool]) -> None:
        torch = _torch()
        self.per = {"image": 0, "text": 0, "joint": 0, "sample": 0}
        self.sig = {"image": 0, "text": 0, "joint": 0, "sample": 0}
        self.attn: List[Any] = []
        for name, m in transformer.named_modules():
            kind = attention(name)
            if kind is not None and hasattr(m, "heads"):
                self.attn.append((name, kind, getattr(m, "inner_dim", None) or m.to_q.out_features))
                continue
            if isinstance(m, torch.nn.Linear):
                f = 2 * m.in_features * m.out_features
            elif isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
                f = 2 * m.weight.numel()  # per output position: in x kernel x out
            else:
                continue
            s = stream(name)
            self.per[s] += f
            if signal(name):
                self.sig[s] += f

    def forward(self, n: int, big_n: int, t: int) -> float:
        """One row's forward computing `n` of `big_n` image tokens beside `t` text tokens."""
        p = self.per
        f = p["image"] * n + p["text"] * t + p["joint"] * (n + t) + p["sample"]
        for _, kind, inner in self.attn:
            q, k = {"joint": (n + t, big_n + t), "self": (n, big_n), "cross": (n, t)}[kind]
            f += 4 * inner * q * k
        return float(f)

    def signal(self, big_n: int, t: int) -> float:
        s = self.sig
        return float(s["image"] * big_n + s["text"] * t + s["joint"] * (big_n + t) + s["sample"])


_SAMPLE = re.compile(r"(^|\.)(time_text_embed|time_embed|condition_embedder\.time\w*)(\.|$)|norm\w*\.linear$")


def _stream(name: str) -> str:
    """Which tokens a linear layer of FLUX, SD3 or Wan runs on, by its diffusers name."""
    if _SAMPLE.search(name):
        return "sample"
    if name.startswith("single_transformer_blocks."):
        return "joint"
    if ("context" in name or "add_" in name or "text_embedder" in name or "image_embedder" in name
            or re.search(r"^blocks\.\d+\.attn2\.to_[kv]$", name)):
        return "text"
    return "image"


def _controlnets(pipe: Any) -> List[Any]:
    """The pipeline's ControlNet models (each net of a multi-ControlNet)."""
    net = getattr(pipe, "controlnet", None) if pipe is not None else None
    if net is None:
        return []
    nets = getattr(net, "nets", None)
    return list(nets) if nets is not None else [net]


class _Adapter:
    def __init__(self, outer: Any, transformer: Any, scheduler: Any, pipe: Any, settings: Dict[str, Any]):
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
        if self.pipe is not None and hasattr(self, "orig_encode"):
            del self.pipe.encode_prompt

    def begin(self) -> _Call:
        """The call this forward belongs to: a new one after ``set_timesteps``, on new
        ``timesteps``, or when the step index goes back."""
        sched = self.pipe.scheduler if self.pipe is not None and hasattr(self.pipe, "scheduler") else self.scheduler
        if sched is not self.wrapped_sched:  # the pipeline's scheduler was replaced
            self._unwrap_scheduler()
            self._wrap_scheduler(sched)
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


def _record_velocity(a: "_Adapter", row: _Row, v: Any, n: int) -> None:
    torch = _torch()
    v = v.detach().float()  # a half-precision history would round the second differences away
    if row.vel is None:
        row.vel = [v.clone(), torch.zeros_like(v), torch.full((v.shape[0],), n, dtype=torch.long, device=v.device)]
        if a.s["reuse"] == "extrapolate2":
            row.vel += [torch.zeros_like(v), torch.zeros((v.shape[0],), dtype=torch.long, device=v.device)]
    else:
        _refresh(row.vel, torch.arange(v.shape[0], device=v.device), v, n)


class _Processor:
    """FLUX's attention with FlashDiff's saliency and K/V cache (sequence dim 1: (B, L, H, D)).
    With no context (every forward of the whole-step rule but the saliency step) it is the
    processor it replaced."""

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
        if self.a.ctx is None:
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
        """The K/V the attention reads: in the saliency and record modes the forward's own
        (cached under the regional rule; the saliency step also adds up each prompt row's
        attention to its salient words), in the partial mode every row's forecast with its
        computed rows written in."""
        torch = _torch()
        n, extrap = ctx.step, self.a.s["reuse"] != "stale"
        if ctx.mode != "partial":
            if self.a.regional:
                for j, row in enumerate(ctx.rows):
                    k0, v0 = k[j].detach().float(), v[j].detach().float()
                    store = row.kv.get(self.name)
                    if store is None:
                        steps = torch.full((k0.shape[0],), n, dtype=torch.long, device=k0.device)
                        row.kv[self.name] = [[k0.clone(), torch.zeros_like(k0), steps.clone()],
                                             [v0.clone(), torch.zeros_like(v0), steps.clone()]]
                    else:
                        pos = torch.arange(k0.shape[0], device=k0.device)
                        _refresh(store[0], pos, k0, n)
                        _refresh(store[1], pos, v0, n)
            if ctx.mode == "saliency" and self.name in self.a.dual:
                t = ctx.text
                for j, row in enumerate(ctx.rows):
                    sal = ctx.salient[j]
                    if sal is None:
                        continue
                    probs = self.attention_probs(q[j:j + 1, t:], k[j:j + 1])  # (N, T + N)
                    m = probs[:, :t][:, sal].mean(dim=1) if bool(sal.any()) else probs[:, :t].mean(dim=1)
                    g = row.group
                    g.saliency = m if g.saliency is None else g.saliency + m
            return k, v
        kfs, vfs = [], []
        t = k.shape[1] - ctx.active_tokens.numel()  # this block's text rows (0: image only)
        pos = torch.cat([torch.arange(t, device=k.device), ctx.active_tokens + t])
        for j, row in enumerate(ctx.rows):
            ks, vs = row.kv[self.name]
            kf = _forecast(ks[0], ks[1], ks[2], n, extrap)
            vf = _forecast(vs[0], vs[1], vs[2], n, extrap)
            kj, vj = k[j].detach().float(), v[j].detach().float()
            kf[pos] = kj
            vf[pos] = vj
            _refresh(ks, pos, kj, n)
            _refresh(vs, pos, vj, n)
            kfs.append(kf)
            vfs.append(vf)
        kf, vf = torch.stack(kfs).to(k.dtype), torch.stack(vfs).to(v.dtype)
        if self.name == self.a.importance_block:
            for j, row in enumerate(ctx.rows):
                probs = self.attention_probs(q[j:j + 1, t:], kf[j:j + 1])[:, t:]  # (n_active, N)
                ctx.importance[j] = self.patch_mass(row.group, ctx.active_tokens, probs)
        return kf, vf

    @staticmethod
    def attention_probs(q: Any, k: Any) -> Any:
        """Softmax attention of `q`'s rows over `k`'s (one batch row), averaged over heads:
        (rows, keys); heads in chunks so that no more than about 64 Mi scores are live."""
        torch = _torch()
        scale = q.shape[-1] ** -0.5
        heads = q.shape[2]
        chunk = max(1, (1 << 26) // max(1, q.shape[1] * k.shape[1]))
        acc = None
        for h in range(0, heads, chunk):
            qh = q[0, :, h:h + chunk].float().transpose(0, 1)  # (h, rows, d)
            kh = k[0, :, h:h + chunk].float().transpose(0, 1)
            p = torch.softmax((qh @ kh.transpose(1, 2)) * scale, dim=-1).sum(0)
            acc = p if acc is None else acc + p
        return acc / heads

    @staticmethod
    def patch_mass(group: _Group, active_tokens: Any, probs: Any) -> Any:
        """R_i = (1/|A_i|^2) sum over active tokens u of patch i of their mass into patch i."""
        torch = _torch()
        patch_of = group.patch_of_t
        mine = patch_of[active_tokens]  # patch of each active query
        into = torch.zeros(probs.shape[0], len(group.tokens), device=probs.device, dtype=probs.dtype)
        into.index_add_(1, patch_of, probs)
        own = into.gather(1, mine.view(-1, 1)).squeeze(1)
        r = torch.zeros(len(group.tokens), device=probs.device, dtype=probs.dtype)
        r.index_add_(0, mine, own)
        return r / group.sizes_t.to(probs.dtype) ** 2


def _partition(a: _Adapter, group: _Group, grid: Any, dev: Any) -> None:
    """The group's saliency map of the last warm-up step, cut into patches by the Rust
    partitioner; `grid` is the latent's token grid, (height, width) or (frames, height, width)."""
    torch = _torch()
    tokens = int(np.prod(grid))
    if group.saliency is None:  # no prompt row in this forward: every token equally salient
        sal = np.ones(tokens, dtype=np.float32)
    else:
        sal = group.saliency.float().cpu().numpy().astype(np.float32)
    if sal.size != tokens:
        raise Error(f"latent of {sal.size} tokens is not the {'x'.join(map(str, grid))} grid its shape gives")
    patches = min(a.s["patches"], tokens)
    group.layout = partition_saliency(sal.reshape(grid), patches)
    group.tokens = [torch.from_numpy(group.layout.patch_tokens(p).astype(np.int64)).to(dev) for p in range(patches)]
    group.patch_of_t = torch.from_numpy(group.layout.patch_of.astype(np.int64)).to(dev)
    group.sizes_t = torch.from_numpy(group.layout.sizes().astype(np.int64)).to(dev)
    if a.s["rule"] == "budget":
        group.budget = Budget(patches, epsilon=a.s["epsilon"], share=0.0, max_skip=a.s["max_skip"])
    else:
        group.gate = Gate(patches, epsilon=a.s["epsilon"], max_skip=a.s["max_skip"])


def _budget_observe(group: Any, now: Any) -> None:
    """Feeds the budget each patch's relative L1 change of the signal ((rows,) tokens x width,
    on the device) since the last step, summed over the patch's tokens and the group's rows
    on the device, and the patch's share of it: the step's one device-to-host read."""
    torch = _torch()
    if now.dim() == 2:
        now = now.unsqueeze(0)
    before = group.signal if group.signal.dim() == 3 else group.signal.unsqueeze(0)
    patches = len(group.tokens)
    wide = torch.float32 if now.device.type == "mps" else torch.float64  # MPS has no float64
    num = torch.zeros(patches, dtype=wide, device=now.device)
    den = torch.zeros_like(num)
    num.index_add_(0, group.patch_of_t, (now - before).abs().sum(dim=(0, 2), dtype=wide))
    den.index_add_(0, group.patch_of_t, before.abs().sum(dim=(0, 2), dtype=wide))
    both = torch.stack([num / den.clamp(min=1e-12), den]).cpu().numpy().astype(np.float32)
    group.budget.observe(both[0], both[1])
    group.signal = now


def _choose(call: _Call, group: _Group) -> np.ndarray:
    """The step's active patches of a group (all at the last step)."""
    patches = len(group.tokens)
    if call.step >= call.steps - 1:
        return np.ones(patches, dtype=bool)
    if group.budget is not None:
        return group.budget.decide()
    return group.gate.decide()[0]


class _View:
    """One forward of the pipeline as the shared step sees it; each family fills it in.

    - ``run(sel, idx)``: the original forward on batch rows `sel` (a LongTensor, or None for
      all) and image tokens `idx` (None for all), in the transformer's output layout;
    - ``tokens(out, idx)``: that output as token rows (rows, tokens, channels), the computed
      tokens only;
    - ``untokens(v)``: token rows (batch, N, channels) in the transformer's output layout;
    - ``signal(sel)``: the first block's modulated input of every image token of rows `sel`,
      (rows, N, width).
    """

    def __init__(self, batch: int, text: int, grid: Any, device: Any, run: Any, tokens: Any, untokens: Any,
                 signal: Any) -> None:
        self.batch, self.text, self.grid, self.device = batch, text, grid, device
        self.run, self.tokens, self.untokens, self.signal = run, tokens, untokens, signal
        self.n = int(np.prod(grid))


def _grid_view(t: Any, batch: int, text: int, grid: Any, device: Any, dtype: Any, run: Any, signal: Any,
               patchify: Any, unpatchify: Any) -> _View:
    """The view of a transformer whose output is a latent grid (SD3, Wan): token rows in
    the layout of its last projection, through the family's `patchify` and `unpatchify`."""

    def tokens(out: Any, idx: Any) -> Any:
        tok = patchify(t, out, grid)
        return tok if idx is None else tok[:, idx]

    return _View(batch, text, grid, device, run, tokens=tokens,
                 untokens=lambda v: unpatchify(t, v, grid).to(dtype), signal=signal)


def _run(a: _Adapter, call: _Call, v: _View, rows: List[_Row], sel: Any, idx: Any, ctx: Optional[_Ctx]) -> Any:
    """One transformer forward, counted."""
    a.ctx = ctx
    a.forward_fn = a.eager_forward if ctx is not None else a.orig_forward
    try:
        out = v.run(sel, idx)
    finally:
        a.ctx = None
        a.forward_fn = a.orig_forward
    call.forwards += 1
    r = v.batch if sel is None else int(sel.numel())
    call.flops_run += r * a.cost.forward(v.n if idx is None else int(idx.numel()), v.n, v.text)
    if ctx is not None and ctx.mode == "partial":
        # the gate's importance: one block's attention scores of the computed rows (Q K^T)
        kind, inner = a.importance
        call.flops_run += r * 2 * inner * int(idx.numel()) * (v.n + (v.text if kind == "joint" else 0))
    return out


def _step(a: _Adapter, call: _Call, v: _View) -> Any:
    """One forward the pipeline asked for: the warm-up runs every row; later, each group
    decides once per step (the step's first call), and the rows whose group runs go through
    one forward per distinct token set (one for the whole-step rule); the other rows advance
    on their forecast velocities."""
    torch = _torch()
    n, warm, batch = call.step, a.s["warmup"], v.batch
    ran = n - call.first  # steps this call has run before this one (img2img starts later)
    call.calls += 1
    call.flops_full += batch * a.cost.forward(v.n, v.n, v.text)
    for cost, rows, text in a.control:
        f = rows * cost.forward(v.n, v.n, v.text if text else 0)
        call.flops_run += f
        call.flops_full += f
    a.control.clear()
    gid, carries = a.grouping(call, batch)
    rows = [call.row(call.branch, b, gid[b]) for b in range(batch)]
    groups = sorted(set(gid))
    if ran < warm:
        saliency = ran == warm - 1 and call.branch == 0
        ctx = None
        if saliency or a.regional:
            ctx = _Ctx(rows, "saliency" if saliency else "record", n, v.text)
            if saliency:
                ctx.salient = [a.salient_tokens(call, b, gid[b], len(groups), v.text, v.device) if carries[b] else None
                               for b in range(batch)]
                rows_read = sum(s is not None for s in ctx.salient)
                for kind, inner in a.saliency_blocks:
                    call.flops_run += rows_read * 2 * inner * v.n * (v.text if kind == "cross" else v.n + v.text)
        out = _run(a, call, v, rows, None, None, ctx)
        tok = v.tokens(out, None)
        for j, row in enumerate(rows):
            _record_velocity(a, row, tok[j], n)
        if saliency:
            for g in groups:
                _partition(a, call.groups[g], v.grid, v.device)
            if a.s["rule"] == "budget":
                sig = v.signal(None)
                call.flops_run += batch * a.cost.signal(v.n, v.text)
                for g in groups:
                    call.groups[g].signal = sig[[b for b in range(batch) if gid[b] == g]]
        _end_forward(a, call, v.device)
        return out
    undecided = [g for g in groups if n not in call.groups[g].decided]
    if undecided:
        sig = None
        if a.s["rule"] == "budget":
            sel = [b for b in range(batch) if gid[b] in undecided]
            sig = v.signal(torch.tensor(sel, device=v.device) if len(sel) < batch else None)
            call.flops_run += len(sel) * a.cost.signal(v.n, v.text)
            where = {b: j for j, b in enumerate(sel)}
        for g in undecided:
            group = call.groups[g]
            if group.layout is None:
                raise Error("flashdiff.diffusers: a row joined the call after its warm-up; the batch size must stay "
                            "the same for the whole call")
            if group.budget is not None:
                _budget_observe(group, sig[[where[b] for b in range(batch) if gid[b] == g]])
            active = _choose(call, group)
            group.decided[n] = active
            if group.budget is not None:
                group.budget.ran(active)
    sets: Dict[Any, List[int]] = {}
    idx_of: Dict[Any, Any] = {}
    for b in range(batch):
        group = rows[b].group
        active = group.decided[n]
        if rows[b].vel is None:  # no history to forecast from: it runs
            active = np.ones_like(active)
        elif not active.any():
            continue
        if active.all() and (not a.regional or rows[b].vel is None or not rows[b].kv):
            # (the gate reads every step's importance from a partial forward, once it has K/V)
            key, idx = "all", None
        else:
            idx = torch.cat([group.tokens[p] for p in range(len(group.tokens)) if active[p]])
            key = idx.cpu().numpy().tobytes()
        sets.setdefault(key, []).append(b)
        idx_of[key] = idx
    if list(sets) == ["all"] and len(sets["all"]) == batch and not a.regional:
        out = _run(a, call, v, rows, None, None, None)
        tok = v.tokens(out, None)
        for j, row in enumerate(rows):
            _record_velocity(a, row, tok[j], n)
            row.computed.append(v.n)
        _end_forward(a, call, v.device)
        return out
    full: List[Any] = [None] * batch
    importance: Dict[int, List[Any]] = {}
    for key, members in sets.items():
        idx = idx_of[key]
        sel = torch.tensor(members, device=v.device) if len(members) < batch else None
        sub = [rows[b] for b in members]
        ctx = None
        if a.regional:
            ctx = _Ctx(sub, "record" if idx is None else "partial", n, v.text)
            ctx.active_tokens, ctx.n_tokens = idx, v.n
        out = _run(a, call, v, sub, sel, idx, ctx)
        fresh = v.tokens(out, idx)
        for j, b in enumerate(members):
            row = rows[b]
            if idx is None:
                _record_velocity(a, row, fresh[j], n)
                full[b] = fresh[j]
                row.computed.append(v.n)
            else:
                f = _vel_forecast(a, row, n)
                fj = fresh[j].detach().float()
                f[idx] = fj
                _refresh(row.vel, idx, fj, n)
                full[b] = f
                row.computed.append(int(idx.numel()))
                if ctx is not None and ctx.importance[j] is not None and call.branch == 0:
                    importance.setdefault(gid[b], []).append(ctx.importance[j])
    for g, parts in importance.items():
        group = call.groups[g]
        if group.gate is not None and n < call.steps - 1:
            imp = (sum(parts) / len(parts)).float().cpu().numpy().astype(np.float32)
            group.gate.observe(np.where(group.decided[n], imp, 0.0).astype(np.float32))
    for b in range(batch):
        if full[b] is None:
            full[b] = _vel_forecast(a, rows[b], n)
            rows[b].computed.append(0)
    _end_forward(a, call, v.device)
    return v.untokens(torch.stack(full))


def _plain(a: _Adapter, call: _Call, run: Any) -> Any:
    """A call FlashDiff leaves alone (a few-step schedule): the forward as it was, counted."""
    a.ctx = None
    out = run()
    call.calls += 1
    call.forwards += 1
    _end_forward(a, call)
    return out


def _end_forward(a: _Adapter, call: _Call, device: Any = None) -> None:
    """Times the call; after the last step's calls (as many as the step before took), logs
    its summary at INFO. The last step waits for the device, so the time is the work's."""
    last = call.step >= call.steps - 1
    if last and device is not None and getattr(device, "type", "cpu") == "cuda":
        _torch().cuda.synchronize(device)
    call.t1 = time.perf_counter()
    expected = call.branches_at.get(call.step - 1, 1)
    if last and call.branch + 1 >= expected and not call.logged:
        call.logged = True
        if _log.isEnabledFor(logging.INFO):
            _log.info("flashdiff: %s", _summary(a)["text"])


def _scatter_tokens(a: _Adapter) -> Any:
    """Before SD3's and Wan's unpatchify, on a partial forward: the computed tokens' rows in a
    token grid of zeros, which the shared step fills with the other tokens' forecasts."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        full = out.new_zeros(out.shape[0], ctx.n_tokens, out.shape[2])
        full[:, ctx.active_tokens] = out
        return full

    return hook


def _output(out: Any, return_dict: bool) -> Any:
    """The transformer's output as its ``forward`` returns it."""
    if return_dict:
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        return Transformer2DModelOutput(sample=out)
    return (out,)


def _rows(x: Any, sel: Any, batch: int) -> Any:
    """Batch rows `sel` of a per-row argument (left as it is when not per row)."""
    if sel is None or x is None or not hasattr(x, "shape") or x.dim() == 0 or x.shape[0] != batch:
        return x
    return x[sel]


def _control(samples: Any, sel: Any, idx: Any, batch: int) -> Any:
    """ControlNet residuals (a list of (batch, image tokens, width)) for rows `sel` and image
    tokens `idx`."""
    if samples is None:
        return None
    out = []
    for s in samples:
        s = _rows(s, sel, batch)
        out.append(s if idx is None else s[:, idx])
    return out


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
