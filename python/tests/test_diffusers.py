"""FlashDiff inside diffusers, on tiny FLUX, SD3 and SD3.5 transformers built from small configs
(no download), driven by an Euler loop (diffusers' FlowMatchEulerDiscreteScheduler) with random
prompt embeddings."""

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


class SD3:
    """A tiny SD3 (or, with a second attention and Q/K norms, SD3.5) transformer: latents as
    images, 2x2 patches, an 8x8 token grid."""

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


KINDS = [Flux(), SD3(False), SD3(True)]


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
    model[2].embedder(model[0]).register_forward_hook(lambda m, i, o: seen.append(o.shape[0] * o.shape[1]))
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
    assert rel < 0.05, rel


def flux_model():
    torch.manual_seed(0)
    kind = Flux()
    return kind.make().eval(), diffusers.FlowMatchEulerDiscreteScheduler(), kind


def test_budget_runs_whole_steps_or_none_and_never_skips_more_than_k():
    model = flux_model()
    x, e, p = inputs(model, 1, 1)
    ref = euler(model, 20, x, e, p)
    fdd.enable(model[0], epsilon=1.0, patches=8, max_skip=3, scheduler=model[1])
    # The image tokens the first block computes (the budget's signal embeds every token
    # each step, but runs no block).
    seen = []
    model[0].transformer_blocks[0].register_forward_hook(lambda m, i, o: seen.append(o[1].shape[1]))
    got = euler(model, 20, x, e, p)
    r = fdd.report(model[0])
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
    assert rel < 0.05, rel


def test_a_smaller_budget_runs_more_steps():
    model = flux_model()
    x, e, p = inputs(model, 1, 1)
    runs = []
    for eps in [0.0, 0.05, 1.0]:
        fdd.enable(model[0], epsilon=eps, patches=8, max_skip=10, scheduler=model[1])
        euler(model, 20, x, e, p)
        runs.append(sum(1 for c in fdd.report(model[0])["samples"][0]["computed_per_step"] if c))
    assert runs[0] == 15 and runs[0] > runs[1] > runs[2], runs


def test_the_budget_is_refused_where_it_does_not_run():
    t, sched, _ = SD3(False).make(), diffusers.FlowMatchEulerDiscreteScheduler(), None
    with pytest.raises(flashdiff.Error, match="FLUX"):
        fdd.enable(t, rule="budget", scheduler=sched)
    fdd.enable(t, scheduler=sched)
    x, e, p = inputs((t, sched, SD3(False)), 1, 0)
    euler((t, sched, SD3(False)), 12, x, e, p)
    assert fdd.report(t)["rule"] == "gate"


def test_batch_of_two_equals_two_single_runs(model):
    x, e, p = inputs(model, 2, 2)
    fdd.enable(model[0], epsilon=0.3, patches=8, scheduler=model[1])
    both = euler(model, 16, x, e, p)
    for b in range(2):
        one = euler(model, 16, x[b:b + 1], e[b:b + 1], p[b:b + 1])
        torch.testing.assert_close(both[b:b + 1], one, atol=1e-6, rtol=0)


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
