"""The engine from Python: the CLI's output byte for byte, the request schema's settings and
errors, and the serving loop (submit, step, poll, result, cancel)."""

import json
import os
import pathlib
import shutil
import subprocess
import threading

import numpy as np
import pytest

import flashdiff

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "a yellow square center on a blue background"


def cli():
    """The `flashdiff` executable: $FLASHDIFF_CLI, else the workspace's build."""
    given = os.environ.get("FLASHDIFF_CLI")
    if given:
        return given
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "flashdiff"
        if p.exists():
            return str(p)
    return shutil.which("flashdiff")


@pytest.fixture(scope="module")
def engine():
    return flashdiff.Engine("tinydit")


def test_generate_equals_the_cli_byte_for_byte(engine, tmp_path):
    exe = cli()
    if exe is None:
        pytest.skip("no flashdiff executable: build it (cargo build) or set FLASHDIFF_CLI")
    out = tmp_path / "cli.png"
    subprocess.run(
        [exe, "generate", PROMPT, "--seed", "7", "--steps", "30", "-o", str(out)],
        check=True,
        capture_output=True,
    )
    got = engine.generate(PROMPT, seed=7, steps=30)
    assert got.extension == "png"
    assert got.file == out.read_bytes()
    assert got.sample.shape == (32, 32, 3) and got.sample.dtype == np.float32
    assert 0.0 <= got.sample.min() and got.sample.max() <= 1.0
    r = got.report
    assert r["steps"] == 30 and r["warmup"] == 5 and r["patches"] == 16
    assert r["computed"] <= r["patch_steps"]
    assert sum(r["active_per_step"]) == r["computed"]
    assert len(r["patch_of"]) == 64


def test_settings_are_the_request_schema(engine):
    d = engine.settings("x")
    assert (d["steps"], d["patches"], d["warmup"], d["mode"]) == (50, 16, 5, "auto")
    d = engine.settings("x", steps=4, patches="auto", reuse="stale", mode="ras")
    assert (d["steps"], d["patches"], d["warmup"], d["reuse"], d["mode"]) == (4, None, 3, "stale", "ras")
    for bad, text in [
        ({"steps": 1}, '"steps" 1: must be in 2..=1000'),
        ({"steps": "many"}, '"steps"'),
        ({"stepz": 3}, "unknown field `stepz`"),
        ({"mode": "fast"}, '"mode"'),
        ({"epsilon": 2.0}, '"epsilon"'),
        ({"n": 2}, '"n": not a setting'),
        ({"model": "tinyvideo"}, '"model"'),
        ({"seed": object()}, "settings: not representable"),
    ]:
        with pytest.raises(flashdiff.Error) as e:
            engine.generate("x", **bad)
        assert text in str(e.value), (bad, str(e.value))


def test_the_diffusers_adapter_defaults_are_the_engines(engine):
    import inspect

    import flashdiff.diffusers

    given = {k: p.default for k, p in inspect.signature(flashdiff.diffusers.enable).parameters.items()}
    d = engine.settings("x", mode="flashdiff")
    for k in ("epsilon", "patches", "max_skip", "warmup"):
        assert given[k] == pytest.approx(d[k]), (k, given[k], d[k])


def test_skipping_work_follows_epsilon(engine):
    full = engine.generate(PROMPT, mode="full", steps=20)
    lazy = engine.generate(PROMPT, epsilon=1.0, steps=20)
    none = engine.generate(PROMPT, epsilon=0.0, steps=20)
    assert full.report["work_skipped"] == 0.0
    assert none.report["computed"] == none.report["patch_steps"]
    assert lazy.report["computed"] < none.report["computed"]
    np.testing.assert_array_equal(none.sample.shape, full.sample.shape)


