//! Starting `flashdiff serve --port 0` from a test: the address it bound and its stderr.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A running server.
pub struct Spawned {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Everything the server wrote to stderr so far (drained on a thread, so the server
    /// never blocks on a full pipe). Not every test reads it.
    #[allow(dead_code)]
    pub log: Arc<Mutex<String>>,
}

/// Spawns `cmd` (a `serve --port 0` command line) and waits for the line that names its
/// address; panics if the server exits first.
pub fn spawn(cmd: &mut Command) -> Spawned {
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start flashdiff serve");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let log = Arc::new(Mutex::new(String::new()));
    let mut line = String::new();
    while !line.contains("http://") {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("a line") > 0,
            "the server exited before it served: {}",
            log.lock().unwrap()
        );
        log.lock().unwrap().push_str(&line);
    }
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let sink = log.clone();
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&l);
            s.push('\n');
        }
    });
    Spawned {
        child,
        base: format!("http://{addr}"),
        log,
    }
}
