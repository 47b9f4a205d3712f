"""FlashDiff inside diffusers, on tiny FLUX, SD3, SD3.5 and Wan transformers built from small
configs (no download), driven by an Euler loop (diffusers' FlowMatchEulerDiscreteScheduler)
with random prompt embeddings."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import flashdiff  # noqa: E402
import flashdiff.diffusers as fdd  # noqa: E402

H = W = 8
TEXT = 6


class Flux:
    """A tiny FLUX transformer: latents as (batch, tokens, channels) with RoPE ids."""

    name = "flux"
    # How far (RMS over the output's spread) skipping may move the result on this model.
    tolerance = 0.05

    def make(self):
        return diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
            guidance_embeds=False, axes_dims_rope=[4, 4, 8],
        )

    def noise(self, batch, g):
        return torch.randn(batch, H * W, 8, generator=g)

    def forward(self, t, x, e, pooled, ts):
        ids = torch.zeros(H, W, 3)
        ids[..., 1] = torch.arange(H)[:, None]
        ids[..., 2] = torch.arange(W)[None, :]
        return t(x, encoder_hidden_states=e, pooled_projections=pooled, timestep=(ts / 1000).expand(x.shape[0]),
                 img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(TEXT, 3)).sample

    def embedder(self, t):
        return t.x_embedder

    def first_block_tokens(self, t, seen):
        t.transformer_blocks[0].register_forward_hook(lambda m, i, o: seen.append(o[1].shape[1]))


class SD3:
    """A tiny SD3 (or, with a second attention and Q/K norms, SD3.5) transformer: latents as
    images, 2x2 patches, an 8x8 token grid."""

    tolerance = 0.05

    def __init__(self, dual):
        self.dual = dual
        self.name = "sd3.5" if dual else "sd3"

    def make(self):
        return diffusers.SD3Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4,
            pos_embed_max_size=16, dual_attention_layers=(0,) if self.dual else (),
            qk_norm="rms_norm" if self.dual else None,
        )

    def noise(self, batch, g):
        return torch.randn(batch, 4, 2 * H, 2 * W, generator=g)

    def forward(self, t, x, e, pooled, ts):
        return t(x, encoder_hidden_states=e, pooled_projections=pooled, timestep=ts.expand(x.shape[0])).sample

    def embedder(self, t):
        return t.pos_embed

    def first_block_tokens(self, t, seen):
        t.transformer_blocks[0].register_forward_hook(lambda m, i, o: seen.append(o[1].shape[1]))


class Wan:
    """A tiny Wan transformer: video latents (batch, channels, frames, height, width), 1x2x2
    patches, a 2x4x8 token grid (H * W tokens), self-attention with 3-D RoPE and
    cross-attention to the prompt."""

    name = "wan"
    # The random Wan's velocity moves faster than the others': whole steps forecast at a
    # third of the work already differ by 0.057 of its spread.
    tolerance = 0.1

    def make(self):
        return diffusers.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        )

    def noise(self, batch, g):
        return torch.randn(batch, 4, 2, 8, 16, generator=g)

    def forward(self, t, x, e, pooled, ts):
        return t(x, timestep=ts.expand(x.shape[0]), encoder_hidden_states=e).sample

    def embedder(self, t):
        # Its output is (batch, channels, frames, height, width); with FlashDiff's gather,
        # (batch, channels, tokens, 1, 1).
        return t.patch_embedding

    def first_block_tokens(self, t, seen):
        t.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.shape[1]))


KINDS = [Flux(), SD3(False), SD3(True), Wan()]


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
def model(request):
    torch.manual_seed(0)
    kind = request.param
    return kind.make().eval(), diffusers.FlowMatchEulerDiscreteScheduler(), kind


def inputs(model, batch, seed):
    g = torch.Generator().manual_seed(seed)
    x = model[2].noise(batch, g)
    e = torch.randn(batch, TEXT, 32, generator=g)
    pooled = torch.randn(batch, 16, generator=g)
    return x, e, pooled


def euler(model, steps, x, e, pooled):
    t, sched, kind = model
    sched.set_timesteps(steps)
    with torch.no_grad():
        for ts in sched.timesteps:
            v = kind.forward(t, x, e, pooled, ts)
            x = sched.step(v, ts, x).prev_sample
    return x


def image_tokens_seen(model):
    """Counts the image tokens the transformer embeds (its work), per forward."""
    seen = []

    def count(m, i, o):
        # FLUX and SD3 embed to (batch, tokens, width); Wan to (batch, channels, grid...).
        seen.append(o.shape[0] * (o.shape[2:].numel() if o.dim() == 5 else o.shape[1]))

    model[2].embedder(model[0]).register_forward_hook(count)
    return seen


def test_epsilon_zero_equals_the_unmodified_transformer(model):
    x, e, p = inputs(model, 1, 0)
    ref = euler(model, 20, x, e, p)
    fdd.enable(model[0], epsilon=0.0, patches=8, scheduler=model[1])
    got = euler(model, 20, x, e, p)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    r = fdd.report(model[0])
    assert r["steps"] == 20 and r["samples"][0]["computed_per_step"] == [H * W] * 15
    fdd.disable(model[0])
    assert torch.equal(euler(model, 20, x, e, p), ref)


def test_skipping_computes_what_the_report_says(model):
    x, e, p = inputs(model, 1, 1)
    ref = euler(model, 20, x, e, p)
    t = model[0]
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=model[1], rule="gate")
    seen = image_tokens_seen(model)
    got = euler(model, 20, x, e, p)
    per_step = fdd.report(t)["samples"][0]["computed_per_step"]
    # The warm-up's 5 full steps, then what the report counts: the transformer's work.
    assert seen == [H * W] * 5 + per_step
    assert sum(per_step) < 0.6 * H * W * len(per_step), per_step
    assert per_step[-1] == H * W  # the last step runs every patch
    rel = ((got - ref).pow(2).mean().sqrt() / ref.std()).item()
    assert rel < model[2].tolerance, rel


def test_budget_runs_whole_steps_or_none_and_never_skips_more_than_k(model):
    x, e, p = inputs(model, 1, 1)
    ref = euler(model, 20, x, e, p)
    t = model[0]
    fdd.enable(t, epsilon=1.0, patches=8, max_skip=3, scheduler=model[1])
    # The image tokens the first block computes (the budget's signal embeds every token
    # each step, but runs no block).
    seen = []
    model[2].first_block_tokens(t, seen)
    got = euler(model, 20, x, e, p)
    r = fdd.report(t)
    per_step = r["samples"][0]["computed_per_step"]
    assert r["rule"] == "budget"
    # FlashDiff's share 0: a step runs every patch or none, and one that runs none does not
    # call the transformer; the last step runs.
    assert set(per_step) == {0, H * W} and per_step[-1] == H * W, per_step
    assert seen == [H * W] * 5 + [c for c in per_step if c]
    run = 0
    for c in per_step:
        run = run + 1 if c == 0 else 0
        assert run <= 3, per_step
    rel = ((got - ref).pow(2).mean().sqrt() / ref.std()).item()
    assert rel < model[2].tolerance, rel


def test_second_order_forecasts_follow_a_parabola_through_uneven_gaps():
    # Rows computed at steps 0, 2 and 3 of value(step) = 1 - 0.3 s + 0.05 s^2 (per row
    # scaled): forecasts at steps 5 and 8 are exact at second order, not at first.
    rows = torch.tensor([1.0, 2.0])

    def value(step):
        return rows * (1 - 0.3 * step + 0.05 * step * step)

    for second in (True, False):
        store = [value(0), torch.zeros(2), torch.zeros(2, dtype=torch.long)]
        if second:
            store += [torch.zeros(2), torch.zeros(2, dtype=torch.long)]
        pos = torch.arange(2)
        for n in (2, 3):
            fdd._refresh(store, pos, value(n), n)
        for n in (5, 8):
            got = fdd._forecast(*store[:3], n, True, *store[3:])
            off = (got - value(n)).abs().max().item()
            assert (off < 1e-5) == second, (second, n, off)


def test_second_order_reuse_reaches_every_pipelines_skipped_steps(model):
    # Every pipeline's velocity store carries the second-order terms: the skipped steps'
    # stand-ins change, and the result stays a forecast of the reference (random weights
    # move too fast for either order to be the better one, so the bound is loose).
    x, e, p = inputs(model, 1, 1)
    ref = euler(model, 20, x, e, p)
    outs = []
    for reuse in ("extrapolate", "extrapolate2"):
        fdd.enable(model[0], epsilon=1.0, patches=8, max_skip=3, reuse=reuse, scheduler=model[1])
        outs.append(euler(model, 20, x, e, p))
        per_step = fdd.report(model[0])["samples"][0]["computed_per_step"]
        assert per_step.count(0) > 0, per_step
        rel = ((outs[-1] - ref).pow(2).mean().sqrt() / ref.std()).item()
        assert rel < 2 * model[2].tolerance, (reuse, rel)
    assert not torch.equal(outs[0], outs[1])


def test_a_smaller_budget_runs_more_steps(model):
    x, e, p = inputs(model, 1, 1)
    runs = []
    # A middle budget that this model's change uses up in some steps, not all.
    for eps in [0.0, 0.2 if model[2].name == "wan" else 0.05, 1.0]:
        fdd.enable(model[0], epsilon=eps, patches=8, max_skip=10, scheduler=model[1])
        euler(model, 20, x, e, p)
        runs.append(sum(1 for c in fdd.report(model[0])["samples"][0]["computed_per_step"] if c))
    assert runs[0] == 15 and runs[0] > runs[1] > runs[2], runs


def test_the_budget_reads_each_patchs_relative_change():
    """The change the budget adds up, summed per patch and over a group's rows on the
    device, is the Rust `relative_change` of the same signal (the rows' tokens side by side),
    each patch weighted by its L1 norm."""
    from flashdiff.diffusers import _budget_observe

    g = torch.Generator().manual_seed(9)
    before, now = torch.randn(2, 12, 5, generator=g), torch.randn(2, 12, 5, generator=g)
    patch_of = np.array([0, 0, 1, 1, 1, 2, 2, 2, 2, 0, 1, 2], dtype=np.uint32)
    both = np.concatenate([patch_of, patch_of])
    want = flashdiff.relative_change(now.reshape(24, 5).numpy(), before.reshape(24, 5).numpy(), both, 3)

    class Group:
        tokens = [0, 1, 2]
        patch_of_t = torch.from_numpy(patch_of.astype(np.int64))
        signal = before

        class budget:
            @staticmethod
            def observe(change, signal):
                Group.got = (change, signal)

    _budget_observe(Group, now)
    np.testing.assert_allclose(Group.got[0], want, rtol=1e-5)
    norms = [before.reshape(24, 5).numpy()[both == p].__abs__().sum() for p in range(3)]
    np.testing.assert_allclose(Group.got[1], norms, rtol=1e-5)
    assert Group.signal is now


@pytest.mark.parametrize("rule", ["budget", "gate"])
def test_a_sample_gets_the_same_alone_or_in_a_batch_of_four(model, rule):
    x, e, p = inputs(model, 4, 2)
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1], rule=rule)
    # Salient words, so that the saliency map is not flat (Wan's cross-attention averaged
    # over every text position is 1 / TEXT for every token) and its cut not decided by ties.
    fdd.set_salient(model[0], np.arange(TEXT) < 2)
    four = euler(model, 16, x, e, p)
    schedules = [s["computed_per_step"] for s in fdd.report(model[0])["samples"]]
    # the samples decided differently: each on its own
    assert len({tuple(s) for s in schedules}) > 1 or rule == "budget", schedules
    for b in range(4):
        one = euler(model, 16, x[b:b + 1], e[b:b + 1], p[b:b + 1])
        assert fdd.report(model[0])["samples"][0]["computed_per_step"] == schedules[b]
        torch.testing.assert_close(four[b:b + 1], one, atol=1e-5, rtol=0)


def forwards_run(model):
    """Counts the transformer's forwards: its last projection runs once in each."""
    seen = []
    model[0].proj_out.register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    return seen


def test_the_whole_step_rule_runs_one_forward_per_computed_step_whatever_the_batch(model):
    x, e, p = inputs(model, 4, 2)
    fdd.enable(model[0], epsilon=0.3, patches=8, max_skip=3, scheduler=model[1])
    seen = forwards_run(model)
    euler(model, 20, x, e, p)
    rows = fdd.report(model[0])["samples"]
    computed = [sum(1 for s in range(15) if any(r["computed_per_step"][s] for r in rows))]
    # one forward per step in the warm-up and per step any sample computed, holding the
    # samples that computed
    assert len(seen) == 5 + computed[0], (seen, rows)
    per_step = [sum(1 for r in rows if r["computed_per_step"][s]) for s in range(15)]
    assert seen == [4] * 5 + [k for k in per_step if k]
    s = fdd.summary(model[0])
    assert s["forwards"] == len(seen) and s["calls"] == 20


def test_the_whole_step_rule_keeps_only_what_it_reads(model):
    x, e, p = inputs(model, 2, 2)
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1])
    out = euler(model, 16, x, e, p)
    state = fdd.summary(model[0])["state_bytes"]
    assert state["kv"] == 0
    # each row's velocity history: last value and slope (float32) and the step of each token
    tokens = H * W
    channels = out[0].numel() // tokens
    assert state["velocity"] == 2 * (2 * tokens * channels * 4 + tokens * 8)
    assert state["signal"] > 0
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1], rule="gate")
    euler(model, 16, x, e, p)
    assert fdd.summary(model[0])["state_bytes"]["kv"] > 0


