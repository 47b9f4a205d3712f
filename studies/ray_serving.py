"""The cost of the Ray hop: the same requests through `flashdiff serve --port` and through
flashdiff.ray with 1 and 2 replicas, on this machine.

    python studies/ray_serving.py --flashdiff target/release/flashdiff \
        --requests 200 --concurrency 16 --rounds 3 --out docs/ray/serving.json

Each case starts its server, sends a few warm-up requests, then `--requests` image requests
(the built-in model, its default 50 steps, seeds 0..N-1, four prompts in turn) from
`--concurrency` client threads, and reports each request's latency (p50, p99, client side)
and the throughput (requests over the wall time from the first send to the last answer).
The cases run in turn `--rounds` times; each row is the case's median round by throughput.
Every answer must be 200; the images of a case are checked against the first case's.
Ray runs locally on 127.0.0.1 (an embedded cluster per Ray case).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPTS = [
    "a red circle left and a blue square right",
    "a green triangle on a white background",
    "a yellow cross top and a purple circle bottom",
    "a orange square center",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes):
    req = urllib.request.Request(url + "/v1/images/generations", data=body, method="POST")
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
        status = r.status
    return status, time.perf_counter() - t, out["data"][0]["b64_json"]


def load(url: str, n: int, concurrency: int):
    bodies = [json.dumps({"prompt": PROMPTS[i % 4], "seed": i}).encode() for i in range(n)]
    for b in bodies[:4]:  # warm-up
        post(url, b)
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda b: post(url, b), bodies))
    wall = time.perf_counter() - t
    assert all(a[0] == 200 for a in answers)
    lat = sorted(a[1] for a in answers)
    return {
        "requests": n,
        "concurrency": concurrency,
        "p50_s": statistics.median(lat),
        "p99_s": lat[min(n - 1, int(round(0.99 * (n - 1))))],
        "throughput_rps": n / wall,
        "wall_s": wall,
    }, [a[2] for a in answers]


def wait_up(url: str, within: float = 120):
    end = time.monotonic() + within
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            return
        except OSError:
            if time.monotonic() > end:
                raise SystemExit(f"{url} did not come up")
            time.sleep(0.2)


def serve_case(exe: str, workers: int, n: int, c: int):
    port = free_port()
    p = subprocess.Popen([exe, "serve", "--port", str(port), "--ephemeral", "--workers", str(workers),
                          "--max-queue", str(max(256, n))],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        return load(url, n, c)
    finally:
        p.terminate()
        p.wait(60)


def ray_case(replicas: int, threads, n: int, c: int):
    import ray
    from ray import serve

    from flashdiff.ray import build_app

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", include_dashboard=False, logging_level="ERROR",
             object_store_memory=100 * 1024 * 1024, _node_ip_address="127.0.0.1")
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        settings = {"num_replicas": replicas, "num_cpus": 2 / replicas, "max_queue": max(256, n),
                    "max_ongoing_requests": 16}
        if threads:
            settings["threads"] = threads
        serve.run(build_app(settings), name="flashdiff", route_prefix="/")
        return load(f"http://127.0.0.1:{port}", n, c)
    finally:
        serve.shutdown()
        ray.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashdiff", required=True, help="the flashdiff binary (a release build)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3,
                    help="the cases run in turn this many times; each row is the case's median round")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cases = [
        ("flashdiff serve --workers 1", lambda: serve_case(a.flashdiff, 1, a.requests, a.concurrency)),
        ("flashdiff serve --workers 2", lambda: serve_case(a.flashdiff, 2, a.requests, a.concurrency)),
        ("Ray, 1 replica (1 worker)", lambda: ray_case(1, None, a.requests, a.concurrency)),
        ("Ray, 2 replicas (1 worker, 1 thread each)", lambda: ray_case(2, 1, a.requests, a.concurrency)),
    ]
    runs = {name: [] for name, _ in cases}
    first = None
    for k in range(a.rounds):
        for name, run in cases:
            r, images = run()
            same = None if first is None else images == first
            first = first or images
            runs[name].append({**r, "images_equal_first_case": same})
            print(f"round {k + 1}, {name}: p50 {r['p50_s']*1000:.0f} ms, p99 {r['p99_s']*1000:.0f} ms, "
                  f"{r['throughput_rps']:.2f} req/s" + ("" if same is None else f", images equal: {same}"),
                  flush=True)
    rows = []
    for name, rs in runs.items():
        med = sorted(rs, key=lambda r: r["throughput_rps"])[len(rs) // 2]
        rows.append({"case": name, **med, "rounds": rs,
                     "throughput_range": [min(r["throughput_rps"] for r in rs), max(r["throughput_rps"] for r in rs)]})
    print("\n| case | p50 | p99 | throughput (range over rounds) |\n| --- | --- | --- | --- |")
    for r in rows:
        lo, hi = r["throughput_range"]
        print(f"| {r['case']} | {r['p50_s']*1000:.0f} ms | {r['p99_s']*1000:.0f} ms | "
              f"{r['throughput_rps']:.2f} req/s ({lo:.2f}-{hi:.2f}) |")
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "python": sys.version.split()[0]}, f, indent=1)


if __name__ == "__main__":
    main()
