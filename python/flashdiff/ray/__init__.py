"""FlashDiff on Ray Serve: replicas of one engine each, behind the HTTP API of
``flashdiff serve --port``.

Two deployments make the application:

* :class:`Replica` holds one :class:`flashdiff.Engine` (its own worker threads) over the
  configured model. Requests that reach a replica together run together: the engine admits
  each between scheduling rounds, as ``flashdiff serve`` does.
* :class:`Ingress` speaks ``POST /v1/images/generations`` (OpenAI's image API), the job
  endpoints ``POST /v1/jobs``, ``GET|DELETE /v1/jobs/{id}``, ``GET /v1/jobs/{id}/events``,
  ``GET /healthz`` and ``GET /metrics``, with the server's request schema, errors and status
  codes: a body is checked by the server's own rules (``Engine.check_image``), so a bad
  field gets the same 400 and text. It sends each request to a replica through Serve's
  router, which picks the less loaded of two replicas by their queues. Each image's request
  is retried from its start on another replica when its replica dies (same body, so the same
  seed and the same image); the client sees one answer.

Back-pressure: past ``max_queue`` unfinished images in the ingress, or when Serve's own
queue (``max_queued_requests``) is full, a request gets 429 with ``Retry-After``, as
``flashdiff serve`` answers past ``--max-queue``; when no replica answers within the retry
window it gets 503. Nothing waits in an unbounded queue.

Start it with ``python -m flashdiff.ray`` (an embedded local Ray, or ``--address`` of a
cluster), or ``serve run flashdiff.ray:app`` (the defaults) or
``serve run flashdiff.ray:build_app model=tinydit num_replicas=2``. Settings
(:class:`Settings`) come from the command line, the app builder's arguments or a Serve
config file.
"""


import asyncio
import base64
import itertools
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

try:
    import ray
    from ray import serve
    from ray.serve.exceptions import BackPressureError
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"flashdiff.ray needs Ray Serve ({e}); install it with: pip install \"flashdiff[ray]\" "
        "(from a clone: pip install \"./python[ray]\")"
    ) from e

import flashdiff

__all__ = ["Settings", "Replica", "Ingress", "build_app", "image_bodies", "app"]

log = logging.getLogger("flashdiff.ray")