def euler_guided(model, steps, x, e, pooled, scale=4.0):
    """Classifier-free guidance as FLUX's true CFG and Wan's pipelines run it: two calls a
    step, with the prompt and with an empty one."""
    t, sched, kind = model
    sched.set_timesteps(steps)
    e0, p0 = torch.zeros_like(e), torch.zeros_like(pooled)
    with torch.no_grad():
        for ts in sched.timesteps:
            vc = kind.forward(t, x, e, pooled, ts)
            vu = kind.forward(t, x, e0, p0, ts)
            x = sched.step(vu + scale * (vc - vu), ts, x).prev_sample
    return x


def test_guidance_gives_each_sample_what_it_gets_alone(model):
    x, e, p = inputs(model, 2, 7)
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1])
    both = euler_guided(model, 16, x, e, p)
    samples = {(s["branch"], s["sample"]): s for s in fdd.report(model[0])["samples"]}
    # Each of the two calls a step (branch) has a row per sample; a sample's two rows are
    # one group and the second call follows the first's decision; each skipped some work.
    assert sorted(samples) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for b in range(2):
        cond, uncond = samples[(0, b)], samples[(1, b)]
        assert cond["group"] == uncond["group"] == b
        assert cond["computed_per_step"] == uncond["computed_per_step"]
        assert 0 in cond["computed_per_step"], cond
    for b in range(2):
        one = euler_guided(model, 16, x[b:b + 1], e[b:b + 1], p[b:b + 1])
        torch.testing.assert_close(both[b:b + 1], one, atol=1e-5, rtol=0)


