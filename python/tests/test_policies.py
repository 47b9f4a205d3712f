"""The policies from Python give what the Rust crates give on the same inputs
(data/policy_cases.json, which tests/tests/python_cases.rs recomputes from the crates), and
bad input raises flashdiff.Error with the Rust error's text."""

import json
import pathlib
import threading

import numpy as np
import pytest

import flashdiff

CASES = json.loads((pathlib.Path(__file__).parent / "data" / "policy_cases.json").read_text())


@pytest.mark.parametrize("case", CASES["partitions"], ids=lambda c: "x".join(map(str, c["grid"])))
def test_partitions_match_rust(case):
    f, h, w = case["grid"]
    sal = np.array(case["saliency"], dtype=np.float32)
    sal = sal.reshape((h, w) if f == 1 else (f, h, w))
    layout = flashdiff.partition_saliency(sal, case["patches"])
    assert layout.patches == case["patches"]
    assert layout.grid == (f, h, w)
    assert layout.patch_of.dtype == np.uint32
    assert layout.patch_of.tolist() == case["saliency_patch_of"]
    sizes = np.bincount(layout.patch_of, minlength=layout.patches)
    assert sizes.tolist() == layout.sizes().tolist()
    for p in range(layout.patches):
        assert np.all(layout.patch_of[layout.patch_tokens(p)] == p)
    uni = flashdiff.partition_uniform([f, h, w], case["patches"])
    assert uni.patch_of.tolist() == case["uniform_patch_of"]


def test_saliency_map_matches_rust():
    (case,) = CASES["saliency_maps"]
    words = flashdiff.split_words(case["prompt"])
    assert words == case["words"]
    mask = flashdiff.salient_mask(words)
    assert mask.tolist() == case["salient"]
    attn = np.array(case["attn"], dtype=np.float32).reshape(case["tokens"], len(words))
    s = flashdiff.saliency_map(attn, mask)
    assert s.dtype == np.float32
    np.testing.assert_array_equal(s, np.array(case["saliency"], dtype=np.float32))
    # A float64, Fortran-ordered input is converted, and gives the same map.
    s64 = flashdiff.saliency_map(np.asfortranarray(attn.astype(np.float64)), mask)
    np.testing.assert_array_equal(s64, s)


@pytest.mark.parametrize("case", CASES["gates"], ids=lambda c: f"R{c['patches']}-eps{c['epsilon']}")
def test_gate_decisions_match_rust(case):
    g = flashdiff.Gate(case["patches"], epsilon=case["epsilon"], eta=case["eta"], max_skip=case["max_skip"])
    assert g.config[2] == case["max_skip"]
    for t, imp in enumerate(case["importance"]):
        active, stats = g.decide()
        assert active.tolist() == case["decisions"][t], f"step {t}"
        assert stats == case["stats"][t], f"step {t}"
        g.observe(np.array(imp, dtype=np.float32))
    assert g.steps == len(case["importance"])
    np.testing.assert_array_equal(g.weights(), np.array(case["weights"], dtype=np.float32))


def test_schedule_matches_rust():
    case = CASES["schedule"]
    s = flashdiff.Scheduler(workers=case["workers"], record_events=True)
    reqs = {r["id"]: r for r in case["requests"]}
    for r in case["requests"]:
        s.admit(r["id"], priority=r["priority"], warmup_cost=r["warmup_cost"])
    log = []
    idle = 0
    while idle < 2:
        any_work = False
        for w in range(case["workers"]):
            a = s.dispatch(w)
            if a is None:
                continue
            any_work = True
            req, step, mono = a["tag"]
            log.append(["dispatch", w, req, step, mono])
            c = s.complete(w, a["tag"])
            patches = [tuple(p) for p in reqs.get(c[1], {"patches": []})["patches"]] if len(c) > 1 else []
            if c[0] == "warmup_done":
                log.append(["warmup_done", c[1]])
                s.submit_step(c[1], 1, patches)
            elif c[0] == "step_done":
                log.append(["step_done", c[1], c[2]])
                if c[2] < case["steps"]:
                    s.submit_step(c[1], c[2] + 1, patches)
                else:
                    s.finish(c[1])
            else:
                log.append(list(c))
        idle = 0 if any_work else idle + 1
    assert log == case["log"]
    events = s.take_events()
    kinds = {e["event"] for e in events}
    assert {"admitted", "ready", "step_opened", "dispatched", "completed", "request_ended"} <= kinds
    assert sum(e["event"] == "request_ended" for e in events) == len(reqs)
    assert s.load()["requests"] == 0


