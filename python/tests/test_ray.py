"""flashdiff.ray on a local Ray cluster started here (127.0.0.1 only): two replicas share
the load, outputs equal one engine's, a replica killed mid-load loses nothing, the OpenAI
SDK works, bad requests get `flashdiff serve`'s own 400s, a full cluster answers 429.

Skipped when Ray Serve is not installed, unless FLASHDIFF_REQUIRE_RAY=1 (as `.ci/run` sets),
which also requires the `flashdiff` binary for the comparison with `flashdiff serve`."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import flashdiff

REQUIRED = os.environ.get("FLASHDIFF_REQUIRE_RAY") == "1"
if not REQUIRED:
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install './python[ray]')")

import ray  # noqa: E402
from ray import serve  # noqa: E402

from flashdiff.ray import Settings, build_app, image_bodies  # noqa: E402

PROMPTS = [
    "a red circle left and a blue square right",
    "a green triangle on a white background",
    "a yellow cross top and a purple circle bottom",
    "an orange square center",
]
STEPS = 16
MAX_QUEUE = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, path: str, body: bytes, timeout: float = 120):
    req = urllib.request.Request(url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null"), dict(e.headers)
        except ValueError:
            return e.code, raw.decode(errors="replace"), dict(e.headers)


def body(i: int, **extra) -> bytes:
    prompt = PROMPTS[i % len(PROMPTS)].replace("an orange", "a orange")
    return json.dumps({"prompt": prompt, "seed": 1000 + i, "steps": STEPS, **extra}).encode()


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR",
             object_store_memory=80 * 1024 * 1024, _node_ip_address="127.0.0.1")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({"num_replicas": 2, "num_cpus": 0.5, "threads": 1, "max_queue": MAX_QUEUE,
                         "max_ongoing_requests": 8, "retry_for_s": 60}),
              name="flashdiff", route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    """One engine in this process: the image each body should give."""
    e = flashdiff.Engine("tinydit")
    memo = {}

    def image(b: bytes) -> str:
        if b not in memo:
            [rid], scale = e.submit_image(b)
            while e.wait(rid, 1000) == "pending":
                pass
            memo[b] = base64.b64encode(e.result(rid, scale).file).decode()
        return memo[b]

    return image


def replicas_ready(n: int, within: float = 90) -> list:
    """The replicas' identities once `n` answer, waiting for a restarted one."""
    h = serve.get_deployment_handle("Replica", app_name="flashdiff")
    end = time.monotonic() + within
    seen = {}
    while time.monotonic() < end:
        try:
            r = h.identity.remote().result(timeout_s=10)
            seen[r["replica"]] = r
        except Exception:
            time.sleep(0.5)
            continue
        st = serve.status().applications["flashdiff"].deployments["Replica"]
        running = st.replica_states.get("RUNNING", 0)
        alive = {k: v for k, v in seen.items() if _alive(v["pid"])}
        if running == n and len(alive) == n:
            return list(alive.values())
        seen = alive
    raise AssertionError(f"{n} replicas did not come up within {within} s: {seen}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def test_settings_refuse_bad_values_by_name():
    with pytest.raises(ValueError, match="replicas"):
        Settings.from_args({"replicas": "2"})
    with pytest.raises(ValueError, match="max_queue"):
        Settings.from_args({"max_queue": "0"})
    with pytest.raises(ValueError, match="model"):
        Settings.from_args({"model": "sdxl"})
    with pytest.raises(ValueError, match="min_replicas"):
        Settings.from_args({"num_replicas": "none", "min_replicas": "3", "max_replicas": "2"})
    s = Settings.from_args({"num_replicas": "none", "max_replicas": "3", "retry_for_s": "2.5"})
    assert (s.num_replicas, s.max_replicas, s.retry_for_s) == (None, 3, 2.5)


def test_image_bodies_seed_each_image_as_the_server_does():
    b = json.dumps({"prompt": "a red circle", "n": 3, "seed": 2**64 - 2}).encode()
    seeds = [json.loads(x)["seed"] for x in image_bodies(b, 3)]
    assert seeds == [2**64 - 2, 2**64 - 1, 0]
    assert all(json.loads(x)["n"] == 1 for x in image_bodies(b, 3))
    no_seed = json.dumps({"prompt": "a red circle", "n": 2}).encode()
    assert [json.loads(x)["seed"] for x in image_bodies(no_seed, 2)] == [0, 1]


def test_two_replicas_serve_40_requests_with_one_engines_outputs(cluster, reference):
    ready = replicas_ready(2)
    bodies = [body(i) for i in range(40)]
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda b: post(cluster, "/v1/images/generations", b), bodies))
    assert [a[0] for a in answers] == [200] * 40, [a[1] for a in answers if a[0] != 200][:3]
    used = {a[1]["flashdiff"]["replicas"][0] for a in answers}
    assert used == {r["replica"] for r in ready}, f"requests reached {used}, replicas {ready}"
    for b, (_, a, _) in zip(bodies, answers):
        assert a["data"][0]["b64_json"] == reference(b), f"the image of {b!r} differs from one engine's"