def test_a_call_is_unaffected_by_the_one_before(model):
    x, e, p = inputs(model, 2, 3)
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1])
    fresh = euler(model, 20, x, e, p)
    xa, ea, pa = inputs(model, 1, 4)
    euler(model, 12, xa, ea, pa)  # another step count and batch size first
    again = euler(model, 20, x, e, p)
    assert torch.equal(again, fresh)
    assert fdd.report(model[0])["steps"] == 20 and len(fdd.report(model[0])["samples"]) == 2


def test_few_step_schedules_run_unchanged_and_say_so(model):
    x, e, p = inputs(model, 1, 5)
    ref = euler(model, 4, x, e, p)
    fdd.enable(model[0], epsilon=0.5, patches=8, scheduler=model[1])
    with pytest.warns(UserWarning, match="few-step"):
        got = euler(model, 4, x, e, p)
    assert torch.equal(got, ref) and fdd.report(model[0])["plain"]
    fdd.enable(model[0], epsilon=0.5, patches=8, warmup=2, force=True, scheduler=model[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        euler(model, 4, x, e, p)
    assert not fdd.report(model[0])["plain"]


def test_bad_settings_are_refused(model):
    t, sched, _ = model
    for kw, text in [
        (dict(epsilon=2.0), "epsilon"),
        (dict(patches=0), "patches"),
        (dict(reuse="old"), "reuse"),
        (dict(rule="magic"), "rule"),
    ]:
        with pytest.raises(flashdiff.Error, match=text):
            fdd.enable(t, scheduler=sched, **kw)
    with pytest.raises(flashdiff.Error, match="scheduler"):
        fdd.enable(t)
    with pytest.raises(flashdiff.Error, match="not supported"):
        fdd.enable(torch.nn.Linear(2, 2), scheduler=sched)
    with pytest.raises(flashdiff.Error, match="no call"):
        fdd.report(t)
    fdd.enable(t, warmup=30, scheduler=sched)
    x, e, p = inputs(model, 1, 6)
    with pytest.raises(flashdiff.Error, match="warmup"):
        euler(model, 20, x, e, p)


def flop_count(fn):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def test_the_flops_it_reports_are_those_torch_counts(model):
    """The cost model (layers' sizes and attention shapes) against FlopCounterMode, on a
    whole forward and on one computing half of the image tokens (the gate's partial
    forward, K/V of the rest forecast)."""
    t, sched, kind = model
    x, e, p = inputs(model, 2, 3)
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=sched, rule="gate")
    a = t._flashdiff_adapter
    with torch.no_grad():
        whole = flop_count(lambda: kind.forward(t, x, e, p, torch.tensor(500.0)))
    # outside a call FlashDiff ran (a forward with no scheduler step) it is a whole forward
    assert whole == pytest.approx(2 * a.cost.forward(H * W, H * W, TEXT), rel=0.01)
    # a call: the summary's FLOPs against torch's count of the whole loop, signal included
    total = flop_count(lambda: euler(model, 16, x, e, p))
    s = fdd.summary(t)
    assert s["flops_fraction"] < 0.9
    assert s["flops_fraction"] * 16 * whole == pytest.approx(total, rel=0.03)
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=sched)
    total = flop_count(lambda: euler(model, 16, x, e, p))
    s = fdd.summary(t)
    assert s["flops_fraction"] * 16 * whole == pytest.approx(total, rel=0.03)


