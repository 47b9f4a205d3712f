//! The `flashdiff` command as a user runs it.

use std::path::Path;
use std::process::Command;

fn flashdiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashdiff"))
}

/// Runs the command, requires success and every needle in its standard output; returns
/// standard output and standard error.
fn succeeds_with(cmd: &mut Command, needles: &[&str]) -> (String, String) {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for needle in needles {
        assert!(
            stdout.contains(needle),
            "output lacks {needle:?}:\n{stdout}"
        );
    }
    (stdout, stderr)
}

/// Runs `cmd`, which must fail with exit status 2 and a standard error naming `needle`;
/// returns the standard error.
fn fails_with(cmd: &mut Command, needle: &str) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{cmd:?}: {stderr:?} lacks {needle:?}"
    );
    stderr
}

/// `generate --model MODEL --weights DIR/model ARGS x -o DIR/OUT` fails naming `needle`.
fn generate_fails_with(model: &str, dir: &Path, out: &str, args: &[&str], needle: &str) {
    fails_with(
        flashdiff()
            .args(["generate", "--model", model, "--weights"])
            .arg(dir.join("model"))
            .args(args)
            .args(["x", "-o"])
            .arg(dir.join(out)),
        needle,
    );
}

/// Each `(args, needle)`: `flashdiff ARGS` fails naming the problem.
fn each_fails_with(cases: &[(&[&str], &str)]) {
    for (args, needle) in cases {
        fails_with(flashdiff().args(*args), needle);
    }
}

