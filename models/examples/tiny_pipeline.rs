//! Writes a small random pipeline folder (diffusers layout, the real structure of every part,
//! toy sizes): `cargo run --release -p flashdiff-models --features fixtures --example tiny_pipeline -- DIR MODEL`
//! with MODEL one of flux-dev, flux-schnell, sd3, sd3.5; then `flashdiff generate --model
//! MODEL --weights DIR --size 128x128 "a red cat"`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--version") {
        println!("tiny_pipeline {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let (Some(dir), Some(model)) = (args.first(), args.get(1)) else {
        eprintln!(
            "usage: tiny_pipeline DIR flux-dev|flux-schnell|sd3|sd3.5|wan2.1|stable-audio-open"
        );
        return ExitCode::from(2);
    };
    let dir = std::path::Path::new(dir);
    use flashdiff_models::pipelines::tiny;
    let written = match model.as_str() {
        "flux-dev" => tiny::write_flux(dir, true),
        "flux-schnell" => tiny::write_flux(dir, false),
        "sd3" => tiny::write_sd3(dir, false),
        "sd3.5" => tiny::write_sd3(dir, true),
        "stable-audio-open" => tiny::write_sao(dir),
        "wan2.1" => tiny::write_wan(dir),
        other => {
            eprintln!(
                "unknown model {other:?}: flux-dev, flux-schnell, sd3, sd3.5, wan2.1 or \
                 stable-audio-open"
            );
            return ExitCode::from(2);
        }
    };
    match written {
        Ok(()) => {
            println!("wrote a small random {model} pipeline to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