def test_every_set_timesteps_starts_a_call_even_on_the_same_tensor(model):
    t, sched, kind = model
    x, e, p = inputs(model, 1, 3)
    xb, eb, pb = inputs(model, 1, 4)
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=sched)
    fresh = euler(model, 20, x, e, p)
    sched.set_timesteps(20)
    ts = sched.timesteps

    def loop(x, e, p):
        sched.set_timesteps(20)
        sched.timesteps = ts  # a scheduler that keeps its tensor
        with torch.no_grad():
            for s in sched.timesteps:
                x = sched.step(kind.forward(t, x, e, p, s), s, x).prev_sample
        return x

    loop(xb, eb, pb)
    assert torch.equal(loop(x, e, p), fresh)
    # the call's own rows only: 15 steps after the warm-up, 20 calls of the transformer
    assert len(fdd.report(t)["samples"][0]["computed_per_step"]) == 15
    assert fdd.summary(t)["calls"] == 20


def test_disable_restores_the_transformer_and_scheduler_exactly(model):
    t, sched, kind = model
    x, e, p = inputs(model, 1, 3)
    ref = euler(model, 16, x, e, p)
    procs = {k: type(v) for k, v in t.attn_processors.items()}
    fdd.enable(t, epsilon=0.5, patches=8, scheduler=sched)
    assert not torch.equal(euler(model, 16, x, e, p), ref)
    assert "forward" in t.__dict__ and "set_timesteps" in sched.__dict__
    fdd.disable(t)
    assert "forward" not in t.__dict__ and "set_timesteps" not in sched.__dict__
    assert {k: type(v) for k, v in t.attn_processors.items()} == procs
    assert torch.equal(euler(model, 16, x, e, p), ref)


