//! Every relative link in the README, docs/ and the model cards resolves to a file or folder
//! inside the repository: a user who clones it finds what the docs point to.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The markdown files users read.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    for dir in [
        "docs",
        "models/tinydit",
        "models/tinyvideo",
        "models/tinyaudio",
        "python",
    ] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "md") {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Targets of `[text](target)` and `![alt](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = root();
    let mut broken = vec![];
    let mut checked = 0;
    for page in pages(&root) {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap();
            let resolved = page.parent().unwrap().join(path);
            let inside = resolved
                .canonicalize()
                .map(|p| p.starts_with(&root))
                .unwrap_or(false);
            checked += 1;
            if !inside {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} links found: is the README there?"
    );
    assert!(
        broken.is_empty(),
        "links that do not resolve inside the repository:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_reader_finds_links() {
    assert_eq!(
        links("see [a](docs/a.md) and ![i](img/x.png#y), not [b] (c)"),
        ["docs/a.md", "img/x.png#y"]
    );
}
