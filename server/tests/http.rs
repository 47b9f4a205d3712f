//! `flashdiff serve --port`: the HTTP API driven over real sockets on 127.0.0.1.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

const PROMPT: &str = "a red circle left on a white background";

struct Server {
    child: Child,
    base: String,
}

impl Server {
    /// Starts a server on a free port with short requests (8 steps, 2 of them warm-up)
    /// unless `args` say else.
    fn start(args: &[&str]) -> Self {
        Self::launch(&["--warmup", "2"], args)
    }

    /// As `start`, without a server-wide warm-up: requests get the model's.
    fn start_with_model_warmup(args: &[&str]) -> Self {
        Self::launch(&[], args)
    }

    fn launch(warmup: &[&str], args: &[&str]) -> Self {
        // Each server its own state directory (the per-user default allows one server).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let state = std::env::temp_dir().join(format!(
            "fd-http-state-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flashdiff"));
        cmd.args(["serve", "--port", "0", "--workers", "1", "--steps", "8"])
            .args(warmup)
            .args(args);
        if !args
            .iter()
            .any(|a| *a == "--state-dir" || *a == "--ephemeral")
        {
            cmd.arg("--state-dir").arg(&state);
        }
        let s = common::spawn(&mut cmd);
        Self {
            child: s.child,
            base: s.base,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Any status, with the body as JSON (or as a string when it is not JSON).
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value, Option<String>) {
        let req = ureq::request(method, &self.url(path)).timeout(Duration::from_secs(60));
        let res = match body {
            Some(b) => req.set("content-type", "application/json").send_string(b),
            None => req.call(),
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let retry = resp.header("retry-after").map(str::to_string);
        let text = resp.into_string().unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v, retry)
    }

    fn wait_for(&self, id: u64, want: &str) -> Value {
        let t0 = Instant::now();
        loop {
            let (s, v, _) = self.call("GET", &format!("/v1/jobs/{id}"), None);
            assert_eq!(s, 200, "{v}");
            if v["state"] == want {
                return v;
            }
            assert!(
                !matches!(
                    v["state"].as_str(),
                    Some("succeeded" | "failed" | "cancelled")
                ),
                "job {id} ended {v} while waiting for {want}"
            );
            assert!(t0.elapsed() < Duration::from_secs(60), "job {id}: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn png_side(b64: &str) -> u32 {
    let png = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("valid base64");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    u32::from_be_bytes([png[16], png[17], png[18], png[19]])
}

#[test]
fn openai_compatible_generation_returns_images_and_reports() {
    let s = Server::start(&[]);
    let (status, v, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": PROMPT, "n": 2, "size": "64x64", "seed": 3}).to_string()),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["created"].as_u64().is_some());
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    for d in data {
        assert_eq!(png_side(d["b64_json"].as_str().unwrap()), 64);
    }
    let reports = v["flashdiff"]["reports"].as_array().unwrap();
    assert_eq!(reports[0]["steps"], 8);
    // Two seeds, two different images.
    assert_ne!(data[0]["b64_json"], data[1]["b64_json"]);
    let (status, v, _) = s.call("GET", "/healthz", None);
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
}

#[test]
fn bad_requests_get_errors_that_name_the_field() {
    let s = Server::start(&["--max-body", "2048"]);
    for (body, status, needle) in [
        ("not json".to_string(), 400, "not JSON"),
        ("[1]".to_string(), 400, "JSON object"),
        (json!({}).to_string(), 400, "\"prompt\" is required"),
        (
            json!({"prompt": 3}).to_string(),
            400,
            "\"prompt\" invalid type: integer `3`, expected a string",
        ),
        (
            json!({"prompt": PROMPT, "colour": 1}).to_string(),
            400,
            "unknown field `colour`",
        ),
        (
            json!({"prompt": PROMPT, "size": "100x50"}).to_string(),
            400,
            "\"size\"",
        ),
        (json!({"prompt": PROMPT, "n": 9}).to_string(), 400, "\"n\""),
        (
            json!({"prompt": PROMPT, "response_format": "url"}).to_string(),
            400,
            "\"response_format\"",
        ),
        (
            json!({"prompt": PROMPT, "model": "sd3"}).to_string(),
            400,
            "\"model\"",
        ),
        (
            json!({"prompt": PROMPT, "epsilon": 2}).to_string(),
            400,
            "\"epsilon\"",
        ),
        (
            json!({"prompt": PROMPT, "deadline_ms": 0}).to_string(),
            400,
            "\"deadline_ms\"",
        ),
        (
            json!({"prompt": PROMPT, "deadline_ms": "soon"}).to_string(),
            400,
            "\"deadline_ms\"",
        ),
        (
            json!({"prompt": PROMPT, "steps": 4, "warmup": 4}).to_string(),
            400,
            "\"warmup\" 4: must be in 1..=3 (below \"steps\")",
        ),
        (
            json!({"prompt": "a zebra on a white background"}).to_string(),
            400,
            "zebra",
        ),
        (
            json!({"prompt": "x".repeat(4096)}).to_string(),
            413,
            "the request body is over the limit of",
        ),
        // This server's --warmup 2 does not fit in 2 steps: the error says whose it is.
        (
            json!({"prompt": PROMPT, "steps": 2}).to_string(),
            400,
            "this server's --warmup 2",
        ),
    ] {
        let (got, v, _) = s.call("POST", "/v1/images/generations", Some(&body));
        assert_eq!(got, status, "{body:.80}: {v}");
        if !needle.is_empty() {
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains(needle), "{body:.80}: {msg}");
        }
    }
    let (got, v, _) = s.call("GET", "/v1/jobs/999", None);
    assert_eq!(got, 404, "{v}");
    let (got, v, _) = s.call("GET", "/v1/jobs/-1", None);
    assert_eq!(got, 400, "{v}");
    let (got, _, _) = s.call("GET", "/v2/anything", None);
    assert_eq!(got, 404);
    // The server is still healthy after all of that.
    let (got, _, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": PROMPT}).to_string()),
    );
    assert_eq!(got, 200);
}

/// Without a server-wide warm-up a request that gives none runs the model's (the image
/// model's 5), shortened to fit below its steps rather than refused.
#[test]
fn a_request_without_a_warm_up_gets_the_models_fitted_to_its_steps() {
    let s = Server::start_with_model_warmup(&[]);
    for (steps, warmup) in [(3, 2), (6, 5), (9, 5)] {
        let body = json!({"prompt": PROMPT, "size": "32x32", "steps": steps}).to_string();
        let (status, v, _) = s.call("POST", "/v1/images/generations", Some(&body));
        assert_eq!(status, 200, "{steps} steps: {v}");
        let report = &v["flashdiff"]["reports"][0];
        assert_eq!(report["steps"], steps, "{v}");
        assert_eq!(report["warmup"], warmup, "{steps} steps: {v}");
    }
    let body = json!({"prompt": PROMPT, "steps": 3, "warmup": 3}).to_string();
    let (status, v, _) = s.call("POST", "/v1/images/generations", Some(&body));
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("\"warmup\" 3: must be in 1..=2 (below \"steps\")"),
        "{msg}"
    );
}

#[test]
fn jobs_report_progress_as_events_and_can_be_cancelled() {
    let s = Server::start(&[]);
    let (status, v, _) = s.call(
        "POST",
        "/v1/jobs",
        Some(&json!({"prompt": PROMPT}).to_string()),
    );
    assert_eq!(status, 202, "{v}");
    let id = v["id"].as_u64().unwrap();
    let done = s.wait_for(id, "succeeded");
    assert_eq!(png_side(done["b64_json"].as_str().unwrap()), 256);
    assert_eq!(done["report"]["steps"], 8);
    // Events of a long job: steps with their active patches, then the result.
    let (_, v, _) = s.call(
        "POST",
        "/v1/jobs",
        Some(&json!({"prompt": PROMPT, "steps": 40, "patches": 8}).to_string()),
    );
    let id = v["id"].as_u64().unwrap();
    let body = ureq::get(&s.url(&format!("/v1/jobs/{id}/events")))
        .timeout(Duration::from_secs(60))
        .call()
        .expect("events")
        .into_string()
        .expect("text");
    let steps: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let last = steps.last().expect("events");
    assert_eq!(last["type"], "done", "{body}");
    assert_eq!(last["state"], "succeeded");
    assert!(
        steps
            .iter()
            .any(|e| e["type"] == "step" && e["active"].as_array().is_some_and(|a| a.len() == 8)),
        "no step event with 8 patches: {body:.400}"
    );
    // Cancel a job that is still running; a second cancel is a conflict, not "unknown".
    let (_, v, _) = s.call(
        "POST",
        "/v1/jobs",
        Some(&json!({"prompt": PROMPT, "steps": 1000}).to_string()),
    );
    let id = v["id"].as_u64().unwrap();
    let (status, _, _) = s.call("DELETE", &format!("/v1/jobs/{id}"), None);
    assert_eq!(status, 202);
    // From the DELETE on, the job never reads as queued or running again.
    let (_, v, _) = s.call("GET", &format!("/v1/jobs/{id}"), None);
    assert!(
        v["state"] == "cancelling" || v["state"] == "cancelled",
        "{v}"
    );
    let v = s.wait_for(id, "cancelled");
    assert!(v["error"].as_str().unwrap().contains("cancelled"));
    let (status, v, _) = s.call("DELETE", &format!("/v1/jobs/{id}"), None);
    assert_eq!(status, 409, "{v}");
    let (_, m, _) = s.call("GET", "/metrics", None);
    let m = m.as_str().unwrap().to_string();
    for want in [
        "flashdiff_completed_total 2",
        "flashdiff_cancelled_total 1",
        "flashdiff_step_seconds_count",
    ] {
        assert!(m.contains(want), "{want} missing from\n{m}");
    }
}

#[test]
fn past_the_queue_bound_requests_get_429_with_retry_after() {
    let s = Server::start(&["--max-queue", "1"]);
    let long = json!({"prompt": PROMPT, "steps": 1000}).to_string();
    let (status, v, _) = s.call("POST", "/v1/jobs", Some(&long));
    assert_eq!(status, 202, "{v}");
    let first = v["id"].as_u64().unwrap();
    let (status, v, retry) = s.call("POST", "/v1/jobs", Some(&long));
    assert_eq!(status, 429, "{v}");
    assert_eq!(retry.as_deref(), Some("1"));
    let (_, m, _) = s.call("GET", "/metrics", None);
    assert!(m.as_str().unwrap().contains("flashdiff_rejected_total 1"));
    // Room again once the first is gone.
    s.call("DELETE", &format!("/v1/jobs/{first}"), None);
    s.wait_for(first, "cancelled");
    let (status, v, _) = s.call(
        "POST",
        "/v1/jobs",
        Some(&json!({"prompt": PROMPT}).to_string()),
    );
    assert_eq!(status, 202, "{v}");
}

#[test]
fn sigterm_finishes_admitted_work_then_exits() {
    let mut s = Server::start(&[]);
    let url = s.url("/v1/images/generations");
    let waiting = std::thread::spawn(move || {
        ureq::post(&url)
            .timeout(Duration::from_secs(60))
            .send_string(&json!({"prompt": PROMPT, "steps": 300}).to_string())
            .map(|r| r.status())
            .map_err(|e| e.to_string())
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill with a valid pid of our own child and a standard signal number.
    let rc = unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert_eq!(
        waiting.join().unwrap(),
        Ok(200),
        "the admitted request was dropped"
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "server did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// A burst far past the queue bound: every request gets 200 or 429 (never a 5xx or a
/// dropped connection), every accepted one completes, and the server's peak memory stays
/// bounded. Prints the counts, accepted latencies and peak RSS.
#[test]
fn a_burst_of_1000_requests_is_answered_200_or_429_with_bounded_memory() {
    let s = Server::start(&["--max-queue", "16"]);
    let url = s.url("/v1/images/generations");
    let body = json!({"prompt": PROMPT, "size": "32x32", "steps": 3, "warmup": 1}).to_string();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for _ in 0..20 {
                    let t = Instant::now();
                    let status = match ureq::post(&url)
                        .timeout(Duration::from_secs(120))
                        .send_string(&body)
                    {
                        Ok(r) => r.status(),
                        Err(ureq::Error::Status(c, _)) => c,
                        Err(e) => panic!("transport error: {e}"),
                    };
                    out.push((status, t.elapsed().as_secs_f64()));
                }
                out
            })
        })
        .collect();
    let results: Vec<(u16, f64)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let wall = t0.elapsed().as_secs_f64();
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let busy = results.iter().filter(|r| r.0 == 429).count();
    assert_eq!(results.len(), 1000);
    assert_eq!(
        ok + busy,
        1000,
        "other statuses: {:?}",
        results
            .iter()
            .filter(|r| r.0 != 200 && r.0 != 429)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert!(ok > 0 && busy > 0, "{ok} accepted, {busy} refused");
    let mut lat: Vec<f64> = results.iter().filter(|r| r.0 == 200).map(|r| r.1).collect();
    lat.sort_by(f64::total_cmp);
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id()))
        .expect("the server's /proc status is readable");
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .expect("/proc status has VmHWM");
    println!(
        "burst: {ok} accepted, {busy} refused (429) in {wall:.1} s; accepted p50 {:.3} s, p99 {:.3} s; server peak RSS {} MiB",
        lat[lat.len() / 2],
        lat[((lat.len() as f64 * 0.99) as usize).min(lat.len() - 1)],
        rss_kib / 1024
    );
    // The model and the engine take about 60 MiB; a burst the queue bound refuses must not
    // grow that by much.
    assert!(rss_kib < 256 * 1024, "peak RSS {rss_kib} KiB");
    let (_, m, _) = s.call("GET", "/metrics", None);
    let m = m.as_str().unwrap().to_string();
    assert!(
        m.contains(&format!("flashdiff_rejected_total {busy}")),
        "{m}"
    );
    assert!(
        m.contains(&format!("flashdiff_completed_total {ok}")),
        "{m}"
    );
}