def test_summary_says_what_was_skipped_or_why_nothing_was(model, caplog):
    import logging

    t, sched, kind = model
    x, e, p = inputs(model, 1, 3)
    fdd.enable(t, epsilon=0.5, patches=8, scheduler=sched)
    with caplog.at_level(logging.INFO, logger="flashdiff.diffusers"):
        euler(model, 16, x, e, p)
    s = fdd.summary(t)
    computed = s["rows"][0]["steps_computed"]
    assert computed < 16 and s["text"].startswith(f"computed {computed} of 16 steps")
    assert s["seconds"] > 0 and 0 < s["flops_fraction"] < 1
    assert [r.getMessage() for r in caplog.records] == ["flashdiff: " + s["text"]]
    fdd.enable(t, epsilon=0.0, patches=8, scheduler=sched)
    euler(model, 16, x, e, p)
    assert fdd.summary(t)["text"].startswith("nothing was skipped: epsilon 0 never skips")
    fdd.enable(t, epsilon=0.5, patches=8, scheduler=sched)
    with pytest.warns(UserWarning, match="few-step"):
        euler(model, 4, x, e, p)
    s = fdd.summary(t)
    assert s["text"].startswith("nothing was skipped: 4 steps is a few-step schedule")
    assert s["flops_fraction"] == 1.0 and s["forwards"] == 4


