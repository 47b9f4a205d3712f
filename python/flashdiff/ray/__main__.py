"""``python -m flashdiff.ray``: FlashDiff's HTTP API on Ray Serve, on an embedded local Ray
or on a cluster (``--address``), until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import fields

from . import Settings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m flashdiff.ray",
        description="FlashDiff's image API (as `flashdiff serve --port`) on Ray Serve replicas.",
    )
    p.add_argument("--address", default=None,
                   help="a Ray cluster to join (ray://HOST:10001 or HOST:6379); default: start a local Ray")
    p.add_argument("--host", default="127.0.0.1", help="where Serve's HTTP proxy listens")
    p.add_argument("--port", type=int, default=8000)
    defaults = Settings()
    for f in fields(Settings):
        d = getattr(defaults, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None,
                       help=f"default {d}" + (" (none: autoscale)" if f.name == "num_replicas" else ""))
    a = p.parse_args(argv)
    given = {f.name: getattr(a, f.name) for f in fields(Settings) if getattr(a, f.name) is not None}
    try:
        settings = Settings.from_args(given)
    except ValueError as e:
        p.error(str(e))

    import ray
    from ray import serve

    from . import build_app

    if a.address:
        ray.init(address=a.address, logging_level="WARNING")
    else:
        ray.init(include_dashboard=False, logging_level="WARNING")
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(build_app(settings), name="flashdiff", route_prefix="/")
    print(f"flashdiff on Ray Serve: http://{a.host}:{a.port}/v1/images/generations "
          f"(model {settings.model}); Ctrl-C stops it", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