/// JSON lines of `serve`'s standard output.
fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A fresh directory `flashdiff-NAME-PID` in the temporary directory holding
/// `requests.jsonl` with `lines`; returns both paths.
fn requests_file(name: &str, lines: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("flashdiff-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("requests.jsonl");
    std::fs::write(&input, lines).unwrap();
    (dir, input)
}

#[test]
fn generate_writes_a_png_and_a_report() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("out.png");
    let (_, stderr) = succeeds_with(
        flashdiff()
            .args([
                "generate",
                "a red circle top left on a blue background",
                "--steps",
                "10",
                "--warmup",
                "2",
                "--patches",
                "4",
                "--compare",
                "-o",
            ])
            .arg(&png),
        &[
            "patch-steps computed",
            "steps after the warm-up: ",
            " regional (some patches), ",
            "warm-up",
            "partition",
            "gate",
            "compute",
            "queue",
            "checker:",
            "vs full computation: PSNR",
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(stderr.contains("step 10/10"), "no progress shown");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn generate_keeps_to_a_work_budget() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 20 steps, 3 warm-up, budget 0.36: 7 steps computed, 0.358 of full computation's FLOPs
    // with the signal of the 17 steps after the warm-up and every step's conditioning (at
    // 0.35 those 7 would be over the budget); the comparison with full computation still
    // runs.
    let (stdout, _) = succeeds_with(
        flashdiff()
            .args([
                "generate",
                "a red circle top left on a blue background",
                "--steps",
                "20",
                "--warmup",
                "3",
                "--budget",
                "0.36",
                "--compare",
                "-o",
            ])
            .arg(dir.join("out.png")),
        &[
            "model FLOPs 0.358 of full computation's",
            "vs full computation: PSNR",
        ],
    );
    assert!(stdout.contains("seed 0, work budget 0.36"), "{stdout}");
    each_fails_with(&[
        (
            &[
                "generate",
                "a red circle",
                "--steps",
                "20",
                "--warmup",
                "3",
                "--budget",
                "0.1",
            ],
            "\"budget\" 0.1: below the 4 of 20 steps always computed",
        ),
        (
            &[
                "generate",
                "a red circle",
                "--budget",
                "0.5",
                "--mode",
                "teacache",
            ],
            "applies to modes flashdiff, auto and per-patch only",
        ),
    ]);
    std::fs::remove_dir_all(&dir).ok();
}

/// `generate --model MODEL PROMPT --compare -o FILE` (10 steps, 4 patches): requires the
/// needles in its report and returns the file's bytes.
fn generate_media(model: &str, prompt: &str, file: &str, needles: &[&str]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-{model}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    let args = [
        "generate",
        "--model",
        model,
        prompt,
        "--steps",
        "10",
        "--warmup",
        "2",
        "--patches",
        "4",
        "--compare",
        "-o",
    ];
    succeeds_with(flashdiff().args(args).arg(&path), needles);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    bytes
}

/// `--patch-map` writes the image with its patches' borders; a model that makes no image
/// refuses it before generating.
#[test]
fn generate_writes_the_patch_map_of_an_image_only() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-map-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let map = dir.join("map.png");
    succeeds_with(
        flashdiff()
            .args([
                "generate",
                "a red circle top left on a blue background",
                "--steps",
                "10",
            ])
            .arg("-o")
            .arg(dir.join("img.png"))
            .arg("--patch-map")
            .arg(&map),
        &["patches over the image"],
    );
    let bytes = std::fs::read(&map).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    let out = flashdiff()
        .args(["generate", "--model", "tinyaudio", "a low hum", "-o"])
        .arg(dir.join("a.wav"))
        .arg("--patch-map")
        .arg(dir.join("a.png"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--patch-map") && err.contains("image"),
        "{err}"
    );
    assert!(!dir.join("a.wav").exists(), "generated before refusing");
    std::fs::remove_dir_all(&dir).ok();
}

/// The built-in FLUX runs through the FLUX code with the same report as the other models.
#[test]
fn generate_tinyflux_writes_an_image_and_compares_it() {
    let bytes = generate_media(
        "tinyflux",
        "a red circle top left on a blue background",
        "flux.png",
        &[
            "32x32 pixels",
            "patch-steps computed",
            "checker: ",
            "vs full computation: PSNR",
        ],
    );
    assert_eq!(&bytes[1..4], b"PNG");
}

/// TinyFLUX-L: 64x64 pixels (256 image tokens), its textured backgrounds in the prompt, and
/// the checker of the larger scenes.
#[test]
fn generate_tinyflux_l_writes_a_64_pixel_image_and_compares_it() {
    let bytes = generate_media(
        "tinyflux-l",
        "a red circle top left and a blue square bottom right on a yellow striped background",
        "flux-l.png",
        &[
            "64x64 pixels",
            "patch-steps computed",
            "checker: ",
            "vs full computation: PSNR",
        ],
    );
    assert_eq!(&bytes[1..4], b"PNG");
}

/// TinyFLUX-XL: 128x128 pixels (1024 image tokens), in the same prompt language.
#[test]
fn generate_tinyflux_xl_writes_a_128_pixel_image_and_compares_it() {
    let bytes = generate_media(
        "tinyflux-xl",
        "a green triangle center and a red circle top left on a blue gradient background",
        "flux-xl.png",
        &[
            "128x128 pixels",
            "patch-steps computed",
            "checker: ",
            "vs full computation: PSNR",
        ],
    );
    assert_eq!(&bytes[1..4], b"PNG");
}

#[test]
fn generate_video_writes_an_animated_gif_and_compares_frames() {
    let bytes = generate_media(
        "tinyvideo",
        "a red circle top left moving right on a blue background",
        "clip.gif",
        &[
            "8 frames of 32x32 pixels",
            "patch-steps computed",
            "checker: ",
            "worst frame",
            "temporal (frame differences)",
        ],
    );
    let mut d = gif::DecodeOptions::new().read_info(&bytes[..]).unwrap();
    assert_eq!((d.width(), d.height()), (256, 256));
    let mut frames = 0;
    while d.read_next_frame().unwrap().is_some() {
        frames += 1;
    }
    assert_eq!(frames, 8);
}

#[test]
fn bench_measures_the_video_model_against_every_baseline() {
    let dir = std::env::temp_dir().join(format!("flashdiff-bench-video-{}", std::process::id()));
    let (stdout, _) = succeeds_with(
        flashdiff()
            .args([
                "bench",
                "--model",
                "tinyvideo",
                "--prompts",
                "1",
                "--steps",
                "8",
                "--patches",
                "4",
                "--out-dir",
            ])
            .arg(&dir),
        &[
            "| full |",
            "| flashdiff |",
            "| distrifusion |",
            "| naive-patch |",
            "| ras |",
            "| teacache |",
            "| fewer-steps |",
        ],
    );
    assert!(stdout.contains("temporal PSNR dB"), "{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    assert_eq!(doc["kind"], "video");
    let full = &doc["summary"][0];
    assert_eq!(full["method"], "full");
    assert_eq!(full["fidelity_db"], 99.0);
    assert_eq!(full["agrees_with_full"], 1.0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn generate_audio_writes_a_wav_and_compares_the_sound() {
    let bytes = generate_media(
        "tinyaudio",
        "a high beep then a low hum",
        "sound.wav",
        &[
            "2.05 s of mono sound at 8000 Hz",
            "patch-steps computed",
            "checker: ",
            "SNR",
            "log-spectral distance",
        ],
    );
    assert_eq!(&bytes[..4], b"RIFF");
    assert_eq!(&bytes[8..12], b"WAVE");
    // 16-bit mono: a 44-byte header and two bytes a sample.
    assert_eq!(bytes.len(), 44 + 2 * 16384);
}

#[test]
fn serve_takes_the_model_per_request() {
    let (dir, input) = requests_file(
        "serve-models",
        concat!(
            "{\"id\": 1, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 6, \"warmup\": 2}\n",
            "{\"id\": 2, \"model\": \"tinyvideo\", \"prompt\": \"a red circle top left moving right on a blue background\", \"steps\": 6, \"warmup\": 2}\n",
            "{\"id\": 3, \"model\": \"tinyaudio\", \"prompt\": \"a high beep then a low hum\", \"steps\": 6, \"warmup\": 2}\n",
            "{\"id\": 4, \"model\": \"wan\", \"prompt\": \"a cat\"}\n",
            "{\"id\": 5, \"model\": \"tinyaudio\", \"prompt\": \"a red circle top left on a blue background\"}\n",
        ),
    );
    let out = flashdiff()
        .args(["serve", "--workers", "1", "--input"])
        .arg(&input)
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let by_id = |id: u64| lines.iter().find(|v| v["id"] == id).unwrap().clone();
    for (id, file) in [(1, "1.png"), (2, "2.gif"), (3, "3.wav")] {
        assert_eq!(by_id(id)["ok"], true, "{}", by_id(id));
        assert!(dir.join(file).exists(), "no {file}");
    }
    assert!(by_id(4)["error"]
        .as_str()
        .unwrap()
        .contains("must be one of tinydit, tinyvideo, tinyaudio"));
    assert!(by_id(5)["error"].as_str().unwrap().contains("\"red\""));
    assert!(stderr.contains("3 models"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_model_and_its_output_must_agree() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["generate", "--model", "tinyvideo", "x", "-o", "clip.png"],
            "give a path ending in .gif",
        ),
        (
            &["generate", "--model", "tinyaudio", "x", "-o", "clip.gif"],
            "give a path ending in .wav",
        ),
        (
            &["generate", "--model", "tinydit", "x", "-o", "img.gif"],
            "give a path ending in .png",
        ),
        (
            &[
                "generate",
                "--model",
                "tinyvideo",
                "a red circle top left moving sideways on a blue background",
            ],
            "\"sideways\"",
        ),
        (
            &["generate", "--model", "wan", "x"],
            "invalid value 'wan' for '--model <MODEL>'",
        ),
        (
            &[
                "generate",
                "--model",
                "tinyvideo",
                "--weights",
                "w.safetensors",
                "x",
            ],
            "cannot be used with",
        ),
        (
            &[
                "serve",
                "--port",
                "0",
                "--model",
                "tinyvideo",
                "--ephemeral",
            ],
            "serve it as JSON lines",
        ),
    ];
    each_fails_with(cases);
}

#[test]
fn bad_arguments_name_the_problem() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["generate", "a red dragon on a blue background"],
            "\"dragon\"",
        ),
        (&["generate", " ... "], "the prompt has no words"),
        (&["generate", "x", "--steps", "abc"], "for '--steps <STEPS>'"),
        (
            &["generate", "x", "--steps", "1"],
            "\"steps\" 1: must be in 2..=1000",
        ),
        (
            &["generate", "x", "--workers", "0"],
            "invalid value '0' for '--workers <WORKERS>': 0 is not in 1..=1024",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--epsilon",
                "2",
            ],
            "\"epsilon\" 2: must be in [0, 1]",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--mode",
                "fast",
            ],
            "mode",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--bogus",
            ],
            "unexpected argument '--bogus'",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--reuse",
                "fresh",
            ],
            "for '--reuse <REUSE>': \"reuse\" \"fresh\": expected extrapolate, extrapolate2, corrected, corrected2 or stale",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--monotasks",
                "0",
            ],
            "\"monotasks\" 0: must be at least 1",
        ),
        (
            &[
                "generate",
                "a red circle top on a blue background",
                "--monotasks",
                "all",
            ],
            "invalid value 'all' for '--monotasks <MONOTASKS>': \"monotasks\" \"all\": expected workers, per-patch or a count",
        ),
        (&["generate"], "required arguments were not provided"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
    ];
    each_fails_with(cases);
}