def test_a_whole_step_reuses_the_signals_layers_on_flux(model):
    """FLUX: a computed step takes the patch embedding, timestep embedding and first
    modulation its signal computed, so with every step computed (ε 0) torch counts the plain
    loop's FLOPs plus only the saliency read of the warm-up, the output is the plain loop's,
    and the summary's FLOPs are torch's."""
    t, sched, kind = model
    if kind.name != "flux":
        pytest.skip("the signal's layers are shared on FLUX only")
    x, e, p = inputs(model, 2, 3)
    plain_out = euler(model, 12, x, e, p)
    plain = flop_count(lambda: euler(model, 12, x, e, p))
    fdd.enable(t, epsilon=0.0, patches=8, scheduler=sched)
    a = t._flashdiff_adapter
    got = euler(model, 12, x, e, p)
    total = flop_count(lambda: euler(model, 12, x, e, p))
    s = fdd.summary(t)
    fdd.disable(t)
    torch.testing.assert_close(got, plain_out, atol=1e-5, rtol=0)
    signal = 2 * a.cost.signal(H * W, TEXT)  # both rows' signal of one step
    n = H * W
    saliency = sum(2 * 2 * inner * n * (TEXT if k == "cross" else n + TEXT) for k, inner in a.saliency_blocks)
    # Without the sharing, each of the 7 steps after the warm-up would add its signal.
    assert abs(total - plain - saliency) < signal / 2, (total - plain, saliency, signal)
    assert s["flops_fraction"] * plain == pytest.approx(total, rel=0.01)


def test_compiled_transformer_decides_outside_the_graph_with_bounded_recompiles(model):
    """torch.compile's wrapper, enabled after compiling: the outputs are those of the
    uncompiled transformer with FlashDiff, and the graphs compiled stay few (one on these
    models: the saliency step runs outside the graph), whatever the step count, and a second
    call compiles none."""
    t, sched, kind = model
    x, e, p = inputs(model, 2, 3)
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=sched)
    want = euler(model, 20, x, e, p)
    fdd.disable(t)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(t, backend=backend)
    fdd.enable(compiled, epsilon=0.3, patches=8, scheduler=sched)
    got = euler((compiled, sched, kind), 20, x, e, p)
    first = len(graphs)
    got2 = euler((compiled, sched, kind), 20, x, e, p)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.equal(got, got2)
    assert fdd.summary(compiled)["forwards"] < 20
    assert len(graphs) == first, "a second call compiled again"
    assert first <= 3, first
    fdd.disable(compiled)
    torch._dynamo.reset()