def test_a_work_budget_caps_the_work(engine):
    assert engine.settings("x", budget=0.4)["budget"] == 0.4
    # 20 steps, 5 warm-up: 0.4 of the FLOPs computes 7 steps, 2 after the warm-up (8 would
    # run 0.4 of the layers' FLOPs and the signal read on every step after the warm-up).
    out = engine.generate(PROMPT, steps=20, budget=0.4)
    computed_steps = sum(1 for a in out.report["active_per_step"] if a > 0)
    assert computed_steps == 2
    assert out.report["flops_fraction"] <= 0.4 + 1e-9
    for bad, text in [({"budget": 0.2}, "at least 0.308"), ({"budget": 0.5, "mode": "ras"}, "modes flashdiff, auto and per-patch")]:
        with pytest.raises(flashdiff.Error) as e:
            engine.generate(PROMPT, steps=20, **bad)
        assert text in str(e.value), (bad, str(e.value))


def test_serving_loop(engine):
    a = engine.submit(PROMPT, seed=1, steps=12)
    b = engine.submit("a red circle", seed=2, steps=12, priority=3)
    c = engine.submit("a green triangle", steps=12)
    assert {engine.poll(i) for i in (a, b, c)} == {"pending"}
    with pytest.raises(flashdiff.Error, match="still pending"):
        engine.result(a)
    engine.cancel(c)
    assert engine.poll(c) == "failed"
    with pytest.raises(flashdiff.Error, match="cancel"):
        engine.result(c)
    while engine.step(50) > 0:
        pass
    assert engine.poll(a) == "done" and engine.poll(b) == "done"
    ra = engine.result(a)
    assert ra.report["steps"] == 12
    assert engine.poll(a) == "unknown"
    with pytest.raises(flashdiff.Error, match="unknown"):
        engine.result(a)
    # The loop's result equals a lone generate of the same request.
    assert ra.file == engine.generate(PROMPT, seed=1, steps=12).file
    with pytest.raises(flashdiff.Error):
        engine.cancel(12345)
    with pytest.raises(flashdiff.Error, match="10000"):
        engine.step(60000)


def test_threads_share_an_engine(engine):
    want = engine.generate(PROMPT, seed=5, steps=10).file
    got = []

    def work():
        got.append(engine.generate(PROMPT, seed=5, steps=10).file)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == [want] * 3


@pytest.mark.parametrize("model,kind,ext", [("tinyvideo", "video", "gif"), ("tinyaudio", "audio", "wav")])
def test_other_built_in_models(model, kind, ext):
    e = flashdiff.Engine(model)
    assert e.kind == kind
    o = e.generate("a red circle moving right on a blue background" if kind == "video" else "a high beep then a low hum", steps=14)
    assert o.extension == ext and o.file
    if kind == "video":
        assert o.sample.ndim == 4 and o.sample.shape[-1] == 3
    else:
        assert o.sample.ndim == 2 and o.sample_rate > 0


@pytest.mark.parametrize("model,side", [("tinyflux-l", 64), ("tinyflux-xl", 128)])
def test_the_larger_tinyflux_make_their_images(model, side):
    e = flashdiff.Engine(model)
    assert model in flashdiff.MODELS and e.kind == "image"
    o = e.generate("a red circle top left on a yellow striped background", steps=6)
    assert o.sample.shape == (side, side, 3)


def test_bad_engines():
    with pytest.raises(flashdiff.Error, match="neither a built-in model"):
        flashdiff.Engine("flux")
    with pytest.raises(flashdiff.Error):
        flashdiff.Engine("tinydit", weights="/nonexistent.safetensors")
    with pytest.raises(flashdiff.Error):
        flashdiff.Engine("tinydit", workers=0)


