//! models/src is in layers, each importing only from the layers below it: `io` (files),
//! `families` (the transformers, the built-in languages), `encoders` and `decoders` (the
//! released pipelines' text encoders and VAEs), `pipelines` (assemblies and the registry).
//! `lib.rs`, the contract, sits under them all.

use std::path::{Path, PathBuf};

const LAYERS: [(&str, u8); 5] = [
    ("io", 0),
    ("families", 1),
    ("encoders", 2),
    ("decoders", 2),
    ("pipelines", 3),
];

fn rank(layer: &str) -> Option<u8> {
    LAYERS.iter().find(|l| l.0 == layer).map(|l| l.1)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("models/src") {
        let p = e.expect("an entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The layers a source file names through `crate::LAYER` (comments left out).
fn uses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if rank(&name).is_some() {
                found.push(name);
            }
            rest = &rest[at + 7..];
        }
    }
    found
}

#[test]
fn no_layer_imports_from_its_own_level_or_above() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    let mut seen = 0;
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let Some(layer) = rel.components().next().and_then(|c| c.as_os_str().to_str()) else {
            continue;
        };
        let Some(own) = rank(layer) else {
            continue;
        };
        seen += 1;
        let text = std::fs::read_to_string(&f).expect("a source file");
        for other in uses(&text) {
            if other != layer && rank(&other).is_some_and(|r| r >= own) {
                wrong.push(format!("{} uses crate::{other}", rel.display()));
            }
        }
    }
    assert!(seen > 20, "only {seen} files found under the layers");
    assert!(wrong.is_empty(), "imports running up or across: {wrong:#?}");
}

#[test]
fn the_check_sees_an_import_running_up() {
    assert_eq!(
        uses("use crate::pipelines::registry; // crate::io"),
        ["pipelines"]
    );
    assert!(uses("// use crate::pipelines::registry;").is_empty());
}