@dataclass
class Settings:
    """The application's settings: the model, the replicas and the queue bounds."""

    model: str = "tinydit"
    """A built-in model (``flashdiff.MODELS``) or a real pipeline (``flashdiff.PIPELINES``)."""
    weights: Optional[str] = None
    """A pipeline's diffusers folder, or a TinyDiT-family safetensors file, at this path on
    every node (None: a built-in model's shipped weights)."""
    device: str = "cpu"
    """``cpu``, or ``cuda`` (a wheel built with the ``cuda`` feature; give ``num_gpus``)."""
    size: Optional[str] = None
    """A pipeline's image size, ``HEIGHTxWIDTH`` (None: the pipeline's default)."""
    guidance: Optional[float] = None
    """A pipeline's guidance (None: its default)."""
    dtype: Optional[str] = None
    """A pipeline's dtype, ``f32`` or ``bf16`` (None: f32)."""
    workers: int = 1
    """The engine's worker threads in each replica."""
    threads: Optional[int] = None
    """Compute threads in each replica's process (``RAYON_NUM_THREADS``; None: Ray's
    default for an actor of ``num_cpus``)."""
    num_cpus: float = 1.0
    """CPUs Ray reserves for each replica."""
    num_gpus: float = 0.0
    """GPUs Ray reserves for each replica."""
    num_replicas: Optional[int] = 1
    """A fixed number of replicas; None to autoscale between the bounds below."""
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 4.0
    """Autoscaling's target of requests in flight per replica."""
    max_ongoing_requests: int = 8
    """Requests one replica runs at once (the engine batches them); more wait in Serve's
    queue."""
    max_queued_requests: int = 256
    """Requests waiting in Serve's queue for a replica; past it, 429."""
    max_queue: int = 256
    """Unfinished images in the ingress (as ``flashdiff serve --max-queue``); past it, 429."""
    max_body: int = 65536
    """Largest request body in bytes (as ``--max-body``); past it, 413."""
    retry_for_s: float = 60.0
    """How long an image is retried on other replicas after its replica died or none
    answered; then 503."""

    @classmethod
    def from_args(cls, args: Dict[str, Any]) -> "Settings":
        """Settings from ``key=value`` strings (``serve run``'s app arguments) or values;
        an unknown key or a bad value raises ``ValueError`` naming it."""
        known = {f.name: f for f in fields(cls)}
        out = cls()
        for k, v in args.items():
            if k not in known:
                raise ValueError(f"{k!r}: not a setting of flashdiff.ray ({', '.join(known)})")
            default = getattr(out, k)
            try:
                setattr(out, k, _coerce(k, v, default))
            except ValueError as e:
                raise ValueError(f"{k}={v!r}: {e}") from None
        out.check()
        return out

    def check(self) -> None:
        """Raises ``ValueError`` naming the first setting out of its range."""
        if self.model not in flashdiff.MODELS and self.model not in flashdiff.PIPELINES:
            raise ValueError(f"model {self.model!r}: neither a built-in model ({', '.join(flashdiff.MODELS)}) "
                             f"nor a pipeline ({', '.join(flashdiff.PIPELINES)})")
        if self.model in flashdiff.PIPELINES and not self.weights:
            raise ValueError(f"model {self.model!r}: a pipeline needs weights (its diffusers folder on every node)")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device {self.device!r}: cpu or cuda")
        self.size_pair()
        for name, lo in [("workers", 1), ("max_ongoing_requests", 1), ("max_queued_requests", 1),
                         ("max_queue", 1), ("max_body", 64), ("min_replicas", 0), ("max_replicas", 1)]:
            if getattr(self, name) < lo:
                raise ValueError(f"{name} {getattr(self, name)}: must be at least {lo}")
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ValueError(f"num_replicas {self.num_replicas}: must be at least 1 (or None to autoscale)")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads {self.threads}: must be at least 1")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must not be negative")
        if not self.target_ongoing_requests > 0 or not self.retry_for_s >= 0:
            raise ValueError("target_ongoing_requests must be positive and retry_for_s not negative")


    def size_pair(self) -> Optional[Tuple[int, int]]:
        """``size`` as (height, width)."""
        if self.size is None:
            return None
        try:
            h, w = (int(x) for x in str(self.size).lower().split("x"))
        except ValueError:
            raise ValueError(f"size {self.size!r}: HEIGHTxWIDTH, e.g. 1024x1024") from None
        return h, w


OPTIONAL = ("weights", "threads", "num_replicas", "size", "guidance", "dtype")


def _coerce(name: str, v: Any, default: Any) -> Any:
    if not isinstance(v, str):
        return v
    if v.lower() in ("none", "null", ""):
        if name in OPTIONAL:
            return None
        raise ValueError("needs a value")
    if name in ("model", "weights", "device", "size", "dtype"):
        return v
    try:
        if isinstance(default, float) or name in ("num_cpus", "num_gpus", "target_ongoing_requests", "retry_for_s", "guidance"):
            return float(v)
        return int(v)
    except ValueError:
        raise ValueError("expected a number" if name in ("guidance",) or isinstance(default, float)
                         else "expected a whole number") from None


def _error(status: int, kind: str, message: str, headers: Optional[Dict[str, str]] = None) -> JSONResponse:
    """The server's error body: ``{"error": {"message", "type"}}``."""
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)


def _replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (tests calling the class directly)
        return f"pid-{os.getpid()}"


