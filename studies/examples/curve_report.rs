//! Writes a curve study's report again from its `curve.json`, with this version's verdict:
//! `cargo run --release -p flashdiff-studies --example curve_report -- DIR`.

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: curve_report DIR (a folder holding a curve study's curve.json)");
        std::process::exit(2);
    };
    match flashdiff_studies::curve::reread(std::path::Path::new(&dir)) {
        Ok(md) => print!("{md}"),
        Err(e) => {
            eprintln!("curve_report: {e}");
            std::process::exit(1);
        }
    }
}
