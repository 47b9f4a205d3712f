//! Writes a small random FLUX pipeline folder (diffusers layout, real structure, toy sizes):
//! `cargo run --release -p flashdiff-models --example tiny_flux -- DIR [dev|schnell]`, then
//! `flashdiff generate --model flux-dev --weights DIR --size 128x128 "a red cat"`.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: tiny_flux DIR [dev|schnell]");
        return std::process::ExitCode::from(2);
    };
    let dev = match args.get(1).map(String::as_str) {
        None | Some("dev") => true,
        Some("schnell") => false,
        Some(other) => {
            eprintln!("expected dev or schnell, got {other:?}");
            return std::process::ExitCode::from(2);
        }
    };
    match flashdiff_models::pipeline::tiny::write_flux(std::path::Path::new(dir), dev) {
        Ok(()) => {
            println!(
                "wrote a small random FLUX.1 {} pipeline to {dir}",
                if dev { "dev" } else { "schnell" }
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