/// `serve --start-window 1`: with two workers or more, a request of the same level waits
/// until the one before it finishes instead of running beside it; the images are the same
/// as without the window. A window of 0 is refused with its range.
#[test]
fn serve_under_a_start_window_runs_one_request_per_level_and_makes_the_same_images() {
    let body = concat!(
        "{\"id\": 1, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 30, \"warmup\": 3, \"seed\": 5, \"patches\": 16}\n",
        "{\"id\": 2, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 30, \"warmup\": 3, \"seed\": 5, \"patches\": 16}\n",
    );
    let run = |extra: &[&str], name: &str| {
        let (dir, input) = requests_file(name, body);
        let out = flashdiff()
            .args(["serve", "--input"])
            .arg(&input)
            .arg("--out-dir")
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
        let latency = |id: u64| {
            let l = lines.iter().find(|v| v["id"] == id).unwrap();
            assert_eq!(l["ok"], true, "{l}");
            l["latency_ms"].as_f64().unwrap()
        };
        let pngs: Vec<Vec<u8>> = [1, 2]
            .iter()
            .map(|i| std::fs::read(dir.join(format!("{i}.png"))).unwrap())
            .collect();
        (latency(1), latency(2), pngs, stderr)
    };
    let (_, _, plain, _) = run(&[], "serve-open");
    let (first, second, windowed, stderr) = run(&["--start-window", "1"], "serve-window");
    assert_eq!(plain, windowed, "the window changed an image");
    // Workers as the server reports them ("on N worker(s)").
    let workers: u32 = stderr
        .split(" on ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    if workers >= 2 {
        // The second ran after the first: about twice its latency (beside it: about equal).
        assert!(
            second > 1.4 * first,
            "second request {second:.0} ms, first {first:.0} ms on {workers} workers"
        );
    }
    let err = fails_with(flashdiff().args(["serve", "--start-window", "0"]), "1..=");
    assert!(err.contains("--start-window"), "{err}");
}