def test_image_requests_are_checked_as_the_http_server_checks_them():
    e = flashdiff.Engine("tinydit")
    assert e.check_image(b'{"prompt": "a red circle", "n": 3, "size": "64x64"}') == (3, 2)
    assert e.check_image('{"prompt": "a red circle"}') == (1, 8)
    with pytest.raises(flashdiff.Error, match=r'"n" 9: must be in 1..=4'):
        e.check_image(b'{"prompt": "a red circle", "n": 9}')
    with pytest.raises(flashdiff.Error, match=r'"id"'):
        e.check_image(b'{"prompt": "a red circle", "id": 2}')
    with pytest.raises(TypeError, match="bytes or str"):
        e.check_image(3)
    ids, scale = e.submit_image(b'{"prompt": "a red circle", "n": 2, "steps": 6, "seed": 4}')
    assert len(ids) == 2 and scale == 8
    for i in ids:
        assert e.wait(i, 10000) == "done"
    one = e.result(ids[0], 1)
    assert one.file[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(one.file[16:20], "big") == 32
    [alone], _ = e.submit_image(b'{"prompt": "a red circle", "steps": 6, "seed": 5}')
    assert e.wait(alone, 10000) == "done"
    assert (e.result(ids[1]).sample == e.result(alone).sample).all(), "image 2 is not seed + 1"
    with pytest.raises(flashdiff.Error, match="scale 0"):
        e.result(ids[0], 0)


def test_engine_settings_of_a_pipeline_are_checked_by_name():
    assert "flux-dev" in flashdiff.PIPELINES and "tinydit" not in flashdiff.PIPELINES
    with pytest.raises(flashdiff.Error, match="needs weights"):
        flashdiff.Engine("flux-dev")
    with pytest.raises(flashdiff.Error, match="size, guidance and dtype"):
        flashdiff.Engine("tinydit", size=(64, 64))
    with pytest.raises(flashdiff.Error, match='device "tpu"'):
        flashdiff.Engine("tinydit", device="tpu")
    with pytest.raises(flashdiff.Error, match="neither a built-in model"):
        flashdiff.Engine("sdxl")
    with pytest.raises(flashdiff.Error, match="dtype"):
        flashdiff.Engine("flux-dev", weights="/nonexistent", dtype="f8")
    with pytest.raises(flashdiff.Error, match="/nonexistent"):
        flashdiff.Engine("flux-dev", weights="/nonexistent")


def test_engine_flops_per_step_are_those_torch_counts_on_tinyflux():
    """The engine's FLOPs of a full TinyFLUX step against FlopCounterMode over diffusers'
    FluxTransformer2DModel on the same folder, less what the engine runs once per request
    instead of every step (the text and pooled-text embedders)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers import FluxTransformer2DModel
    from safetensors import safe_open
    from torch.utils.flop_counter import FlopCounterMode

    root = pathlib.Path(__file__).resolve().parents[2] / "models" / "tinyflux"
    with safe_open(str(root / "text_encoder" / "model.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["config"])
    text, n = meta["max_tokens"], (meta["image"] // meta["patch"]) ** 2
    t = FluxTransformer2DModel.from_pretrained(str(root / "transformer"))
    c = t.config
    d = c.num_attention_heads * c.attention_head_dim
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        t(hidden_states=torch.randn(1, n, c.in_channels),
          encoder_hidden_states=torch.randn(1, text, c.joint_attention_dim),
          pooled_projections=torch.randn(1, c.pooled_projection_dim), timestep=torch.tensor([0.5]),
          img_ids=torch.zeros(n, 3), txt_ids=torch.zeros(text, 3))
    once = 2 * text * c.joint_attention_dim * d + 2 * c.pooled_projection_dim * d + 2 * d * d
    steps = 6
    out = flashdiff.Engine("tinyflux").generate("a red circle left", mode="full", steps=steps, warmup=2)
    assert out.report["flops_counted"] is True
    assert out.report["flops_fraction"] == 1.0
    assert out.report["flops_full"] / steps == pytest.approx(fc.get_total_flops() - once, rel=0.005)
    # Whole-step caching that skips: the FLOPs fraction is under 1 and above the share of
    # steps computed (the signal and every step's conditioning are paid on skipped steps).
    cached = flashdiff.Engine("tinyflux").generate("a red circle left", mode="teacache", cache_threshold=0.5,
                                                     steps=20, max_skip=3)
    r = cached.report
    computed = r["warmup"] + r["whole_steps"]
    assert computed < 20
    assert computed / 20 < r["flops_fraction"] < 1.0
