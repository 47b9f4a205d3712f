//! `flashdiff`: generate with the built-in model, serve a request stream.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use flashdiff_runtime::engine::{default_weights, Engine, LayoutKind, Mode, Output, RequestConfig};
use flashdiff_runtime::image;
use flashdiff_runtime::models::scene::{self, Verdict, IMAGE};

const USAGE: &str = "\
flashdiff: diffusion serving with semantic patches and selective refinement (CPU, built-in model)

usage:
  flashdiff generate PROMPT [-o out.png] [options]   one image, with a report
  flashdiff serve [--input FILE] [--out-dir DIR]     JSON-lines requests in, JSON-lines results out
  flashdiff bench [--quick] [--out-dir DIR]          FlashDiff against the other ways to serve the model

generate options:
  --steps N        total Euler steps (default 50)
  --warmup N       warm-up steps before partitioning (default 5)
  --patches N|auto patch count R (default auto: the adaptive controller)
  --epsilon E      gate threshold in [0, 1] (default 0.1)
  --max-skip K     longest run of skips per patch (default 3)
  --seed S         noise seed (default 0)
  --mode M         flashdiff | no-skip | full | naive-patch | teacache | ras (default flashdiff)
  --layout L       saliency | uniform (default saliency)
  --reuse R        extrapolate | stale: other patches' K/V and skipped patches' velocity
                   extrapolated along their slope, or reused as last computed (the paper's
                   rule) (default extrapolate)
  --monotasks N|workers|per-patch
                   a step's active patches run packed into at most N forwards (neighbouring
                   patches together, balanced by tokens); patches in one forward see each
                   other's fresh K/V, the others' cached K/V (default 1: the output is the
                   same for any --workers; workers: one per worker; per-patch: every patch its
                   own, DistriFusion's displaced patches)
  --cache-threshold T  teacache: skip a step while the accumulated change stays under T (0.1)
  --workers W      workers (default 1)
  --processes      run the workers as separate processes sharing request state in /dev/shm
                   (default: in this process; outputs are bit-identical either way)
  --compare        also run full computation from the same seed: PSNR, SSIM, checker for both
  --weights PATH   model file (default: the shipped models/tinydit/tinydit.safetensors)
  -o, --output P   PNG path (default flashdiff.png)

serve reads one JSON object per line: {\"id\": 1, \"prompt\": \"...\", \"seed\": 0, \"priority\": 0,
\"steps\": 50, \"warmup\": 5, \"patches\": 8, \"epsilon\": 0.1, \"max_skip\": 3, \"mode\": \"flashdiff\",
\"reuse\": \"extrapolate\", \"monotasks\": 1}
(only \"prompt\" is required) and writes one JSON result per request.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("generate") => generate(&args[1..]),
        Some("serve") => serve(&args[1..]),
        Some("worker") => worker(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("-h") | Some("--help") | Some("help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>, range: &str) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value ({range})"))?;
    v.parse()
        .map_err(|_| format!("{flag} {v:?}: expected {range}"))
}

struct Opts {
    prompt: Option<String>,
    cfg: RequestConfig,
    workers: u32,
    compare: bool,
    weights: PathBuf,
    output: PathBuf,
    input: Option<PathBuf>,
    out_dir: Option<PathBuf>,
    processes: bool,
}

fn parse(args: &[String], positional: bool) -> Result<Opts, String> {
    let mut o = Opts {
        prompt: None,
        cfg: RequestConfig::default(),
        workers: 1,
        compare: false,
        weights: default_weights(),
        output: PathBuf::from("flashdiff.png"),
        input: None,
        out_dir: None,
        processes: false,
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let v = args.get(i + 1);
        let mut took = true;
        match a {
            "--steps" => o.cfg.steps = num(a, v, "an integer in 2..=1000")?,
            "--warmup" => o.cfg.warmup = num(a, v, "an integer >= 1 below --steps")?,
            "--patches" => {
                o.cfg.patches = match v.map(String::as_str) {
                    Some("auto") => None,
                    _ => Some(num(a, v, "auto or an integer in 1..=64")?),
                }
            }
            "--epsilon" => o.cfg.epsilon = num(a, v, "a number in [0, 1]")?,
            "--max-skip" => o.cfg.max_skip = num(a, v, "an integer in 0..=1000")?,
            "--seed" => o.cfg.seed = num(a, v, "an unsigned integer")?,
            "--priority" => o.cfg.priority = num(a, v, "an integer in 0..8")?,
            "--mode" => {
                o.cfg.mode = v
                    .ok_or("--mode needs a value (flashdiff, no-skip or full)")?
                    .parse::<Mode>()?
            }
            "--workers" => o.workers = num(a, v, "an integer in 1..=1024")?,
            "--layout" => {
                o.cfg.layout = match v.map(String::as_str) {
                    Some("saliency") => LayoutKind::Saliency,
                    Some("uniform") => LayoutKind::Uniform,
                    _ => return Err("--layout needs saliency or uniform".into()),
                }
            }
            "--reuse" => o.cfg.extrapolate = parse_reuse(v.map(String::as_str))?,
            "--monotasks" => {
                o.cfg.monotasks = match v.map(String::as_str) {
                    Some("workers") => None,
                    Some("per-patch") => Some(u32::MAX),
                    _ => Some(num(a, v, "workers, per-patch or an integer >= 1")?),
                }
            }
            "--cache-threshold" => o.cfg.cache_threshold = num(a, v, "a number >= 0")?,
            "--weights" => o.weights = PathBuf::from(v.ok_or("--weights needs a path")?),
            "-o" | "--output" => o.output = PathBuf::from(v.ok_or("--output needs a path")?),
            "--input" => o.input = Some(PathBuf::from(v.ok_or("--input needs a path (or -)")?)),
            "--out-dir" => o.out_dir = Some(PathBuf::from(v.ok_or("--out-dir needs a path")?)),
            "--compare" => {
                o.compare = true;
                took = false;
            }
            "--processes" => {
                o.processes = true;
                took = false;
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}\n\n{USAGE}")),
            _ if positional && o.prompt.is_none() => {
                o.prompt = Some(a.to_string());
                took = false;
            }
            _ => {
                return Err(format!(
                    "unexpected argument {a:?} (quote the prompt as one argument)"
                ))
            }
        }
        i += if took { 2 } else { 1 };
    }
    Ok(o)
}

fn verdict_text(v: Verdict) -> String {
    if v.all() {
        "all correct".into()
    } else {
        format!(
            "background {}, objects present {}, shapes {}",
            ok(v.background),
            ok(v.present),
            ok(v.shape)
        )
    }
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "WRONG"
    }
}

fn progress_bar() -> impl FnMut(u64, u32, u32) {
    let tty = std::io::stderr().is_terminal();
    move |_, step, steps| {
        let width = 30;
        let filled = (step as usize * width) / steps.max(1) as usize;
        if tty {
            eprint!(
                "\r[{}{}] step {step}/{steps}",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            if step >= steps {
                eprintln!();
            }
        } else if step == steps || step % 10 == 0 {
            eprintln!("step {step}/{steps}");
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn generate(args: &[String]) -> Result<(), String> {
    let o = parse(args, true)?;
    let prompt = o
        .prompt
        .clone()
        .ok_or_else(|| format!("generate needs a prompt\n\n{USAGE}"))?;
    let scene = scene::parse(&prompt).map_err(|e| e.to_string());
    let mut engine = Engine::new(&o.weights, o.workers).map_err(|e| e.to_string())?;
    let out = engine
        .generate(&prompt, o.cfg.clone(), &mut progress_bar())
        .map_err(|e| e.to_string())?;
    std::fs::write(&o.output, image::png(&out.rgb, IMAGE, IMAGE, 8))
        .map_err(|e| format!("cannot write {}: {e}", o.output.display()))?;
    let r = &out.report;
    println!(
        "wrote {} ({}x{} pixels, shown 8x)",
        o.output.display(),
        IMAGE,
        IMAGE
    );
    println!(
        "mode {:?}, {} steps ({} warm-up), {} patches, seed {}",
        o.cfg.mode, r.steps, r.warmup, r.patches, o.cfg.seed
    );
    println!(
        "patch-steps computed {} of {} ({:.1}% skipped); model work skipped incl. warm-up {:.1}%",
        r.computed,
        r.patch_steps,
        100.0 * r.skipped_share(),
        100.0 * r.work_skipped
    );
    let t = r.time;
    println!(
        "time {:.0} ms: warm-up {:.0}, partition {:.2}, gate {:.2}, scheduler {:.2}, compute {:.0}, queue {:.1}",
        ms(r.latency),
        ms(t.warmup),
        ms(t.partition),
        ms(t.gate),
        ms(t.schedule),
        ms(t.compute),
        ms(t.queue)
    );
    let grammar_note = |v: &Output| match &scene {
        Ok(s) => verdict_text(scene::check(&v.rgb, s)),
        Err(e) => format!("not checked ({e})"),
    };
    let control = t.partition + t.gate + t.schedule;
    println!(
        "control plane (partition + gate + scheduler): {:.2} ms = {:.3}% of model time",
        ms(control),
        100.0 * control.as_secs_f64() / (t.warmup + t.compute).as_secs_f64().max(1e-9)
    );
    println!("checker: {}", grammar_note(&out));
    if o.compare {
        let full_cfg = RequestConfig {
            mode: Mode::Full,
            patches: None,
            ..o.cfg.clone()
        };
        let full = engine
            .generate(&prompt, full_cfg, &mut |_, _, _| {})
            .map_err(|e| e.to_string())?;
        println!(
            "vs full computation: PSNR {:.2} dB, SSIM {:.4}; full took {:.0} ms ({:.2}x); full checker: {}",
            image::psnr(&out.rgb, &full.rgb),
            image::ssim(&out.rgb, &full.rgb, IMAGE, IMAGE),
            ms(full.report.latency),
            full.report.latency.as_secs_f64() / r.latency.as_secs_f64(),
            grammar_note(&full)
        );
    }
    Ok(())
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// CPU time of this process and its finished children, in seconds.
fn cpu_time() -> f64 {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage writes one rusage into the zeroed struct we own; `who` is one of
        // the two constants it accepts.
        let u = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut u);
            u
        };
        for t in [u.ru_utime, u.ru_stime] {
            total += t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        }
    }
    total
}

fn serve(args: &[String]) -> Result<(), String> {
    let o = parse(args, false)?;
    let input: Box<dyn BufRead> = match o.input.as_deref() {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
        )),
    };
    if let Some(d) = &o.out_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let mut engine = make_engine(&o)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut prompts = std::collections::HashMap::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("reading requests: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let fallback_id = n as u64 + 1;
        let req = match parse_request(&line, &o.cfg, fallback_id) {
            Ok(r) => r,
            Err(e) => {
                writeln!(
                    out,
                    "{{\"id\":{fallback_id},\"ok\":false,\"error\":{}}}",
                    json_str(&format!("line {}: {e}", n + 1))
                )
                .map_err(|e| e.to_string())?;
                continue;
            }
        };
        match engine.submit(req.0, &req.1, req.2) {
            Ok(()) => {
                prompts.insert(req.0, req.1);
            }
            Err(e) => writeln!(
                out,
                "{{\"id\":{},\"ok\":false,\"error\":{}}}",
                req.0,
                json_str(&e.to_string())
            )
            .map_err(|e| e.to_string())?,
        }
    }
    eprintln!("serving {} requests", engine.in_flight());
    let (wall0, cpu0) = (std::time::Instant::now(), cpu_time());
    let mut done = 0u32;
    let total = engine.in_flight();
    let results = engine.run(&mut |_, step, steps| {
        if step == steps {
            done += 1;
            eprintln!("finished {done}/{total}");
        }
    });
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_time() - cpu0);
    eprintln!(
        "served {total} requests on {} worker(s) in {wall:.2} s wall, {cpu:.2} s CPU (CPU/wall {:.2})",
        engine.workers(),
        cpu / wall.max(1e-9)
    );
    for r in results {
        let line = match r {
            Ok(o2) => {
                let rep = &o2.report;
                let prompt = prompts.get(&rep.id).cloned().unwrap_or_default();
                let checker = match scene::parse(&prompt) {
                    Ok(s) => {
                        let v = scene::check(&o2.rgb, &s);
                        format!(
                            "{{\"background\":{},\"present\":{},\"shape\":{},\"all\":{}}}",
                            v.background,
                            v.present,
                            v.shape,
                            v.all()
                        )
                    }
                    Err(_) => "null".into(),
                };
                let image = match &o.out_dir {
                    Some(d) => {
                        let p = d.join(format!("{}.png", rep.id));
                        std::fs::write(&p, image::png(&o2.rgb, IMAGE, IMAGE, 8))
                            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
                        json_str(&p.display().to_string())
                    }
                    None => "null".into(),
                };
                format!(
                    "{{\"id\":{},\"ok\":true,\"image\":{image},\"latency_ms\":{:.1},\"patches\":{},\"patch_steps\":{},\"computed\":{},\"skipped_share\":{:.4},\"checker\":{checker}}}",
                    rep.id,
                    ms(rep.latency),
                    rep.patches,
                    rep.patch_steps,
                    rep.computed,
                    rep.skipped_share()
                )
            }
            Err((id, e)) => format!(
                "{{\"id\":{id},\"ok\":false,\"error\":{}}}",
                json_str(&e.to_string())
            ),
        };
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn parse_request(
    line: &str,
    base: &RequestConfig,
    fallback_id: u64,
) -> Result<(u64, String, RequestConfig), String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("a request must be a JSON object")?;
    let known = [
        "id",
        "prompt",
        "seed",
        "priority",
        "steps",
        "warmup",
        "patches",
        "epsilon",
        "max_skip",
        "mode",
        "reuse",
        "monotasks",
    ];
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown field {k:?} (known: {})", known.join(", ")));
    }
    let prompt = obj
        .get("prompt")
        .and_then(|p| p.as_str())
        .ok_or("\"prompt\" (a string) is required")?
        .to_string();
    let uint = |k: &str| -> Result<Option<u64>, String> {
        match obj.get(k) {
            None => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("\"{k}\" must be a non-negative integer")),
        }
    };
    let small = |k: &str, max: u64| -> Result<Option<u32>, String> {
        match uint(k)? {
            Some(x) if x > max => Err(format!("\"{k}\" {x} is out of range 0..={max}")),
            x => Ok(x.map(|x| x as u32)),
        }
    };
    let mut cfg = base.clone();
    let id = uint("id")?.unwrap_or(fallback_id);
    if let Some(s) = uint("seed")? {
        cfg.seed = s;
    }
    if let Some(p) = small("priority", 255)? {
        cfg.priority = p as u8;
    }
    if let Some(s) = small("steps", 100_000)? {
        cfg.steps = s;
    }
    if let Some(w) = small("warmup", 100_000)? {
        cfg.warmup = w;
    }
    if let Some(r) = small("patches", 1 << 20)? {
        cfg.patches = Some(r);
    }
    if let Some(k) = small("max_skip", 100_000)? {
        cfg.max_skip = k;
    }
    if let Some(e) = obj.get("epsilon") {
        cfg.epsilon = e.as_f64().ok_or("\"epsilon\" must be a number")? as f32;
    }
    if let Some(m) = obj.get("mode") {
        cfg.mode = m.as_str().ok_or("\"mode\" must be a string")?.parse()?;
    }
    if let Some(m) = small("monotasks", u32::MAX as u64)? {
        cfg.monotasks = Some(m);
    }
    if let Some(k) = obj.get("reuse") {
        cfg.extrapolate = parse_reuse(k.as_str())
            .map_err(|_| "\"reuse\" must be \"extrapolate\" or \"stale\"")?;
    }
    Ok((id, prompt, cfg))
}