@serve.deployment
class Replica:
    """One engine over the model; runs the images it is sent."""

    def __init__(self, settings: Dict[str, Any]):
        s = Settings(**settings)
        self._engine = flashdiff.Engine(s.model, s.weights, s.workers, s.device, s.size_pair(),
                                        s.guidance, s.dtype)
        self._name = _replica_name()

    def identity(self) -> Dict[str, Any]:
        """This replica's name and process id."""
        return {"replica": self._name, "pid": os.getpid(), "pending": self._engine.pending}

    def check(self, body: bytes) -> Dict[str, Any]:
        """A body checked as the server checks it: ``{"n", "scale"}`` or ``{"error"}``."""
        try:
            n, scale = self._engine.check_image(body)
        except flashdiff.Error as e:
            return {"error": str(e)}
        return {"n": n, "scale": scale}

    async def image(self, body: bytes) -> Dict[str, Any]:
        """The one image of the request ``body``: ``{"b64_json", "report", "replica"}``, or
        ``{"error", "status"}`` when the request is refused (400) or its generation fails
        (422). Cancelling the call cancels the request in the engine."""
        try:
            [rid], scale = self._engine.submit_image(body)
        except (flashdiff.Error, ValueError) as e:
            return {"error": str(e), "status": 400}
        try:
            while await asyncio.to_thread(self._engine.wait, rid, 200) == "pending":
                pass
        except asyncio.CancelledError:
            try:
                self._engine.cancel(rid)
            except flashdiff.Error:
                pass
            raise
        try:
            out = self._engine.result(rid, scale)
        except flashdiff.Error as e:
            return {"error": str(e), "status": 422, "replica": self._name}
        return {
            "b64_json": base64.b64encode(out.file).decode(),
            "report": out.report,
            "replica": self._name,
        }


def image_bodies(body: bytes, n: int) -> List[bytes]:
    """The request of each of ``n`` images of a checked body: image ``i`` at seed
    ``seed + i`` (wrapping at 2^64, the server's default seed 0 when none is given), one
    image each, as ``flashdiff serve`` admits them."""
    if n == 1:
        return [body]
    f = json.loads(body)
    seed = int(f.get("seed") or 0)
    return [json.dumps({**f, "n": 1, "seed": (seed + i) % 2**64}).encode() for i in range(n)]


api = FastAPI(title="FlashDiff on Ray Serve")


@api.exception_handler(404)
async def _no_endpoint(request: Request, exc: Exception) -> JSONResponse:
    """An unknown path gets the server's JSON 404."""
    return _error(404, "not_found", "no such endpoint")


@dataclass
class _Job:
    created: int
    state: str = "queued"
    report: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    b64_json: Optional[str] = None
    replica: Optional[str] = None
    task: Optional[asyncio.Task] = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