#[test]
fn serve_answers_every_line() {
    let (dir, input) = requests_file(
        "serve",
        concat!(
            "{\"id\": 1, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 8, \"warmup\": 2, \"priority\": 3}\n",
            "{\"id\": 2, \"prompt\": \"a purple dragon on a blue background\", \"steps\": 8, \"warmup\": 2}\n",
            "not json\n",
            "{\"id\": 4, \"prompt\": \"a green cross center on a black background\", \"steps\": 8, \"warmup\": 2, \"mode\": \"full\"}\n",
            "{\"id\": 5, \"prompt\": \"a green cross center on a black background\", \"colour\": 1}\n",
            "{\"id\": 6, \"prompt\": \"a green cross center on a black background\", \"reuse\": \"fresh\"}\n",
            "{\"id\": 7, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 8, \"warmup\": 2, \"reuse\": \"stale\"}\n",
            "{\"id\": 8, \"prompt\": \"a red circle top left on a blue background\", \"monotasks\": 0}\n",
            "{\"id\": 9, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 8, \"warmup\": 2, \"monotasks\": 2}\n",
            "{\"id\": 10, \"prompt\": \"a red circle top left on a blue background\", \"deadline_ms\": 0}\n",
            "{\"id\": 11, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 8, \"warmup\": 2, \"deadline_ms\": 600000}\n",
            "{\"id\": 12, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 3, \"warmup\": 3}\n",
        ),
    );
    let out = flashdiff()
        .args(["serve", "--order", "deadline", "--input"])
        .arg(&input)
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(lines.len(), 12);
    let by_id = |id: u64| {
        lines
            .iter()
            .find(|v| v["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}"))
    };
    assert_eq!(by_id(1)["ok"], true);
    assert!(dir.join("1.png").exists());
    assert_eq!(by_id(4)["ok"], true);
    assert_eq!(by_id(2)["ok"], false);
    assert!(by_id(2)["error"].as_str().unwrap().contains("dragon"));
    assert!(by_id(3)["error"].as_str().unwrap().contains("not JSON"));
    assert!(by_id(5)["error"]
        .as_str()
        .unwrap()
        .contains("unknown field `colour`"));
    assert!(by_id(6)["error"].as_str().unwrap().contains(
        "\"reuse\" \"fresh\": expected extrapolate, extrapolate2, corrected, corrected2 or stale"
    ));
    assert_eq!(by_id(7)["ok"], true);
    assert!(by_id(10)["error"]
        .as_str()
        .unwrap()
        .contains("\"deadline_ms\" 0: must be in 1..=86400000"));
    assert_eq!(by_id(11)["ok"], true);
    assert!(by_id(12)["error"]
        .as_str()
        .unwrap()
        .contains("\"warmup\" 3: must be in 1..=2 (below \"steps\")"));
    assert!(by_id(8)["error"]
        .as_str()
        .unwrap()
        .contains("\"monotasks\" 0: must be at least 1"));
    assert_eq!(by_id(9)["ok"], true);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_writes_json_and_a_report() {
    let dir = std::env::temp_dir().join(format!("flashdiff-bench-{}", std::process::id()));
    let out = flashdiff()
        .args([
            "bench",
            "--prompts",
            "1",
            "--steps",
            "8",
            "--patches",
            "4",
            "--out-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    let methods: Vec<&str> = json["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["method"].as_str().unwrap())
        .collect();
    for m in [
        "full",
        "flashdiff",
        "distrifusion",
        "naive-patch",
        "teacache",
        "ras",
        "fewer-steps",
        "flashdiff-no-gate",
        "flashdiff-uniform",
        "flashdiff-stale",
    ] {
        assert!(methods.contains(&m), "{m} missing from {methods:?}");
    }
    let full = &json["summary"][0];
    assert_eq!(full["method"], "full");
    assert_eq!(full["work"], 1.0);
    assert_eq!(full["patch_steps_skipped"], 0.0);
    let no_gate = json["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["method"] == "flashdiff-no-gate")
        .unwrap();
    assert_eq!(no_gate["patch_steps_skipped"], 0.0);
    assert!(json["serving"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["load"] == "saturated"));
    // FlashDiff's scheduler also serves the trace with every request at one level, and the
    // report reads each level's requests.
    assert!(json["serving"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["method"] == "flashdiff-one-level" && r["load"] != "saturated"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("by the trace's priority level"), "{md}");
    // Loads are multiples of the highest capacity among the other ways of serving whose mean
    // PSNR in the quality table meets 30 dB: recomputed here from the rows.
    let psnr = |m: &str| {
        json["summary"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["method"] == m)
            .and_then(|r| r["psnr_db"].as_f64())
            .unwrap_or(f64::NAN)
    };
    let serving = json["serving"].as_array().unwrap();
    let base = serving
        .iter()
        .filter(|r| r["load"] == "saturated")
        .filter_map(|r| {
            let quality = match r["method"].as_str().unwrap() {
                "distrifusion" | "distrifusion-processes" => "distrifusion",
                "full-fifo" => "full",
                "teacache-fifo" => "teacache",
                _ => return None,
            };
            (psnr(quality) >= 30.0).then(|| r["throughput_rps"].as_f64().unwrap())
        })
        .fold(f64::NAN, f64::max);
    let arrivals = serving
        .iter()
        .find(|r| r["load"] == 1.2)
        .and_then(|r| r["arrival_rps"].as_f64())
        .unwrap();
    assert!(
        (arrivals - 1.2 * base).abs() < 1e-9 * base.max(1.0),
        "arrivals {arrivals} at load 1.2, the strongest baseline's capacity {base}"
    );
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for section in [
        "## Targets",
        "## Scale beyond this machine (simulated)",
        "## Serving a bursty stream",
        "## Sweeps",
        "## Operating points along the sweeps",
    ] {
        assert!(report.contains(section), "report lacks {section}");
    }
    for plot in ["quality_vs_work.svg", "completion_cdf.svg", "scale.svg"] {
        let svg = std::fs::read_to_string(dir.join(plot)).unwrap();
        let drawn = ["<polyline", "<path", "<line"]
            .iter()
            .any(|mark| svg.contains(mark));
        assert!(svg.starts_with("<svg") && drawn, "{plot} has no drawing");
    }
    assert!(json["sweeps"].as_array().unwrap().len() >= 18);
    let bad = flashdiff()
        .args(["bench", "--prompts", "0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("invalid value '0' for '--prompts <PROMPTS>'"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `bench --only wall-time` runs the wall-time study alone: both rows with their verdicts,
/// report.md written, no bench.json; a model it cannot study is refused with the reason.
#[test]
fn bench_only_wall_time_runs_that_study_alone() {
    let dir = std::env::temp_dir().join(format!("flashdiff-bench-wall-{}", std::process::id()));
    let (stdout, _) = succeeds_with(
        flashdiff()
            .args([
                "bench",
                "--only",
                "wall-time",
                "--prompts",
                "1",
                "--steps",
                "6",
                "--out-dir",
            ])
            .arg(&dir),
        &[
            "## Wall time follows work",
            "| in-engine latency",
            "| whole `flashdiff generate` process",
        ],
    );
    assert!(!stdout.contains("| naive-patch |"), "{stdout}");
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("efficiency"), "{report}");
    assert!(!dir.join("bench.json").exists());
    std::fs::remove_dir_all(&dir).ok();
    let out = flashdiff()
        .args(["bench", "--only", "wall-time", "--model", "tinyaudio"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image models only"), "{err}");
}

/// `bench --study curve --methods` runs the named methods beside full computation and no
/// others (under the protocol: candidates on validation prompts, the chosen on test prompts);
/// an unknown name is refused with the study's names, and `--methods` needs `--study`.
#[test]
fn the_curve_study_runs_only_the_methods_asked_for() {
    let dir = std::env::temp_dir().join(format!("flashdiff-curve-only-{}", std::process::id()));
    let study = |methods: &str| {
        let mut c = flashdiff();
        c.args(["bench", "--study", "curve", "--methods", methods])
            .args([
                "--prompts",
                "1",
                "--validation",
                "1",
                "--steps",
                "6",
                "--warmup",
                "2",
                "--out-dir",
            ])
            .arg(&dir);
        c
    };
    succeeds_with(&mut study("whole-step"), &["| whole-step |"]);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("curve.json")).unwrap()).unwrap();
    let names: Vec<&str> = doc["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["whole-step"]);
    let candidates = doc["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 32);
    assert!(candidates.iter().all(|c| c["method"] == "whole-step"));
    let second = candidates
        .iter()
        .filter(|c| c["setting"].as_str().unwrap().ends_with("order 2"))
        .count();
    assert_eq!(second, 16, "{candidates:?}");
    assert_eq!(
        doc["config"]["validation_seeds"],
        serde_json::json!([10000, 10001])
    );
    assert_eq!(
        doc["config"]["test_seeds"],
        serde_json::json!([10001, 10002])
    );
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!report.contains("| ras |"), "{report}");
    assert!(dir.join("quality_vs_work.png").is_file());
    // Run again into the same folder: every result comes from the journal (the first prompt
    // computed again to check this build against it), and the document is the same.
    let out = study("whole-step").output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("continuing from") && err.contains("test prompt 1/1: from the journal"),
        "{err}"
    );
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("curve.json")).unwrap()).unwrap();
    assert_eq!(again, doc);
    std::fs::remove_dir_all(&dir).ok();
    let out = study("whole-step,bogus").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"bogus\"") && err.contains("regional"),
        "{err}"
    );
    let out = flashdiff()
        .args(["bench", "--methods", "whole-step"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--study"));
}

/// `bench --study serving` chooses each method's setting as the curve study does and serves
/// exactly those settings on the test prompts: each way's served fidelity, recomputed from its
/// outputs, is its protocol row's test mean (request i is test prompt i mod the test prompts,
/// with that prompt's seed), and every pair of ways has a latency verdict.
#[test]
fn the_serving_study_serves_the_chosen_settings_on_the_test_prompts() {
    let dir = std::env::temp_dir().join(format!("flashdiff-serving-{}", std::process::id()));
    let mut c = flashdiff();
    c.args([
        "bench",
        "--study",
        "serving",
        "--prompts",
        "2",
        "--validation",
        "1",
    ])
    // 20 steps: regional execution's least work (warm-up, signal and last step) falls under
    // the 0.5 target.
    .args([
        "--steps",
        "20",
        "--warmup",
        "2",
        "--workers",
        "1",
        "--out-dir",
    ])
    .arg(&dir);
    succeeds_with(&mut c, &["## Serving the test prompts", "| regional |"]);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("serving.json")).unwrap()).unwrap();
    let mut served = 0;
    for (t, s) in doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .zip(doc["serving"]["targets"].as_array().unwrap())
    {
        assert_eq!(t["target"], s["target"]);
        if s["served"] != serde_json::json!(true) {
            continue;
        }
        served += 1;
        let rows = s["rows"].as_array().unwrap();
        for r in rows {
            let m = r["method"].as_str().unwrap();
            let chosen = t["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["method"] == m)
                .unwrap();
            assert_eq!(r["setting"], chosen["setting"], "{m}");
            let judged = chosen["db"].as_f64().unwrap();
            let got = r["db"].as_f64().unwrap();
            assert!(
                (got - judged).abs() < 1e-6,
                "{m}: served {got} dB, judged {judged} dB"
            );
            assert_eq!(
                r["way"].as_str().unwrap().ends_with("-fifo"),
                r["fifo"] == true
            );
        }
        assert!(rows
            .iter()
            .any(|r| r["way"] == "regional" && r["fifo"] == false));
        let n = rows.len();
        assert_eq!(s["pairs"].as_array().unwrap().len(), n * (n - 1) / 2);
        for p in s["pairs"].as_array().unwrap() {
            let v = p["verdict"].as_str().unwrap();
            assert!(["ahead", "behind", "level"].contains(&v), "{p}");
        }
    }
    assert!(served > 0, "no target served: {}", doc["serving"]);
    std::fs::remove_dir_all(&dir).ok();
    let out = flashdiff()
        .args(["bench", "--study", "serving", "--methods", "whole-step"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("serving study runs all its methods"), "{err}");
}

/// `serve` streams: a request starts when its line arrives and its result is written when
/// it finishes, while the input is still open.
#[test]
fn serve_answers_each_line_before_the_input_ends() {
    use std::io::{BufRead, BufReader, Write};
    let mut child = flashdiff()
        .args(["serve", "--workers", "1", "--steps", "8", "--warmup", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    writeln!(
        stdin,
        r#"{{"id": 7, "prompt": "a red circle left on a white background"}}"#
    )
    .unwrap();
    stdin.flush().unwrap();
    // Input still open: the answer must come anyway.
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains(r#""id":7,"ok":true"#), "{first}");
    writeln!(stdin, "not json").unwrap();
    stdin.flush().unwrap();
    let second = lines.next().unwrap().unwrap();
    assert!(
        second.contains("line 2: ") && second.contains("not JSON"),
        "{second}"
    );
    drop(stdin);
    assert!(lines.next().is_none());
    assert!(child.wait().unwrap().success());
}

/// `--device cuda` runs on GPU 0 where the build and the machine have CUDA; anywhere else
/// it is a clear error naming the flag and what is missing, never a crash.
#[test]
fn device_cuda_works_or_says_what_is_missing() {
    let out = flashdiff()
        .args(["generate", "a red circle top left on a blue background"])
        .args(["--steps", "4", "--warmup", "1", "--device", "cuda", "-o"])
        .arg(std::env::temp_dir().join(format!("fd-cuda-{}.png", std::process::id())))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        eprintln!("CUDA present: generated on the GPU");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--device cuda"), "{err}");
    assert!(
        err.contains("--features cuda") || err.contains("no usable CUDA device"),
        "{err}"
    );
    let out = flashdiff()
        .args(["generate", "x", "--device", "tpu"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device"));
}

/// Width and height of a PNG, from its header.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

/// `generate --model flux-dev --weights DIR` on the small random pipeline (T5, CLIP, both
/// tokenizers, the transformer and the VAE in diffusers' layout): it skips
/// patch-steps, reports, decodes through the VAE at the asked size, and is deterministic.
#[test]
fn generate_runs_a_flux_pipeline_folder() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-flux-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flashdiff_models::pipelines::tiny::write_flux(&dir.join("model"), true).unwrap();
    let run = |out: &str, dtype: &str| {
        let png = dir.join(out);
        let (stdout, stderr) = succeeds_with(
            flashdiff()
                .args([
                    "generate",
                    "--model",
                    "flux-dev",
                    "--dtype",
                    dtype,
                    "--weights",
                ])
                .arg(dir.join("model"))
                .args(["--size", "128x96", "--steps", "12", "--guidance", "4"])
                // Random weights move block 0's input by more than any change budget each
                // step, so the patch skipping is exercised through the paper's gate.
                .args(["--mode", "patch-gate"])
                .args([
                    "a red dishwasher on the left of a blue table",
                    "--compare",
                    "-o",
                ])
                .arg(&png),
            &[
                "128x96 pixels, shown 2x",
                "patch-steps computed",
                "skipped",
                "vs full computation: PSNR",
                "checker: none",
            ],
        );
        assert!(stderr.contains("loading flux-dev"), "{stderr}");
        assert!(stderr.contains("step 12/12"), "no progress shown: {stderr}");
        let skipped = stdout
            .lines()
            .find(|l| l.starts_with("patch-steps computed"))
            .unwrap()
            .to_string();
        assert!(!skipped.contains("(0.0% skipped)"), "{skipped}");
        std::fs::read(&png).unwrap()
    };
    let a = run("a.png", "f32");
    assert_eq!(png_size(&a), (256, 192));
    assert_eq!(run("b.png", "f32"), a, "same request, same image");
    // bf16 compute (transformer and T5): the same path, a slightly different image.
    let h = run("h.png", "bf16");
    assert_eq!(png_size(&h), (256, 192));
    assert_ne!(h, a, "--dtype bf16 gave f32's image bit for bit");
    // SD3.5 (CLIP-L, CLIP-G, T5, classifier-free guidance) the same way.
    flashdiff_models::pipelines::tiny::write_sd3(&dir.join("sd35"), true).unwrap();
    let png = dir.join("sd.png");
    let (stdout, _) = succeeds_with(
        flashdiff()
            .args(["generate", "--model", "sd3.5", "--weights"])
            .arg(dir.join("sd35"))
            .args([
                "--size",
                "64x48",
                "--steps",
                "10",
                "--mode", // random weights: see the FLUX case
                "patch-gate",
                "a red cat on a blue table",
                "-o",
            ])
            .arg(&png),
        &["64x48 pixels, shown 4x", "patch-steps computed"],
    );
    assert!(!stdout.contains("(0.0% skipped)"), "{stdout}");
    assert_eq!(png_size(&std::fs::read(&png).unwrap()), (256, 192));
    let out = flashdiff()
        .args(["generate", "--model", "sd3", "--weights"])
        .arg(dir.join("sd35"))
        .args(["--size", "64x48", "x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("so it is sd3.5, not sd3"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `generate --model stable-audio-open --weights DIR` on the small random pipeline (T5,
/// the seconds' embedders, the DiT, the Oobleck VAE): a stereo WAV of the
/// asked length, patch-steps skipped, the report and `--compare`, the same file twice.
#[test]
fn generate_runs_a_stable_audio_folder() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-sao-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flashdiff_models::pipelines::tiny::write_sao(&dir.join("model")).unwrap();
    let run = |out: &str| {
        let wav = dir.join(out);
        let (_, stderr) = succeeds_with(
            flashdiff()
                .args(["generate", "--model", "stable-audio-open", "--weights"])
                .arg(dir.join("model"))
                .args(["--seconds", "0.05", "--steps", "16"])
                .args(["a dog barking in the rain", "--compare", "-o"])
                .arg(&wav),
            &[
                "0.05 s of stereo sound at 8000 Hz",
                "patch-steps computed",
                "vs full computation: SNR",
            ],
        );
        assert!(stderr.contains("step 16/16"), "no progress shown: {stderr}");
        std::fs::read(&wav).unwrap()
    };
    let a = run("a.wav");
    assert_eq!(&a[..4], b"RIFF");
    assert_eq!(u16::from_le_bytes([a[22], a[23]]), 2, "two channels");
    assert_eq!(
        u32::from_le_bytes([a[24], a[25], a[26], a[27]]),
        8000,
        "sample rate"
    );
    assert_eq!(a.len(), 44 + 400 * 2 * 2, "400 stereo 16-bit frames");
    assert_eq!(run("b.wav"), a, "same request, same sound");
    for (args, needle) in [
        (&["--seconds", "1"][..], "at most 0.06 s"),
        (
            &["--size", "64x64"][..],
            "--size: stable-audio-open makes sound",
        ),
    ] {
        generate_fails_with("stable-audio-open", &dir, "c.wav", args, needle);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `generate --model wan2.1 --weights DIR` on the small random pipeline (umT5, the
/// transformer): an animated GIF of the latent preview, patch-steps skipped, the report and
/// `--compare`, the same file twice; frame counts Wan cannot make are errors.
#[test]
fn generate_runs_a_wan_folder() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-wan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flashdiff_models::pipelines::tiny::write_wan(&dir.join("model")).unwrap();
    let run = |out: &str| {
        let gif = dir.join(out);
        let (stdout, stderr) = succeeds_with(
            flashdiff()
                .args(["generate", "--model", "wan2.1", "--weights"])
                .arg(dir.join("model"))
                .args(["--size", "64x48", "--frames", "9", "--steps", "12"])
                .args(["--epsilon", "1"]) // as for FLUX: random weights
                .args(["a red fox running in the snow", "--compare", "-o"])
                .arg(&gif),
            &[
                "9 frames of 64x48 pixels, shown 4x",
                "patch-steps computed",
                "vs full computation: PSNR",
            ],
        );
        assert!(!stdout.contains("(0.0% skipped)"), "{stdout}");
        assert!(stderr.contains("step 12/12"), "no progress shown: {stderr}");
        std::fs::read(&gif).unwrap()
    };
    let a = run("a.gif");
    assert_eq!(&a[..6], b"GIF89a");
    assert_eq!(run("b.gif"), a, "same request, same clip");
    for (args, needle) in [
        (&["--frames", "10"][..], "1 + 4k frames"),
        (
            &["--seconds", "2"][..],
            "--seconds applies to stable-audio-open",
        ),
    ] {
        generate_fails_with("wan2.1", &dir, "c.gif", args, needle);
    }
    let out = flashdiff()
        .args(["generate", "--frames", "9", "x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--frames applies to wan2.1"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `flashdiff generate ... | head -1`: a reader that closes the output early ends the
/// process by SIGPIPE, as for any filter, never with a panic.
#[test]
fn a_closed_stdout_ends_generate_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::env::temp_dir().join(format!("flashdiff-pipe-{}.png", std::process::id()));
    let mut child = flashdiff()
        .args(["generate", "a red circle", "--steps", "8", "-o"])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        done.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}",
        done.status
    );
    std::fs::remove_file(&out).ok();
}

#[test]
fn pipeline_flags_get_errors_that_name_them() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["generate", "--model", "flux-dev", "x"],
            "needs --weights DIR",
        ),
        (
            &["generate", "--size", "64x64", "x"],
            "--size, --guidance and --dtype apply to the pipelines",
        ),
        (
            &["generate", "--guidance", "2", "x"],
            "--size, --guidance and --dtype apply to the pipelines",
        ),
        (
            &["generate", "--dtype", "bf16", "x"],
            "--size, --guidance and --dtype apply to the pipelines",
        ),
        (
            &["generate", "--model", "flux-dev", "--dtype", "f16", "x"],
            "possible values: f32, bf16",
        ),
        (
            &["generate", "--model", "flux-dev", "--size", "100x64", "x"],
            "multiple of 16",
        ),
        (
            &["generate", "--model", "flux-dev", "--size", "64", "x"],
            "WIDTHxHEIGHT",
        ),
        (
            &["generate", "--model", "flux-dev", "--guidance", "nan", "x"],
            "[0, 100]",
        ),
        (
            &[
                "generate",
                "--model",
                "flux-schnell",
                "--weights",
                "/nonexistent/flux",
                "x",
            ],
            "is not a folder",
        ),
        (
            &["bench", "--model", "flux-dev", "--weights", "/tmp"],
            "built-in",
        ),
    ];
    each_fails_with(cases);
}

/// JSON-lines `serve` over a pipeline folder: requests for it (named or not) run on it, a
/// built-in model a request names runs at its own size, and a pipeline the server did not
/// load is an error that says so.
#[test]
fn serve_runs_a_flux_pipeline_beside_the_built_in_models() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-fluxserve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flashdiff_models::pipelines::tiny::write_flux(&dir.join("model"), false).unwrap();
    let mut child = flashdiff()
        .args(["serve", "--model", "flux-schnell", "--weights"])
        .arg(dir.join("model"))
        .args([
            "--size",
            "64x32",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--out-dir",
        ])
        .arg(dir.join("out"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            concat!(
                r#"{"id": 1, "prompt": "a red cat"}"#,
                "\n",
                r#"{"id": 2, "prompt": "a red cat", "model": "flux-dev"}"#,
                "\n",
                r#"{"id": 3, "prompt": "a red circle left on a white background", "model": "tinydit"}"#,
                "\n",
                r#"{"id": 4, "prompt": "a red cat", "model": "flux-schnell"}"#,
                "\n"
            )
            .as_bytes(),
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&stdout);
    let by_id = |id: u64| lines.iter().find(|l| l["id"] == id).unwrap().clone();
    assert!(by_id(2)["error"]
        .as_str()
        .unwrap()
        .contains("not loaded by this server"));
    for (id, side) in [(1, 64 * 4), (3, 256), (4, 64 * 4)] {
        let l = by_id(id);
        assert_eq!(l["ok"], true, "{l}");
        let png = std::fs::read(l["image"].as_str().unwrap()).unwrap();
        assert_eq!(png_size(&png).0, side, "request {id}");
    }
    assert_eq!(
        std::fs::read(by_id(1)["image"].as_str().unwrap()).unwrap(),
        std::fs::read(by_id(4)["image"].as_str().unwrap()).unwrap(),
        "the server's own model, named or not, is the same engine"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A request that names no warm-up gets its model's: TinyAudio's 12 (measured), the image
/// model's 5; a warm-up given on the command line or in the request wins.
#[test]
fn each_model_gets_its_own_warm_up_unless_one_is_given() {
    let (dir, input) = requests_file(
        "warmups",
        concat!(
            "{\"id\": 1, \"model\": \"tinyaudio\", \"prompt\": \"a low hum\", \"steps\": 20, \"patches\": 4}\n",
            "{\"id\": 2, \"model\": \"tinyaudio\", \"prompt\": \"a low hum\", \"steps\": 20, \"patches\": 4, \"warmup\": 3}\n",
            "{\"id\": 3, \"prompt\": \"a red circle top left on a blue background\", \"steps\": 20, \"patches\": 4}\n",
        ),
    );
    // patch_steps = patches x (steps - warm-up).
    let gated = |args: &[&str]| -> Vec<u64> {
        let out = flashdiff()
            .args(["serve", "--workers", "1", "--input"])
            .arg(&input)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = json_lines(&String::from_utf8_lossy(&out.stdout));
        lines.sort_by_key(|v| v["id"].as_u64());
        lines
            .iter()
            .map(|v| v["patch_steps"].as_u64().unwrap() / 4)
            .collect()
    };
    assert_eq!(gated(&[]), vec![20 - 12, 20 - 3, 20 - 5]);
    assert_eq!(gated(&["--warmup", "4"]), vec![20 - 4, 20 - 3, 20 - 4]);
    // With fewer steps than that default allows it shrinks to fit instead of refusing a
    // warm-up nobody asked for (the image model's 5 as well).
    for (steps, said) in [
        ("20", "20 steps (12 warm-up)"),
        ("8", "8 steps (7 warm-up)"),
    ] {
        succeeds_with(
            flashdiff()
                .args([
                    "generate",
                    "--model",
                    "tinyaudio",
                    "a low hum",
                    "--steps",
                    steps,
                ])
                .arg("-o")
                .arg(dir.join(format!("hum{steps}.wav"))),
            &[said],
        );
    }
    succeeds_with(
        flashdiff()
            .args([
                "generate",
                "a red circle top left on a blue background",
                "--steps",
                "3",
                "-o",
            ])
            .arg(dir.join("three.png")),
        &["3 steps (2 warm-up)"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--mode dbcache`: the built-in image model runs it (the first block every step, the rest
/// skipped at a loose threshold, so the work skipped is below the patch-steps skipped: a
/// skipped step still runs one of six blocks); a model whose forward runs only whole refuses
/// it before generating, naming the mode.
#[test]
fn generate_runs_dbcache_where_the_model_runs_its_blocks_apart() {
    let dir = std::env::temp_dir().join(format!("flashdiff-cli-dbcache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 20 steps, 3 warm-up, a threshold nothing reaches and no skip cap: the first step after
    // the warm-up and the last computed, 15 skipped at a sixth of a step each.
    let (stdout, _) = succeeds_with(
        flashdiff()
            .args([
                "generate",
                "a red circle top left on a blue background",
                "--steps",
                "20",
                "--warmup",
                "3",
                "--mode",
                "dbcache",
                "--cache-threshold",
                "1000",
                "--max-skip",
                "1000",
                "-o",
            ])
            .arg(dir.join("out.png")),
        &[
            "patch-steps computed 2 of 17",
            "model FLOPs 0.379 of full computation's",
        ],
    );
    assert!(stdout.contains("dbcache"), "{stdout}");
    each_fails_with(&[(
        &[
            "generate",
            "a red circle",
            "--model",
            "tinyflux",
            "--mode",
            "dbcache",
        ],
        "dbcache runs the model's first block alone",
    )]);
    std::fs::remove_dir_all(&dir).ok();
}