def test_a_bare_clock_without_set_timesteps_is_followed_by_its_tensors(model):
    """A caller's own clock (``timesteps`` and ``step_index`` only, as bench scripts drive a
    transformer): each new timesteps tensor starts a call."""
    t, sched, kind = model

    class Clock:
        timesteps = None
        step_index = None

    clock = Clock()
    x, e, p = inputs(model, 1, 3)
    fdd.enable(t, epsilon=0.3, patches=8, scheduler=clock)
    outs = []
    for _ in range(2):
        sched.set_timesteps(16)
        clock.timesteps = sched.timesteps.clone()
        y = x
        with torch.no_grad():
            for n, s in enumerate(clock.timesteps):
                clock.step_index = n if n else None
                y = sched.step(kind.forward(t, y, e, p, s), s, y).prev_sample
        outs.append(y)
        assert len(fdd.report(t)["samples"][0]["computed_per_step"]) == 11
    assert torch.equal(outs[0], outs[1])
    fdd.disable(t)


def two_stage(pipe, steps, boundary, x, e):
    """Wan 2.2's loop: `transformer` for the first `boundary` steps, `transformer_2` after."""
    sched = pipe.scheduler
    sched.set_timesteps(steps)
    with torch.no_grad():
        for i, ts in enumerate(sched.timesteps):
            t = pipe.transformer if i < boundary else pipe.transformer_2
            v = t(x, timestep=ts.expand(x.shape[0]), encoder_hidden_states=e).sample
            x = sched.step(v, ts, x).prev_sample
    return x


def test_a_second_transformer_warms_up_decides_and_forecasts_on_its_own_steps():
    from types import SimpleNamespace

    wan = Wan()
    torch.manual_seed(3)
    pipe = SimpleNamespace(transformer=wan.make(), transformer_2=wan.make(),
                           scheduler=diffusers.FlowMatchEulerDiscreteScheduler())
    x, e, _ = inputs((None, None, wan), 1, 5)
    want = two_stage(pipe, 20, 9, x, e)
    fdd.enable(pipe, epsilon=0.0)
    torch.testing.assert_close(two_stage(pipe, 20, 9, x, e), want, atol=1e-5, rtol=0)
    fdd.enable(pipe, epsilon=0.5, max_skip=3)  # again: replaces, does not stack
    got = two_stage(pipe, 20, 9, x, e)
    rep, summ = fdd.report(pipe), fdd.summary(pipe)
    # A second call starts afresh in both stages: the same output and the same work.
    torch.testing.assert_close(two_stage(pipe, 20, 9, x, e), got, atol=0, rtol=0)
    assert fdd.report(pipe) == rep
    first, second = rep["samples"][0]["computed_per_step"], rep["transformer_2"]["samples"][0]["computed_per_step"]
    # Each stage warms up (5 steps) on its own steps and then skips some: 9 - 5 and 11 - 5.
    assert len(first) == 4 and len(second) == 6, (first, second)
    assert 0 in first and 0 in second, (first, second)
    assert "transformer_2:" in summ["text"] and summ["transformer_2"]["rows"][0]["steps_computed"] < 11
    rel = ((got - want).pow(2).mean().sqrt() / want.std()).item()
    assert rel < wan.tolerance, rel
    fdd.disable(pipe)
    assert "forward" not in pipe.transformer.__dict__ and "forward" not in pipe.transformer_2.__dict__
    assert not hasattr(pipe.transformer_2, "_flashdiff_adapter")
    torch.testing.assert_close(two_stage(pipe, 20, 9, x, e), want, atol=0, rtol=0)


def test_a_second_transformer_of_another_kind_is_refused_and_nothing_stays_enabled():
    from types import SimpleNamespace

    pipe = SimpleNamespace(transformer=Wan().make(), transformer_2=Flux().make(),
                           scheduler=diffusers.FlowMatchEulerDiscreteScheduler())
    with pytest.raises(flashdiff.Error, match="transformer_2 is a FluxTransformer2DModel"):
        fdd.enable(pipe)
    assert "forward" not in pipe.transformer.__dict__ and not hasattr(pipe.transformer, "_flashdiff_adapter")
    assert "set_timesteps" not in pipe.scheduler.__dict__