def test_n_images_take_consecutive_seeds(cluster, reference):
    status, a, _ = post(cluster, "/v1/images/generations", body(7, n=2))
    assert status == 200, a
    got = [d["b64_json"] for d in a["data"]]
    assert got == [reference(body(7)), reference(body(7, seed=1008))]


def test_openai_sdk_against_the_ingress(cluster):
    openai = pytest.importorskip("openai") if not REQUIRED else __import__("openai")
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.images.generate(model="tinydit", prompt="a blue square center",
                               response_format="b64_json", size="128x128", n=1)
    png = base64.b64decode(r.data[0].b64_json)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 128 and int.from_bytes(png[20:24], "big") == 128
    with pytest.raises(openai.BadRequestError, match="size"):
        client.images.generate(model="tinydit", prompt="a blue square", size="100x100")


def flashdiff_bin():
    given = os.environ.get("FLASHDIFF_BIN")
    if given:
        return given
    root = Path(__file__).resolve().parents[2]
    for p in [root / "target" / "debug" / "flashdiff", root / "target" / "release" / "flashdiff"]:
        if p.exists():
            return str(p)
    return shutil.which("flashdiff")


MALFORMED = [
    b"not json",
    b"[1, 2]",
    b'{"prompt": "a red circle", "steps": "many"}',
    b'{"prompt": "a red circle", "colour": "red"}',
    b'{"prompt": "a red circle", "n": 9}',
    b'{"prompt": "a red circle", "size": "100x100"}',
    b'{"prompt": "a red circle", "response_format": "url"}',
    b'{"prompt": "   "}',
    b'{"steps": 10}',
    b'{"prompt": "a red circle", "id": 4}',
    b'{"prompt": "a red zebra"}',
    b'{"prompt": "a red circle", "steps": 4, "warmup": 9}',
    b'{"prompt": "a red circle", "model": "flux-dev"}',
    b'{"prompt": "' + b"a " * 40000 + b'circle"}',
]


