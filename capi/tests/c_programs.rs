//! Compiles the C programs in `tests/c/` against `include/flashdiff.h` with
//! `-std=c11 -Wall -Wextra -Wpedantic -Werror`, links them once against `libflashdiff.a` and
//! once against `libflashdiff.so`, once more with `-fsanitize=address,undefined`, runs them,
//! and checks that the header also compiles as C++. Needs a C compiler (`cc`, `c++`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory holding libflashdiff.{a,so} (target/<profile>), rebuilt once per test run:
/// `cargo test` builds only the rlib, so without this the C programs could link a stale
/// static or shared library from an earlier `cargo build`. Built with the package and
/// target selection of `cargo test --workspace` (every member, every target), so cargo
/// unifies the same dependency features and reuses what the test build compiled; `-p
/// flashdiff-capi` alone resolved other features and recompiled candle and everything
/// above it (8 of CI's 34 minutes).
fn lib_dir() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let st = Command::new(env!("CARGO"))
            .args(["build", "--workspace", "--all-targets"])
            .current_dir(root())
            .status()
            .expect("run cargo build for libflashdiff");
        assert!(st.success(), "cargo build -p flashdiff-capi failed");
    });
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/..")
        .to_path_buf();
    for lib in ["libflashdiff.a", "libflashdiff.so"] {
        assert!(
            dir.join(lib).exists(),
            "{} not built next to the tests ({})",
            lib,
            dir.display()
        );
    }
    dir
}

fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-ctests-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

const CFLAGS: &[&str] = &[
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Werror",
    "-g",
];
/// What a Rust staticlib needs from the system (rustc --print native-static-libs).
const STATIC_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

#[derive(Clone, Copy, Debug)]
enum Link {
    Static,
    Shared,
    Sanitized,
    /// Shared, the C side built with ThreadSanitizer.
    Thread,
}

fn build(sources: &[&str], link: Link, name: &str) -> PathBuf {
    build_with(sources, link, name, &[])
}

fn build_with(sources: &[&str], link: Link, name: &str, extra: &[&str]) -> PathBuf {
    let lib = lib_dir();
    let exe = out_dir().join(format!("{name}-{link:?}"));
    let mut cmd = Command::new("cc");
    cmd.args(CFLAGS).arg("-I").arg(root().join("include"));
    for s in sources {
        cmd.arg(root().join("tests/c").join(s));
    }
    match link {
        Link::Static | Link::Sanitized => {
            if matches!(link, Link::Sanitized) {
                cmd.args([
                    "-fsanitize=address,undefined",
                    "-fno-omit-frame-pointer",
                    "-fno-sanitize-recover=all",
                ]);
            }
            cmd.arg(lib.join("libflashdiff.a")).args(STATIC_LIBS);
        }
        Link::Shared | Link::Thread => {
            if matches!(link, Link::Thread) {
                cmd.args(["-fsanitize=thread", "-fno-omit-frame-pointer"]);
            }
            cmd.arg("-L")
                .arg(&lib)
                .arg("-lflashdiff")
                .arg(format!("-Wl,-rpath,{}", lib.display()))
                .arg("-lm");
        }
    }
    cmd.args(extra).arg("-o").arg(&exe);
    let out = cmd
        .output()
        .expect("run cc (a C compiler is required for these tests)");
    assert!(
        out.status.success(),
        "compiling {sources:?} ({link:?}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn weights() -> PathBuf {
    root().join("models/tinydit/tinydit.safetensors")
}

/// ThreadSanitizer sees the C program's accesses; inside libflashdiff (not instrumented) it
/// cannot see the Rust locks and latches that order them, so it would flag the library's
/// own memcpys and mallocs between threads. Those calls are left out by library.
fn tsan_suppressions() -> PathBuf {
    let p = out_dir().join("tsan.supp");
    std::fs::write(&p, "called_from_lib:libflashdiff.so\n").expect("write suppressions");
    p
}

fn run(exe: &Path) -> String {
    run_on(exe, &weights())
}

/// Runs a C program on the model at `model` (its one argument).
fn run_on(exe: &Path, model: &Path) -> String {
    let out = Command::new(exe)
        .arg(model)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .env(
            "TSAN_OPTIONS",
            format!(
                "halt_on_error=1:exitcode=66:suppressions={}",
                tsan_suppressions().display()
            ),
        )
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .output()
        .expect("run C program");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}\n{}",
        exe.display(),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn example_server_runs_static_shared_and_sanitized() {
    for link in [Link::Static, Link::Shared, Link::Sanitized] {
        let out = run(&build(&["example_server.c"], link, "example_server"));
        assert!(out.contains("all requests:"), "{out}");
        assert!(out.contains("request 3 step"), "{out}");
    }
}

/// The `expect(...)` calls written in a C test program (each runs once: none is in a loop).
fn expect_calls(file: &str) -> u32 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/c")
        .join(file);
    let src = std::fs::read_to_string(&path).unwrap();
    src.matches("expect(").count() as u32 - u32::from(src.contains("static void expect("))
}

