//! `flashdiff`: generate with the built-in model, serve a request stream, run the bench.

mod args;
mod bench;
mod generate;
mod http;
mod journal;
mod serve;
mod setup;

use std::process::ExitCode;

use crate::args::Cli;
use crate::args::Cmd;
use crate::bench::bench;
use crate::generate::generate;
use crate::serve::serve;
use flashdiff_runtime::models::pipelines::registry::ModelSpec;

/// For the one-shot commands (`generate`, `bench`): a reader that closes our standard
/// output early (`flashdiff generate ... | head`) ends the process quietly, as for any
/// Unix filter, instead of a panic on the failed print. Not for `serve`, whose sockets must
/// not raise SIGPIPE; worker-pipe writer threads block SIGPIPE themselves (`proc.rs`).
fn quiet_on_closed_stdout() {
    // SAFETY: called on the main thread before any other thread of ours exists for this
    // command; SIG_DFL is a valid disposition for SIGPIPE and changes nothing in memory.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Keeps freed memory in the process instead of handing it back to the kernel after every
/// step: candle allocates each op's output afresh, and with glibc's defaults buffers over
/// 128 KiB are mapped and unmapped per op, a page fault per 4 KiB each time (about 900 of
/// them in one `generate`). The heap then stays at its peak, which is what a server wants.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called first thing in main,
    // before any other thread exists, with parameters glibc documents for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

/// The library's log lines (worker losses, retries, a worker's own stderr) on stderr,
/// prefixed like the CLI's own messages.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("flashdiff: {}", r.args());
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    keep_freed_memory();
    static LOG: StderrLog = StderrLog;
    if log::set_logger(&LOG).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let given = matches.subcommand().is_some_and(|(name, m)| {
        name != "worker" && m.value_source("model") == Some(clap::parser::ValueSource::CommandLine)
    });
    let mut cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match &mut cli.cmd {
        Cmd::Generate(a) => a.run.model_given = given,
        Cmd::Serve(a) => a.run.model_given = given,
        Cmd::Bench(a) => a.run.model_given = given,
        Cmd::Worker { .. } => {}
    }
    let result = match cli.cmd {
        Cmd::Generate(a) => {
            quiet_on_closed_stdout();
            generate(a)
        }
        Cmd::Serve(a) => serve(a),
        Cmd::Bench(a) => {
            quiet_on_closed_stdout();
            bench(a)
        }
        Cmd::Worker { spec } => ModelSpec::from_worker_args(&spec)
            .and_then(|spec| flashdiff_runtime::proc::worker_main(&spec)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