@pytest.fixture(scope="module")
def server():
    exe = flashdiff_bin()
    if exe is None:
        if REQUIRED:
            raise AssertionError("FLASHDIFF_REQUIRE_RAY=1 but no flashdiff binary (set FLASHDIFF_BIN)")
        pytest.skip("no flashdiff binary to compare with (build it, or set FLASHDIFF_BIN)")
    port = free_port()
    p = subprocess.Popen([exe, "serve", "--port", str(port), "--ephemeral"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            if time.monotonic() > end or p.poll() is not None:
                p.kill()
                raise AssertionError("flashdiff serve did not start")
            time.sleep(0.2)
    yield url
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()


@pytest.mark.parametrize("path", ["/v1/images/generations", "/v1/jobs"])
def test_malformed_requests_get_flashdiff_serves_400(cluster, server, path):
    for b in MALFORMED:
        ours = post(cluster, path, b)[:2]
        theirs = post(server, path, b)[:2]
        assert ours == theirs, f"{b!r}: Ray answered {ours}, flashdiff serve {theirs}"
        assert ours[0] in (400, 413) and ours[1]["error"]["type"] == "invalid_request_error", ours
    ours, theirs = [(s, b) for s, b, _ in (post(u, "/v1/nowhere", b"{}") for u in (cluster, server))]
    assert ours == theirs == (404, {"error": {"message": "no such endpoint", "type": "not_found"}})


def test_same_image_as_flashdiff_serve(cluster, server):
    for b in [body(3), json.dumps({"prompt": "a red circle top", "size": "64x64"}).encode()]:
        ours, theirs = post(cluster, "/v1/images/generations", b), post(server, "/v1/images/generations", b)
        assert ours[0] == theirs[0] == 200
        assert ours[1]["data"] == theirs[1]["data"], f"{b!r}: the image differs from flashdiff serve's"


def test_jobs_api(cluster, reference):
    status, a, headers = post(cluster, "/v1/jobs", body(11))
    assert status == 202 and a["state"] == "queued", a
    assert headers.get("location") == f"/v1/jobs/{a['id']}" or headers.get("Location") == f"/v1/jobs/{a['id']}"
    end = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"{cluster}/v1/jobs/{a['id']}", timeout=30) as r:
            job = json.load(r)
        if job["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert job["state"] == "succeeded", job
    assert job["b64_json"] == reference(body(11))
    with urllib.request.urlopen(f"{cluster}/v1/jobs/{a['id']}/events", timeout=30) as r:
        text = r.read().decode()
    assert "event: done" in text and '"succeeded"' in text
    req = urllib.request.Request(f"{cluster}/v1/jobs/{a['id']}", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 409
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{cluster}/v1/jobs/999999", timeout=30)
    assert e.value.code == 404


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_cancelled_jobs_end_cancelled_and_free_their_place(cluster):
    ids = []
    for i in range(5):
        status, a, _ = post(cluster, "/v1/jobs", body(200 + i, steps=200))
        assert status == 202, a
        req = urllib.request.Request(f"{cluster}/v1/jobs/{a['id']}", method="DELETE")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 202 and json.load(r)["state"] == "cancelling"
        ids.append(a["id"])
    end = time.monotonic() + 60
    states = {}
    while time.monotonic() < end:
        for i in ids:
            with urllib.request.urlopen(f"{cluster}/v1/jobs/{i}", timeout=30) as r:
                states[i] = json.load(r)["state"]
        if set(states.values()) == {"cancelled"} and metric(cluster, "flashdiff_ray_open") == 0:
            break
        time.sleep(0.1)
    assert set(states.values()) == {"cancelled"}, states
    assert metric(cluster, "flashdiff_ray_open") == 0, "cancelled jobs still hold places in the queue"


def test_a_full_cluster_answers_429_not_an_unbounded_queue(cluster):
    replicas_ready(2)
    slow = [body(i, steps=60) for i in range(MAX_QUEUE + 20)]
    with ThreadPoolExecutor(len(slow)) as pool:
        answers = list(pool.map(lambda b: post(cluster, "/v1/images/generations", b), slow))
    codes = [a[0] for a in answers]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) >= 1, "60 requests at once against a queue of 40: none was refused"
    refused = next(a for a in answers if a[0] == 429)
    assert refused[1]["error"]["type"] == "rate_limit_error"
    assert {k.lower(): v for k, v in refused[2].items()}.get("retry-after") == "1"


def test_a_replica_killed_mid_load_loses_no_request(cluster, reference):
    ready = replicas_ready(2)
    bodies = [body(100 + i) for i in range(40)]
    with ThreadPoolExecutor(40) as pool:
        futures = [pool.submit(post, cluster, "/v1/images/generations", b) for b in bodies]
        h = serve.get_deployment_handle("Replica", app_name="flashdiff")
        victim = None
        end = time.monotonic() + 60
        while victim is None and time.monotonic() < end:
            for _ in range(4):
                r = h.identity.remote().result(timeout_s=10)
                if r["pending"] > 0:
                    victim = r
                    break
            time.sleep(0.05)
        assert victim is not None, "no replica had work in flight"
        os.kill(victim["pid"], signal.SIGKILL)
        answers = [f.result() for f in futures]
    assert [a[0] for a in answers] == [200] * 40, [a[1] for a in answers if a[0] != 200][:3]
    for b, (_, a, _) in zip(bodies, answers):
        assert a["data"][0]["b64_json"] == reference(b)
    retried = metric(cluster, "flashdiff_ray_retried_total")
    assert retried >= 1, "the killed replica's requests were not sent again"
    assert ready  # the other replica was serving throughout