#[test]
fn bad_input_suite_static_shared_and_sanitized() {
    for link in [Link::Static, Link::Shared, Link::Sanitized] {
        let out = run(&build(&["bad_input.c", "second_unit.c"], link, "bad_input"));
        let last = out.lines().last().unwrap_or("");
        assert!(last.ends_with(" 0 failed"), "{out}");
        let passed: u32 = last
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert_eq!(
            passed,
            expect_calls("bad_input.c"),
            "not every check of the suite ran:\n{out}"
        );
    }
}

#[test]
fn engine_example_generates_from_c() {
    for link in [Link::Static, Link::Shared, Link::Sanitized] {
        let out = run(&build(&["engine_example.c"], link, "engine_example"));
        assert!(out.contains("PSNR vs full"), "{out}");
    }
    // The same program on the built-in FLUX models, whose weights are folders.
    let exe = build(&["engine_example.c"], Link::Static, "engine_example");
    for folder in ["models/tinyflux", "models/tinyflux-l", "models/tinyflux-xl"] {
        let out = run_on(&exe, &root().join(folder));
        assert!(out.contains("PSNR vs full"), "{folder}: {out}");
    }
}

/// One engine handle shared by a serving loop (fd_engine_step), a thread submitting
/// arrivals and a thread polling and cancelling, then fd_engine_run on one thread while
/// another cancels and submits; plus the status codes of awkward call orders. Built with
/// -pthread; once more with ThreadSanitizer on the C side against the shared library (the
/// Rust library itself is not instrumented: that needs a rebuilt standard library, which
/// this toolchain lacks; its shared state sits behind one mutex).
#[test]
fn engine_handle_is_shared_between_threads() {
    for link in [Link::Static, Link::Shared, Link::Thread] {
        let exe = build_with(&["engine_threads.c"], link, "engine_threads", &["-pthread"]);
        let out = run(&exe);
        assert!(out.contains("while requests kept arriving"), "{out}");
        assert!(out.contains("threads ok"), "{out}");
    }
}

/// A C host with SIGPIPE at its default action survives workers killed between runs, the
/// only worker dying, and a worker executable that exits at once (SIGPIPE default, then
/// ignored: an error soon, not a respawn storm); sizes at their limits and bad loads are
/// errors; and the library writes nothing to the host's stderr (messages go to the log
/// callback, which counts them).
#[test]
fn a_c_host_survives_worker_faults_without_sigpipe() {
    let exits = out_dir().join("exits-at-once.sh");
    std::fs::write(&exits, "#!/bin/sh\nexit 3\n").expect("write script");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exits, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let flashdiff = lib_dir().join("flashdiff");
    assert!(flashdiff.exists(), "{} not built", flashdiff.display());
    for link in [Link::Static, Link::Shared, Link::Sanitized] {
        let exe = build(&["host_faults.c"], link, "host_faults");
        let out = Command::new(&exe)
            .arg(weights())
            .arg(&flashdiff)
            .arg(&exits)
            .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
            .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
            .output()
            .expect("run host_faults");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{link:?}: host died or failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        assert!(stdout.contains("host ok"), "{stdout}");
        assert!(
            stderr.trim().is_empty(),
            "{link:?}: the library wrote to the host's stderr:\n{stderr}"
        );
    }
}

#[test]
fn header_compiles_as_cpp() {
    let out = Command::new("c++")
        .args([
            "-fsyntax-only",
            "-x",
            "c++",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .arg(root().join("include/flashdiff.h"))
        .output()
        .expect("run c++");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn install_script_writes_a_usable_pkg_config_file() {
    let prefix = out_dir().join("prefix");
    let out = Command::new("bash")
        .arg(root().join("capi/install.sh"))
        .arg(&prefix)
        .arg(lib_dir())
        .output()
        .expect("run capi/install.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pc =
        std::fs::read_to_string(prefix.join("lib/pkgconfig/flashdiff.pc")).expect(".pc written");
    assert!(
        pc.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "{pc}"
    );
    for f in [
        "lib/libflashdiff.a",
        "lib/libflashdiff.so",
        "include/flashdiff.h",
    ] {
        assert!(prefix.join(f).exists(), "{f} not installed");
    }
    // Build the example with exactly the flags the .pc file gives (expanded by hand, so the
    // test needs no pkg-config binary).
    let exe = out_dir().join("example_from_prefix");
    let inc = prefix.join("include");
    let lib = prefix.join("lib");
    let st = Command::new("cc")
        .args(CFLAGS)
        .arg(format!("-I{}", inc.display()))
        .arg(root().join("tests/c/example_server.c"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lflashdiff")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc");
    assert!(st.success());
    run(&exe);
}