/// `extrapolate` or `stale` (the `--reuse` flag and the `reuse` request field).
fn parse_reuse(v: Option<&str>) -> Result<bool, String> {
    match v {
        Some("extrapolate") => Ok(true),
        Some("stale") => Ok(false),
        _ => Err("--reuse needs extrapolate or stale".into()),
    }
}

fn make_engine(o: &Opts) -> Result<Engine, String> {
    if !o.processes {
        return Engine::new(&o.weights, o.workers).map_err(|e| e.to_string());
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the flashdiff executable: {e}"))?;
    let shm = PathBuf::from("/dev/shm");
    let dir = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    Engine::with_processes(&o.weights, o.workers, &exe, &dir).map_err(|e| e.to_string())
}

/// `flashdiff worker --weights PATH`: a worker process (started by the engine, not by hand).
fn worker(args: &[String]) -> Result<(), String> {
    let weights = match args {
        [flag, path] if flag == "--weights" => PathBuf::from(path),
        _ => {
            return Err(
                "worker is started by the engine as: flashdiff worker --weights PATH".into(),
            )
        }
    };
    flashdiff_runtime::proc::worker_main(&weights)
}

/// `flashdiff bench [--quick] [--prompts N] [--seed S] [--steps N] [--patches R] [--out-dir DIR]`.
fn bench(args: &[String]) -> Result<(), String> {
    let mut cfg = flashdiff_runtime::bench::BenchConfig {
        prompts: 64,
        seed: 10_000,
        steps: 50,
        patches: 16,
        base: RequestConfig::default(),
    };
    let mut out = PathBuf::from("bench-out");
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1);
        match args[i].as_str() {
            "--quick" => {
                cfg.prompts = 8;
                i += 1;
                continue;
            }
            "--prompts" => cfg.prompts = num("--prompts", v, "an integer in 1..=10000")?,
            "--seed" => cfg.seed = num("--seed", v, "an unsigned integer")?,
            "--steps" => cfg.steps = num("--steps", v, "an integer in 2..=1000")?,
            "--patches" => cfg.patches = num("--patches", v, "an integer in 1..=64")?,
            "--out-dir" => out = PathBuf::from(v.ok_or("--out-dir needs a path")?),
            _ => {
                rest.push(args[i].clone());
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if cfg.prompts == 0 || cfg.prompts > 10_000 {
        return Err(format!("--prompts {}: must be in 1..=10000", cfg.prompts));
    }
    let o = parse(&rest, false)?;
    cfg.base = o.cfg.clone();
    let mut engine = make_engine(&o)?;
    engine
        .validate(&RequestConfig {
            steps: cfg.steps,
            patches: Some(cfg.patches),
            ..cfg.base.clone()
        })
        .map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    let report = flashdiff_runtime::bench::run(&mut engine, &cfg, &out, &mut |m| {
        eprintln!("[{:>5.0}s] {m}", t0.elapsed().as_secs_f64())
    })
    .map_err(|e| e.to_string())?;
    println!("{report}");
    println!(
        "wrote {}/bench.json and {}/report.md in {:.0} s",
        out.display(),
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
