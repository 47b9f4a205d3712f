"""One transformer forward under the adapter: the partition after the warm-up, each group's
decision (change budget or gate), the computed rows and the forecast ones, and the pieces
the families' forwards share."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional

import numpy as np

from .. import Budget, Error, Gate, partition_saliency
from ._adapter import _Adapter, _record_velocity, _refresh, _summary, _vel_forecast
from ._base import _log, _torch
from ._state import _Call, _Ctx, _Group, _Row


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
      (rows, N, width);
    - ``reused()``: whether the last forward took the signal's layers' outputs instead of
      computing them again (their FLOPs are then counted once).
    """

    def __init__(self, batch: int, text: int, grid: Any, device: Any, run: Any, tokens: Any, untokens: Any,
                 signal: Any, reused: Any = None) -> None:
        self.batch, self.text, self.grid, self.device = batch, text, grid, device
        self.run, self.tokens, self.untokens, self.signal = run, tokens, untokens, signal
        self.reused = reused or (lambda: False)
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
                if not v.reused():  # (else the signal took the forward's layers' outputs)
                    call.flops_run += batch * a.cost.signal(v.n, v.text)
                for g in groups:
                    call.groups[g].signal = sig[[b for b in range(batch) if gid[b] == g]]
        _end_forward(a, call, v.device)
        return out
    undecided = [g for g in groups if n not in call.groups[g].decided]
    signal_rows = 0
    if undecided:
        sig = None
        if a.s["rule"] == "budget":
            sel = [b for b in range(batch) if gid[b] in undecided]
            sig = v.signal(torch.tensor(sel, device=v.device) if len(sel) < batch else None)
            signal_rows = len(sel)
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
        if signal_rows == batch and v.reused():
            call.flops_run -= batch * a.cost.signal(v.n, v.text)  # the forward took the signal's work
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