/// Under `--order deadline` a request with a deadline is served and its report says whether
/// the deadline was met: a generous one is, an impossible one (1 ms) is not.
#[test]
fn deadlines_are_accepted_and_reported() {
    let s = Server::start(&["--order", "deadline"]);
    for (ms, met) in [(600_000u64, true), (1, false)] {
        let (status, v, _) = s.call(
            "POST",
            "/v1/images/generations",
            Some(&json!({"prompt": PROMPT, "deadline_ms": ms}).to_string()),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["flashdiff"]["reports"][0]["deadline_met"],
            json!(met),
            "{v}"
        );
    }
    let (status, v, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": PROMPT}).to_string()),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["flashdiff"]["reports"][0]["deadline_met"], Value::Null);
}

/// A Chromium-family browser to run the page in: `$FLASHDIFF_BROWSER`, else the first of
/// chromium, chromium-browser, google-chrome on PATH.
fn browser() -> Option<std::path::PathBuf> {
    if let Some(b) = std::env::var_os("FLASHDIFF_BROWSER") {
        return Some(b.into());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Loads `url` in headless Chromium, lets its scripts run, returns the DOM it ends with.
fn rendered_dom(browser: &std::path::Path, url: &str) -> String {
    let profile = std::env::temp_dir().join(format!(
        "flashdiff-page-{}-{}",
        std::process::id(),
        url.len()
    ));
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            // Virtual time stands still while the page's requests are open (the job's
            // event stream), so this is time after the job ended.
            "--virtual-time-budget=20000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("run the browser");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page at `/` in a real browser: it submits the prompt, follows the job's events,
/// draws the patch map, shows the image and the report; a prompt the model cannot draw
/// shows the server's error naming the word. Skipped, saying so, without a browser.
#[test]
fn the_page_generates_in_a_real_browser() {
    let Some(b) = browser() else {
        // CI provides the browser (`.ci/run` installs it): there a missing one is a failure.
        assert!(
            std::env::var_os("CI").is_none(),
            "no Chromium found under CI: install the `chromium` package or set FLASHDIFF_BROWSER"
        );
        eprintln!(
            "skipped: no Chromium found (install the `chromium` package or set FLASHDIFF_BROWSER)"
        );
        return;
    };
    let s = Server::start(&[]);
    let (status, v, _) = s.call("GET", "/", None);
    assert_eq!(status, 200);
    assert!(
        v.as_str().unwrap_or("").contains("<canvas id=\"map\""),
        "{v}"
    );

    let url = s.url("/?prompt=a%20red%20circle%20left%20on%20a%20white%20background&steps=8&run=1");
    let dom = rendered_dom(&b, &url);
    assert!(
        dom.contains("data-state=\"done\""),
        "page did not finish: {dom}"
    );
    assert!(
        dom.contains("src=\"data:image/png;base64,iVBORw0KGgo"),
        "no PNG shown: {dom}"
    );
    assert!(dom.contains("patch-steps computed"), "no report: {dom}");
    // 8 steps, 2 of them warm-up: the history holds the 6 patch steps.
    assert!(dom.contains("data-steps=\"6\""), "no step history: {dom}");

    let dom = rendered_dom(&b, &s.url("/?prompt=a%20purple%20dragon&run=1"));
    assert!(dom.contains("data-state=\"failed\""), "{dom}");
    assert!(
        dom.contains("dragon"),
        "the error does not name the word: {dom}"
    );
}

#[test]
fn a_state_directory_serves_one_server_at_a_time() {
    let dir = std::env::temp_dir().join(format!("fd-http-lock-{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let _a = Server::start(&["--state-dir", d]);
    let out = Command::new(env!("CARGO_BIN_EXE_flashdiff"))
        .args(["serve", "--port", "0", "--state-dir", d])
        .output()
        .expect("run a second server");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another flashdiff server"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_flashdiff"))
        .args(["serve", "--port", "0", "--state-dir", d, "--ephemeral"])
        .output()
        .expect("run with conflicting flags");
    assert!(!out.status.success());
    drop(_a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --port --model flux-dev --weights DIR --size 64x48` (the small random pipeline):
/// the OpenAI route returns the model's image size, scaled by whole multiples of it only.
#[test]
fn a_flux_pipeline_serves_its_own_image_size() {
    let dir = std::env::temp_dir().join(format!("fd-http-flux-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flashdiff_models::pipelines::tiny::write_flux(&dir, false).unwrap();
    let d = dir.to_string_lossy().into_owned();
    let s = Server::start(&[
        "--model",
        "flux-schnell",
        "--weights",
        &d,
        "--size",
        "64x48",
    ]);
    let prompt = "a red cat on a blue table";
    let (status, v, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": prompt, "size": "128x96"}).to_string()),
    );
    assert_eq!(status, 200, "{v}");
    let b64 = v["data"][0]["b64_json"].as_str().unwrap();
    assert_eq!(png_side(b64), 128);
    let (status, v, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": prompt, "size": "64x64"}).to_string()),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("64x48 times a whole number"), "{v}");
    let (status, v, _) = s.call(
        "POST",
        "/v1/images/generations",
        Some(&json!({"prompt": prompt, "model": "flux-dev"}).to_string()),
    );
    assert_eq!(status, 400, "{v}");
    drop(s);
    std::fs::remove_dir_all(&dir).ok();
}

/// One request schema: the same six bad requests through the CLI, JSON lines, HTTP and the
/// C ABI (its struct, and the schema as JSON) each get the engine's one error text, which
/// names the field.
#[test]
fn a_bad_field_gets_the_same_error_through_every_interface() {
    use flashdiff_runtime::engine::{default_weights, Engine, RequestConfig};
    use std::io::Write;
    let prompt = "a red circle left on a white background";
    // Each bad request: its fields (steps and warm-up always given), as JSON values.
    let bad: [[(&str, u64); 3]; 6] = [
        [("steps", 1), ("warmup", 1), ("seed", 0)],
        [("steps", 8), ("warmup", 8), ("seed", 0)],
        [("steps", 8), ("warmup", 2), ("epsilon", 2)],
        [("steps", 8), ("warmup", 2), ("max_skip", 5000)],
        [("steps", 8), ("warmup", 2), ("priority", 9)],
        [("steps", 8), ("warmup", 2), ("budget", 2)],
    ];
    let settings = |fields: &[(&str, u64)]| {
        let mut c = RequestConfig::default();
        for &(k, v) in fields {
            match k {
                "steps" => c.steps = v as u32,
                "warmup" => c.warmup = v as u32,
                "epsilon" => c.epsilon = v as f32,
                "max_skip" => c.max_skip = v as u32,
                "priority" => c.priority = v as u8,
                "budget" => c.budget = Some(v as f32),
                _ => c.seed = v,
            }
        }
        c
    };
    let engine = Engine::new(&default_weights(), 1).unwrap();
    let want: Vec<String> = bad
        .iter()
        .map(|b| engine.validate(&settings(b)).unwrap_err().to_string())
        .collect();
    let named = [
        "steps", "warmup", "epsilon", "max_skip", "priority", "budget",
    ];
    for (field, w) in named.iter().zip(&want) {
        assert!(w.starts_with(&format!("\"{field}\"")), "{w}");
    }
    // CLI.
    for (b, w) in bad.iter().zip(&want) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flashdiff"));
        cmd.args(["generate", prompt, "-o"])
            .arg(std::env::temp_dir().join(format!("fd-schema-{}.png", std::process::id())));
        for (k, v) in b {
            cmd.arg(format!("--{}", k.replace('_', "-")))
                .arg(v.to_string());
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(w.as_str()),
            "CLI: {err}"
        );
    }
    let json_of = |b: &[(&str, u64)]| {
        let mut v = json!({ "prompt": prompt });
        for (k, x) in b {
            v[*k] = json!(x);
        }
        v.to_string()
    };
    // JSON lines.
    let mut child = Command::new(env!("CARGO_BIN_EXE_flashdiff"))
        .args(["serve", "--workers", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for b in &bad {
        writeln!(stdin, "{}", json_of(b)).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), bad.len());
    for (line, w) in lines.iter().zip(&want) {
        assert_eq!(line["ok"], false, "{line}");
        let err = line["error"].as_str().unwrap();
        assert!(err.contains(w.as_str()), "JSON lines: {line}");
    }
    // HTTP.
    let s = Server::start(&[]);
    for (b, w) in bad.iter().zip(&want) {
        let (status, body, _) = s.call("POST", "/v1/images/generations", Some(&json_of(b)));
        assert_eq!(status, 400, "{body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(w.as_str()), "HTTP: {body}");
    }
    // The C ABI.
    let mut e = std::ptr::null_mut();
    let cfg = flashdiff::fd_engine_config_default();
    // SAFETY: a readable config and a writable handle slot.
    let status = unsafe { flashdiff::fd_engine_new(&cfg, &mut e) };
    assert_eq!(status as u32, 0);
    let c_prompt = std::ffi::CString::new(prompt).unwrap();
    let detail = || {
        let mut buf = vec![0 as std::os::raw::c_char; 512];
        // SAFETY: a writable buffer of the length given.
        let n = unsafe { flashdiff::fd_last_error_detail(buf.as_mut_ptr(), buf.len()) };
        assert!(n > 0);
        // SAFETY: fd_last_error_detail NUL-terminates what it writes.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    for (i, (b, w)) in bad.iter().zip(&want).enumerate() {
        let json = json_of(b);
        // SAFETY: a live engine and `json.len()` readable bytes.
        let status = unsafe {
            flashdiff::fd_engine_submit_json(e, 100 + i as u64, json.as_ptr().cast(), json.len())
        };
        assert_ne!(status as u32, 0, "C ABI (JSON) accepted {json}");
        let d = detail();
        assert!(d.contains(w.as_str()), "C ABI (JSON): {d}");
        if b.iter().any(|(k, _)| *k == "budget") {
            continue; // the struct has no budget field
        }
        let c = settings(b);
        let mut rc = flashdiff::fd_request_config_default();
        (rc.steps, rc.warmup, rc.epsilon) = (c.steps, c.warmup, c.epsilon);
        (rc.max_skip, rc.priority) = (c.max_skip, c.priority);
        // SAFETY: a live engine, a NUL-terminated prompt, a readable config.
        let status = unsafe { flashdiff::fd_engine_submit(e, i as u64, c_prompt.as_ptr(), &rc) };
        assert_ne!(status as u32, 0, "C ABI accepted {b:?}");
        let d = detail();
        assert!(d.contains(w.as_str()), "C ABI: {d}");
    }
    // SAFETY: the handle from fd_engine_new, freed once.
    unsafe { flashdiff::fd_engine_free(&mut e) };
}