def test_bad_input_raises_the_rust_error():
    with pytest.raises(flashdiff.Error, match="patch"):
        flashdiff.partition_saliency(np.ones((4, 4), np.float32), 0)
    with pytest.raises(flashdiff.Error, match="dimensions"):
        flashdiff.partition_saliency(np.ones(16, np.float32), 2)
    with pytest.raises(flashdiff.Error, match="attn"):
        flashdiff.saliency_map(np.ones((4, 3), np.float32), np.array([True, False]))
    with pytest.raises(flashdiff.Error):
        flashdiff.saliency_map(np.full((2, 2), np.nan, np.float32), np.array([True, True]))
    with pytest.raises(flashdiff.Error, match="out of range"):
        flashdiff.partition_uniform([4, 4], 2).patch_tokens(2)
    with pytest.raises(flashdiff.Error):
        flashdiff.Gate(0)
    g = flashdiff.Gate(3)
    with pytest.raises(flashdiff.Error):
        g.observe(np.ones(2, np.float32))
    with pytest.raises(flashdiff.Error):
        g.set_epsilon(2.0)
    s = flashdiff.Scheduler(workers=1)
    with pytest.raises(flashdiff.Error, match="not admitted"):
        s.submit_step(9, 1, [(0, 1.0)])
    with pytest.raises(flashdiff.Error):
        s.dispatch(5)
    s.admit(1)
    with pytest.raises(flashdiff.Error):
        s.admit(1)
    assert issubclass(flashdiff.Error, ValueError)


def test_policies_from_threads():
    sal = np.random.default_rng(0).random((16, 16), dtype=np.float32)
    want = flashdiff.partition_saliency(sal, 8).patch_of
    got = []

    def work():
        for _ in range(20):
            got.append(flashdiff.partition_saliency(sal, 8).patch_of)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(got) == 80 and all(np.array_equal(g, want) for g in got)


def test_budget_skips_quiet_steps_and_runs_the_moving_patch():
    b = flashdiff.Budget(3, epsilon=0.3, share=1.0, max_skip=100)
    first = b.decide()
    assert first.tolist() == [True, True, True]  # nothing reported yet
    b.ran(first)
    b.observe(np.array([0.1, 0.1, 0.1], dtype=np.float32))
    quiet = b.decide()
    assert not quiet.any()  # forecast whole
    b.ran(quiet)
    # the latent's change: mean 0.1 + mean 0.217 = 0.317 >= 0.3: computed, the patches at 0.3 run
    b.observe(np.array([0.35, 0.05, 0.25], dtype=np.float32))
    assert b.level() == pytest.approx(0.95 / 3, rel=1e-6)
    assert b.decide().tolist() == [True, False, True]
    np.testing.assert_allclose(b.accumulated(), [0.45, 0.15, 0.35], rtol=1e-6)
    # weighted by the signal, a quiet patch's large change counts for its share
    w = flashdiff.Budget(3, epsilon=0.3, share=0.0)
    w.ran(w.decide())
    w.observe(np.array([0.5, 0.5, 0.01], dtype=np.float32), np.array([1, 1, 98], dtype=np.float32))
    assert w.level() == pytest.approx(0.25, rel=1e-6) and not w.decide().any()
    whole = flashdiff.Budget(3, epsilon=0.3, share=0.0)
    whole.ran(whole.decide())
    whole.observe(np.array([0.4, 0.0, 0.0], dtype=np.float32))
    assert not whole.decide().any()  # one patch at 0.4: the latent 0.13, under 2 x 0.3
    whole.ran(whole.decide())
    whole.observe(np.array([0.2, 0.2, 0.2], dtype=np.float32))
    assert whole.decide().tolist() == [True, True, True]  # share 0: the step runs whole


def test_budget_refuses_bad_input_with_the_rust_text():
    with pytest.raises(flashdiff.Error, match="share 2 must be a finite number in"):
        flashdiff.Budget(2, share=2.0)
    b = flashdiff.Budget(2)
    with pytest.raises(flashdiff.Error, match="change of patch 1 is -1"):
        b.observe(np.array([0.1, -1.0], dtype=np.float32))
    with pytest.raises(flashdiff.Error, match="signal of patch 0 is -2"):
        b.observe(np.array([0.1, 0.1], dtype=np.float32), np.array([-2.0, 1.0], dtype=np.float32))
    with pytest.raises(flashdiff.Error, match="expected one per patch"):
        b.ran(np.array([True], dtype=np.bool_))


def test_relative_change_is_each_patchs_l1_ratio():
    rng = np.random.default_rng(3)
    before = rng.uniform(0.1, 2.0, size=(6, 4)).astype(np.float32)
    now = before + rng.normal(size=(6, 4)).astype(np.float32)
    patch_of = np.array([0, 1, 1, 0, 2, 2])
    got = flashdiff.relative_change(now, before, patch_of, 3)
    for p in range(3):
        rows = patch_of == p
        want = np.abs(now[rows] - before[rows]).sum() / np.abs(before[rows]).sum()
        assert got[p] == pytest.approx(want, rel=1e-5)


def test_image_metrics_are_the_benchs():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.2, 0.8, (32, 32, 3)).astype(np.float32)
    assert flashdiff.psnr(a, a) == float("inf") and flashdiff.ssim(a, a) == pytest.approx(1.0)
    # An offset of 0.1 everywhere: MSE 0.01, 20 dB.
    assert flashdiff.psnr(a, a + 0.1) == pytest.approx(20.0, abs=1e-4)
    assert flashdiff.ssim(a, rng.uniform(0, 1, a.shape)) < 0.5
    with pytest.raises(flashdiff.Error, match="RGB images of one shape"):
        flashdiff.psnr(a, a[:16])
    with pytest.raises(flashdiff.Error, match="RGB images"):
        flashdiff.ssim(a[..., 0], a[..., 0])