@serve.deployment
@serve.ingress(api)
class Ingress:
    """The HTTP API of ``flashdiff serve --port``, in front of the replicas."""

    def __init__(self, replicas: Any, settings: Dict[str, Any]):
        self._replicas = replicas
        self._s = Settings(**settings)
        self._open = 0
        self._jobs: Dict[int, _Job] = {}
        self._ids = itertools.count(1)
        self._counts = {k: 0 for k in ("admitted", "rejected", "completed", "failed",
                                       "cancelled", "retried", "unavailable")}

    # --- the requests' path ------------------------------------------------------------

    async def _body(self, request: Request) -> Tuple[Optional[bytes], Optional[JSONResponse]]:
        body = await request.body()
        if len(body) > self._s.max_body:
            return None, _error(413, "invalid_request_error",
                                f"the request body is over the limit of {self._s.max_body} bytes (--max-body)")
        return body, None

    async def _check(self, body: bytes) -> Tuple[Optional[Dict[str, Any]], Optional[JSONResponse]]:
        r = await self._call(lambda h: h.check.remote(body))
        if isinstance(r, JSONResponse):
            return None, r
        if "error" in r:
            return None, _error(400, "invalid_request_error", r["error"])
        return r, None

    def _reserve(self, n: int) -> Optional[JSONResponse]:
        if self._open + n > self._s.max_queue:
            self._counts["rejected"] += 1
            return _error(429, "rate_limit_error",
                          f"{self._open} jobs unfinished, the queue holds {self._s.max_queue}: retry later",
                          headers={"Retry-After": "1"})
        self._open += n
        self._counts["admitted"] += n
        return None

    async def _call(self, send: Any) -> Any:
        """``send(handle)`` until a replica answers: retried on another replica when the
        one it reached died, for at most ``retry_for_s``; a JSONResponse (429 or 503) when
        it cannot be sent."""
        end = time.monotonic() + self._s.retry_for_s
        pause = 0.05
        while True:
            try:
                return await send(self._replicas)
            except BackPressureError:
                self._counts["rejected"] += 1
                return _error(429, "rate_limit_error",
                              "every replica's queue is full: retry later", headers={"Retry-After": "1"})
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                if time.monotonic() > end:
                    self._counts["unavailable"] += 1
                    return _error(503, "unavailable", f"no replica answered within {self._s.retry_for_s:g} s: {type(e).__name__}")
                self._counts["retried"] += 1
                log.warning("a replica failed (%s); sending the request again", type(e).__name__)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def _images(self, body: bytes, n: int) -> Any:
        """Runs the request's ``n`` images on the replicas, together."""
        return await asyncio.gather(*[
            self._call(lambda h, b=b: h.image.remote(b)) for b in image_bodies(body, n)
        ])

    # --- the endpoints -------------------------------------------------------------------

    async def _admit(self, request: Request, job: bool) -> Tuple[Optional[bytes], int, Optional[JSONResponse]]:
        """A request's body checked and its images admitted: the body and its image count,
        or the response that refuses it (413, 400, 429), as the server answers."""
        body, bad = await self._body(request)
        if bad:
            return None, 0, bad
        g, bad = await self._check(body)
        if bad:
            return None, 0, bad
        if job and g["n"] != 1:
            return None, 0, _error(400, "invalid_request_error",
                                   "\"n\": a job makes one image; submit one job per image")
        full = self._reserve(g["n"])
        if full:
            return None, 0, full
        return body, g["n"], None

    @api.post("/v1/images/generations")
    async def generations(self, request: Request) -> Response:
        body, n, refused = await self._admit(request, job=False)
        if refused:
            return refused
        try:
            images = await self._images(body, n)
        finally:
            self._open -= n
        for r in images:
            if isinstance(r, JSONResponse):
                return r
        for r in images:
            if "error" in r:
                self._counts["failed"] += 1
                kind = "invalid_request_error" if r["status"] == 400 else "generation_error"
                return _error(r["status"], kind, r["error"])
        self._counts["completed"] += len(images)
        return JSONResponse({
            "created": int(time.time()),
            "data": [{"b64_json": r["b64_json"]} for r in images],
            "flashdiff": {"reports": [r["report"] for r in images],
                          "replicas": [r["replica"] for r in images]},
        })

    @api.post("/v1/jobs")
    async def create_job(self, request: Request) -> Response:
        body, _, refused = await self._admit(request, job=True)
        if refused:
            return refused
        jid = next(self._ids)
        job = _Job(created=int(time.time()))
        self._jobs[jid] = job
        self._forget()
        job.task = asyncio.create_task(self._run_job(job, body))
        # The task's end releases its place, also when a DELETE cancels it before it ran.
        job.task.add_done_callback(lambda task, job=job: self._job_ended(job, task))
        return JSONResponse({"id": jid, "state": "queued"}, status_code=202,
                            headers={"Location": f"/v1/jobs/{jid}"})

    async def _run_job(self, job: _Job, body: bytes) -> None:
        job.state = "running"
        try:
            [r] = await self._images(body, 1)
            if isinstance(r, JSONResponse):
                job.state, job.error = "failed", json.loads(r.body)["error"]["message"]
                self._counts["failed"] += 1
            elif "error" in r:
                job.state, job.error = "failed", r["error"]
                self._counts["failed"] += 1
            else:
                job.state, job.b64_json, job.report = "succeeded", r["b64_json"], r["report"]
                job.replica = r["replica"]
                self._counts["completed"] += 1
        except Exception as e:  # noqa: BLE001 - a job never dies unanswered
            job.state, job.error = "failed", f"the ingress failed: {e}"
            self._counts["failed"] += 1

    def _job_ended(self, job: _Job, task: "asyncio.Task[None]") -> None:
        self._open -= 1
        if task.cancelled():
            job.state, job.error = "cancelled", "cancelled"
            self._counts["cancelled"] += 1
        job.done.set()

    def _forget(self) -> None:
        """Finished jobs beyond four times the queue bound are forgotten, oldest first."""
        keep = 4 * self._s.max_queue
        if len(self._jobs) <= keep:
            return
        for jid in sorted(j for j, job in self._jobs.items() if job.done.is_set())[: len(self._jobs) - keep]:
            del self._jobs[jid]

    def _job(self, raw: str) -> Tuple[Optional[int], Optional[_Job], Optional[JSONResponse]]:
        digits = raw[1:] if raw.startswith("+") else raw
        jid = int(digits) if digits.isascii() and digits.isdigit() else -1
        if not 0 <= jid < 2**64:
            return None, None, _error(400, "invalid_request_error", f"job id {raw!r} is not a non-negative integer".replace("'", '"'))
        job = self._jobs.get(jid)
        if job is None:
            return jid, None, _error(404, "not_found", f"no job {jid} (never created, or forgotten long after it finished)")
        return jid, job, None

    @api.get("/v1/jobs/{raw}")
    async def get_job(self, raw: str) -> Response:
        jid, job, bad = self._job(raw)
        if bad:
            return bad
        return JSONResponse({"id": jid, "state": job.state, "created": job.created,
                             "report": job.report, "error": job.error, "b64_json": job.b64_json})

    @api.delete("/v1/jobs/{raw}")
    async def delete_job(self, raw: str) -> Response:
        jid, job, bad = self._job(raw)
        if bad:
            return bad
        if job.done.is_set():
            return _error(409, "conflict", f"job {jid} already {job.state}")
        job.state = "cancelling"
        if job.task is not None:
            job.task.cancel()
        return JSONResponse({"id": jid, "state": "cancelling"}, status_code=202)

    @api.get("/v1/jobs/{raw}/events")
    async def job_events(self, raw: str) -> Response:
        jid, job, bad = self._job(raw)
        if bad:
            return bad

        async def stream():
            await job.done.wait()
            done = {"type": "done", "state": job.state, "report": job.report, "error": job.error}
            yield f"event: done\ndata: {json.dumps(done)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @api.get("/healthz")
    async def healthz(self) -> Response:
        return JSONResponse({"status": "ok", "model": self._s.model, "workers": self._s.workers})

    @api.get("/metrics")
    async def metrics(self) -> Response:
        lines = [
            "# HELP flashdiff_ray_open Images admitted and unfinished.",
            "# TYPE flashdiff_ray_open gauge",
            f"flashdiff_ray_open {self._open}",
        ]
        for k, v in self._counts.items():
            lines += [f"# TYPE flashdiff_ray_{k}_total counter", f"flashdiff_ray_{k}_total {v}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def build_app(args: Optional[Dict[str, Any]] = None) -> Any:
    """The application: the ingress over the replicas, from :class:`Settings` given as a
    dict (``serve run flashdiff.ray:build_app model=tinydit num_replicas=2``)."""
    s = args if isinstance(args, Settings) else Settings.from_args(dict(args or {}))
    s.check()
    env = {"RAYON_NUM_THREADS": str(s.threads)} if s.threads else {}
    options: Dict[str, Any] = {
        "ray_actor_options": {"num_cpus": s.num_cpus, "num_gpus": s.num_gpus,
                              **({"runtime_env": {"env_vars": env}} if env else {})},
        "max_ongoing_requests": s.max_ongoing_requests,
        "max_queued_requests": s.max_queued_requests,
    }
    if s.num_replicas is None:
        options["autoscaling_config"] = {
            "min_replicas": s.min_replicas,
            "max_replicas": s.max_replicas,
            "target_ongoing_requests": s.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = s.num_replicas
    replicas = Replica.options(**options).bind(asdict(s))
    # The ingress is light: it checks bodies on the replicas and waits.
    ingress = Ingress.options(ray_actor_options={"num_cpus": 0},
                              max_ongoing_requests=max(1000, 2 * s.max_queue)).bind(replicas, asdict(s))
    return ingress


app = build_app()
"""The application with the default settings (``serve run flashdiff.ray:app``)."""
