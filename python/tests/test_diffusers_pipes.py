"""FlashDiff on whole diffusers pipelines (small random weights, built offline by
`tiny_pipes`): prompts and guidance rows, LoRA, ControlNet, CPU offload, the summary."""

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

import flashdiff  # noqa: E402
import flashdiff.diffusers as fdd  # noqa: E402
import flashdiff.diffusers._adapter as core  # noqa: E402

import tiny_pipes as tp  # noqa: E402

STEPS = 16
SIZE = dict(height=16, width=16, max_sequence_length=tp.TEXT, output_type="pt", num_inference_steps=STEPS)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def salient_words(monkeypatch):
    """The word lists whose salient words the adapter looked up, in order."""
    seen = []
    real = core.salient_mask

    def spy(words):
        seen.append(" ".join(words))
        return real(words)

    monkeypatch.setattr(core, "salient_mask", spy)
    return seen


def test_sd3_guidance_rows_take_their_own_prompt(monkeypatch):
    # 2 prompts x 2 images, classifier-free guidance: the batch is [4 negatives, 4 positives];
    # each image's negative and positive rows are one group, whose saliency comes from the
    # positive row and its own prompt.
    pipe = tp.sd3_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    seen = salient_words(monkeypatch)
    pipe(["a red fox", "a blue cat"], negative_prompt=["ugly", "blurry"], num_images_per_prompt=2,
         guidance_scale=4.0, generator=gen(), **SIZE)
    assert seen == ["a red fox"] * 2 + ["a blue cat"] * 2
    rows = {r["sample"]: r for r in fdd.report(pipe)["samples"]}
    assert [rows[b]["group"] for b in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    for b in range(4):
        assert rows[b]["computed_per_step"] == rows[b + 4]["computed_per_step"]


def test_flux_images_per_prompt_and_true_cfg_take_the_positive_prompt(monkeypatch):
    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    seen = salient_words(monkeypatch)
    pipe(["a red fox", "a blue cat"], num_images_per_prompt=2, generator=gen(), **SIZE)
    assert seen == ["a red fox"] * 2 + ["a blue cat"] * 2
    seen.clear()
    # True CFG: a second transformer call a step with the negative prompt, which must not
    # replace the prompt and follows the positive call's decisions.
    pipe("a green dog", negative_prompt="ugly blurry", true_cfg_scale=3.0, generator=gen(), **SIZE)
    assert seen == ["a green dog"]
    rows = {(r["branch"], r["sample"]): r for r in fdd.report(pipe)["samples"]}
    assert rows[(0, 0)]["computed_per_step"] == rows[(1, 0)]["computed_per_step"]
    assert 0 in rows[(0, 0)]["computed_per_step"]


def test_a_pipeline_image_is_the_same_alone_or_beside_another():
    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    latents = torch.randn(2, 64, 16, generator=gen(3))
    two = pipe(["a red fox", "a blue cat"], latents=latents, **SIZE).images
    one = pipe("a blue cat", latents=latents[1:], **SIZE).images
    torch.testing.assert_close(two[1:], one, atol=1e-5, rtol=0)


def lora_state(pipe, seed):
    """A LoRA of rank 2 on every attention's query, key and value projection of the
    transformer, in diffusers' layout, with random weights."""
    g = gen(seed)
    sd = {}
    for name, m in pipe.transformer.named_modules():
        if name.endswith(("attn.to_q", "attn.to_k", "attn.to_v")):
            sd[f"transformer.{name}.lora_A.weight"] = torch.randn(2, m.in_features, generator=g) * 0.5
            sd[f"transformer.{name}.lora_B.weight"] = torch.randn(m.out_features, 2, generator=g) * 0.5
    return sd


def test_lora_loaded_and_fused_still_changes_the_output():
    pytest.importorskip("peft")
    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    base = pipe("a red fox", generator=gen(), **SIZE).images
    pipe.load_lora_weights(lora_state(pipe, 1))
    with_lora = pipe("a red fox", generator=gen(), **SIZE).images
    assert (with_lora - base).abs().max() > 1e-2
    assert fdd.summary(pipe)["rows"][0]["steps_computed"] < STEPS
    pipe.fuse_lora()
    fused = pipe("a red fox", generator=gen(), **SIZE).images
    torch.testing.assert_close(fused, with_lora, atol=1e-4, rtol=0)
    # With nothing skipped, the LoRA pipeline's own output.
    fdd.enable(pipe, epsilon=0.0, patches=8)
    exact = pipe("a red fox", generator=gen(), **SIZE).images
    fdd.disable(pipe)
    torch.testing.assert_close(exact, pipe("a red fox", generator=gen(), **SIZE).images, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["flux", "sd3"])
@pytest.mark.parametrize("rule", ["budget", "gate"])
def test_controlnet_control_still_changes_the_output(family, rule):
    pipe = tp.flux_controlnet_pipe() if family == "flux" else tp.sd3_controlnet_pipe()
    a, b = torch.rand(1, 3, 16, 16, generator=gen(1)), torch.rand(1, 3, 16, 16, generator=gen(2))

    def run(control):
        torch.manual_seed(0)  # SD3's ControlNet pipeline samples the control's latents from the global RNG
        return pipe("a red fox", control_image=control, generator=gen(), **SIZE).images

    ref, ref_b = run(a), run(b)
    fdd.enable(pipe, epsilon=0.3, patches=8, rule=rule)
    out_a, out_b = run(a), run(b)
    assert fdd.summary(pipe)["flops_fraction"] < 0.95
    # each output follows its own control: nearer the unmodified pipeline's image under the
    # same control than under the other
    for out, same, other in [(out_a, ref, ref_b), (out_b, ref_b, ref)]:
        assert (out - same).abs().mean() < 0.5 * (out - other).abs().mean()
    fdd.enable(pipe, epsilon=0.0, patches=8, rule=rule)
    torch.testing.assert_close(run(a), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_controlnet_flops_count_in_the_fraction(family):
    """The ControlNet runs every step: the FLOPs fraction is the denoising loop's as torch
    counts it, ControlNet included. The loop's FLOPs are a pipeline call's less what lies
    outside the loop (text encoders, VAE), found from calls of 16 and 8 steps."""
    from torch.utils.flop_counter import FlopCounterMode

    pipe = tp.flux_controlnet_pipe() if family == "flux" else tp.sd3_controlnet_pipe()
    control = torch.rand(1, 3, 16, 16, generator=gen(1))

    def total(steps):
        torch.manual_seed(0)
        with FlopCounterMode(display=False) as fc:
            pipe("a red fox", control_image=control, generator=gen(), **{**SIZE, "num_inference_steps": steps})
        return fc.get_total_flops()

    t16, t8 = total(STEPS), total(STEPS // 2)
    per_step = (t16 - t8) / (STEPS - STEPS // 2)
    outside = t16 - STEPS * per_step
    fdd.enable(pipe, epsilon=0.3, patches=8)
    run = total(STEPS)
    frac = fdd.summary(pipe)["flops_fraction"]
    assert frac < 0.95
    assert frac == pytest.approx((run - outside) / (STEPS * per_step), rel=0.03)


def test_processors_installed_after_enable_run_and_survive_disable():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    class Counting:
        calls = 0

        def __init__(self):
            self.inner = FluxAttnProcessor()

        def __call__(self, *a, **k):
            Counting.calls += 1
            return self.inner(*a, **k)

    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    want = pipe("a red fox", generator=gen(), **SIZE).images
    mine = {n: Counting() for n in pipe.transformer.attn_processors}
    pipe.transformer.set_attn_processor(dict(mine))
    got = pipe("a red fox", generator=gen(), **SIZE).images
    assert Counting.calls > 0, "the processors installed after enable() never ran"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert fdd.summary(pipe)["flops_fraction"] < 0.95
    fdd.disable(pipe)
    assert all(pipe.transformer.attn_processors[n] is p for n, p in mine.items())


@pytest.mark.parametrize("first", ["offload", "flashdiff"])
def test_model_cpu_offload_works_in_either_order(first):
    pytest.importorskip("accelerate")
    want_pipe = tp.flux_pipe()
    fdd.enable(want_pipe, epsilon=0.3, patches=8)
    want = want_pipe("a red fox", generator=gen(), **SIZE).images
    pipe = tp.flux_pipe()
    if first == "offload":
        pipe.enable_model_cpu_offload(device="cpu")
        fdd.enable(pipe, epsilon=0.3, patches=8)
    else:
        fdd.enable(pipe, epsilon=0.3, patches=8)
        pipe.enable_model_cpu_offload(device="cpu")
    got = pipe("a red fox", generator=gen(), **SIZE).images
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert fdd.summary(pipe)["rows"][0]["steps_computed"] < STEPS
    fdd.disable(pipe)
    plain = tp.flux_pipe()
    torch.testing.assert_close(pipe("a red fox", generator=gen(), **SIZE).images,
                               plain("a red fox", generator=gen(), **SIZE).images, atol=1e-5, rtol=0)


def test_summary_of_a_pipeline_call():
    pipe = tp.flux_pipe()
    with pytest.raises(flashdiff.Error, match="no call"):
        fdd.enable(pipe) or fdd.summary(pipe)
    fdd.enable(pipe, epsilon=0.3, patches=8)
    pipe(["a red fox", "a blue cat"], generator=gen(), **SIZE)
    s = fdd.summary(pipe)
    assert [(r["branch"], r["sample"]) for r in s["rows"]] == [(0, 0), (0, 1)]
    assert s["calls"] == STEPS and s["forwards"] < STEPS
    assert "of full computation's FLOPs" in s["text"]


def test_the_same_generator_gives_the_same_image_with_flashdiff_enabled():
    pipe = tp.sd3_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    a = pipe(["a red fox", "a blue cat"], guidance_scale=4.0, generator=gen(5), **SIZE).images
    b = pipe(["a red fox", "a blue cat"], guidance_scale=4.0, generator=gen(5), **SIZE).images
    c = pipe(["a red fox", "a blue cat"], guidance_scale=4.0, generator=gen(6), **SIZE).images
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert 0 < fdd.summary(pipe)["flops_fraction"] < 1


def test_sd3_skip_layer_guidance_keeps_each_sample_in_its_group():
    # Skip-layer guidance calls the transformer a second time a step with the positive rows
    # alone; each takes its own sample's group, and a row with no history yet runs.
    pipe = tp.sd3_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    pipe(["a red fox", "a blue cat"], guidance_scale=4.0, skip_guidance_layers=[0],
         skip_layer_guidance_start=0.4, skip_layer_guidance_stop=0.9, generator=gen(), **SIZE)
    rows = {(r["branch"], r["sample"]): r for r in fdd.report(pipe)["samples"]}
    assert rows[(1, 0)]["group"] == 0 and rows[(1, 1)]["group"] == 1
    assert fdd.summary(pipe)["rows"][0]["steps_computed"] < STEPS


def test_an_img2img_call_counts_its_warm_up_from_its_first_step():
    parts = tp.flux_pipe().components
    pipe = diffusers.FluxImg2ImgPipeline(**parts)
    fdd.enable(pipe, epsilon=0.3, patches=8)
    image = torch.rand(1, 3, 16, 16, generator=gen(1))
    pipe("a red fox", image=image, strength=0.6, generator=gen(), **SIZE)
    s = fdd.summary(pipe)
    # strength 0.6 runs the schedule's last steps only; the warm-up and the skips count from
    # the first of them
    run = s["calls"]
    assert 5 < run < STEPS and s["forwards"] < run, s["text"]
    assert s["text"].startswith("computed ") and f"of {run} steps" in s["text"]


def test_the_gate_summary_counts_tokens_not_steps():
    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8, rule="gate")
    pipe("a red fox", generator=gen(), **SIZE)
    s = fdd.summary(pipe)
    assert s["flops_fraction"] < 0.95
    assert s["text"].startswith("computed ") and "of the image tokens" in s["text"], s["text"]
    assert s["rows"][0]["token_share"] < 1.0


def test_disable_leaves_a_later_wrapper_working():
    # A wrapper installed after enable() (as accelerate's offload hooks do, copying the
    # wrapped function's name) stays; FlashDiff passes through under it.
    import functools

    pipe = tp.flux_pipe()
    plain = pipe("a red fox", generator=gen(), **SIZE).images
    fdd.enable(pipe, epsilon=0.3, patches=8)
    inner = pipe.transformer.forward
    seen = []

    def hook(*a, **k):
        seen.append(1)
        return inner(*a, **k)

    pipe.transformer.forward = functools.update_wrapper(hook, inner)
    fdd.disable(pipe)
    assert pipe.transformer.forward is hook
    torch.testing.assert_close(pipe("a red fox", generator=gen(), **SIZE).images, plain, atol=1e-5, rtol=0)
    assert len(seen) == STEPS


def test_the_saliency_reads_the_prompt_t5_encodes():
    # FLUX's T5 encodes prompt_2 where it is given; its words are the salient ones.
    pipe = tp.flux_pipe()
    fdd.enable(pipe, epsilon=0.3, patches=8)
    seen = []
    real = core.salient_mask
    core.salient_mask = lambda words: seen.append(" ".join(words)) or real(words)
    try:
        pipe("a red fox", prompt_2="a green dog in the snow", generator=gen(), **SIZE)
    finally:
        core.salient_mask = real
    assert seen == ["a green dog in the snow"]


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_guided_output_is_the_plain_pipelines_and_skipping_stays_near_it(family):
    """Under classifier-free guidance (SD3's negative rows in the same batch, FLUX's true CFG
    as a second call) the adapter at epsilon 0 gives the plain pipeline's guided image, and
    with skipping the image stays much nearer the guided reference than the unguided image is."""
    pipe = tp.sd3_pipe() if family == "sd3" else tp.flux_pipe()
    guided = dict(guidance_scale=4.0) if family == "sd3" else dict(negative_prompt="ugly blurry", true_cfg_scale=3.0)
    plain = dict(guidance_scale=1.0) if family == "sd3" else {}

    def run(**kw):
        return pipe("a red fox", generator=gen(), **kw, **SIZE).images

    ref, unguided = run(**guided), run(**plain)
    assert (unguided - ref).abs().mean() > 1e-3, "guidance changes nothing here"
    fdd.enable(pipe, epsilon=0.0, patches=8)
    torch.testing.assert_close(run(**guided), ref, atol=1e-5, rtol=0)
    fdd.enable(pipe, epsilon=0.3, patches=8)
    skipped = run(**guided)
    s = fdd.summary(pipe)
    assert s["flops_fraction"] < 0.95, s["text"]
    assert s["calls"] == (2 if family == "flux" else 1) * STEPS, s["text"]
    err, gap = (skipped - ref).abs().mean().item(), (unguided - ref).abs().mean().item()
    # Measured: 0.10 (SD3) and 0.22 (FLUX) of the gap; forecasting SD3's negative rows with
    # the positive rows' velocity gives 0.42.
    assert err < 0.3 * gap, (err, gap, s["text"])
    fdd.disable(pipe)
