//! The report's SVG plots: quality against work, completion times, simulated scale.

use std::path::Path;

use serde_json::{json, Value};

use crate::colours;

/// What drawing a plot returns.
pub(crate) type PlotResult = Result<(), Box<dyn std::error::Error>>;

/// Writes the SVG picture at `svg` as a PNG at `png` (its own size; the text in the system's
/// fonts, left out where the machine has none).
pub(crate) fn svg_to_png(svg: &Path, png: &Path) -> PlotResult {
    use resvg::{tiny_skia, usvg};
    let mut opt = usvg::Options::default();
    let fonts = opt.fontdb_mut();
    fonts.load_system_fonts();
    // The pictures ask for "sans-serif", which the font database maps to Arial: map it to a
    // sans-serif family the machine has.
    let sans = fonts
        .faces()
        .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
        .find(|n| n.contains("Sans") && !n.contains("Mono"));
    if let Some(name) = sans {
        fonts.set_sans_serif_family(name);
    }
    let text = std::fs::read_to_string(svg)?;
    let tree = usvg::Tree::from_str(&text, &opt)?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| format!("{}: an empty picture", svg.display()))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.save_png(png)?;
    Ok(())
}

/// The report's plots as SVG.
pub(crate) fn plots(
    out: &Path,
    summary: &[Value],
    sweeps: &[Value],
    serving: &[Value],
    scale: &[Value],
) -> PlotResult {
    plot_quality(out, summary, sweeps)?;
    plot_completion(out, serving)?;
    plot_scale(out, scale)
}

/// Quality against work: a curve per sweep family, a point per method.
pub(crate) fn plot_quality(out: &Path, summary: &[Value], sweeps: &[Value]) -> PlotResult {
    use plotters::prelude::*;
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let colours = colours();
    // Quality against work: a curve per sweep family, a point per method.
    let path = out.join("quality_vs_work.svg");
    let root = SVGBackend::new(&path, (760, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = sweeps
        .iter()
        .chain(summary)
        .map(|v| f(v, "psnr_db"))
        .fold(30.0f64, f64::max)
        .min(100.0)
        + 5.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "quality vs work (PSNR against full computation)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..1.05f64, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("share of full compute")
        .y_desc("PSNR dB")
        .draw()?;
    for (i, knob) in [
        "epsilon",
        "teacache",
        "ras",
        "fewer-steps",
        "patches",
        "warmup",
    ]
    .iter()
    .enumerate()
    {
        let mut pts: Vec<(f64, f64)> = sweeps
            .iter()
            .filter(|v| v["knob"] == *knob)
            .map(|v| (f(v, "work"), f(v, "psnr_db")))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = colours[i % colours.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), c))?
            .label(format!("sweep: {knob}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    for (i, m) in summary.iter().enumerate() {
        let c = colours[(i + 5) % colours.len()];
        let name = m["method"].as_str().unwrap_or("").to_string();
        chart
            .draw_series(std::iter::once(TriangleMarker::new(
                (f(m, "work"), f(m, "psnr_db").min(ymax - 1.0)),
                6,
                c.filled(),
            )))?
            .label(name)
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 5, c.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;

    Ok(())
}

/// Completion times under load (CDF).
pub(crate) fn plot_completion(out: &Path, serving: &[Value]) -> PlotResult {
    use plotters::prelude::*;
    let colours = colours();
    // CDF of completion times under load.
    let path = out.join("completion_cdf.svg");
    let root = SVGBackend::new(&path, (760, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let stream = || serving.iter().filter(|r| r["load"] == json!(1.2));
    let xmax = stream()
        .flat_map(|r| r["latencies_s"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_f64())
        .fold(1.0f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "completion time under a bursty stream (CDF)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..xmax, 0f64..1.0f64)?;
    chart
        .configure_mesh()
        .x_desc("completion time s")
        .y_desc("share of requests")
        .draw()?;
    for (i, r) in stream().enumerate() {
        let lat: Vec<f64> = r["latencies_s"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_f64())
            .collect();
        let n = lat.len().max(1) as f64;
        let pts: Vec<(f64, f64)> = lat
            .iter()
            .enumerate()
            .map(|(k, &x)| (x, (k + 1) as f64 / n))
            .collect();
        let c = colours[i % colours.len()];
        let label = format!(
            "{} @ load {}",
            r["method"].as_str().unwrap_or(""),
            r["load"]
        );
        chart
            .draw_series(LineSeries::new(pts, c))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;

    Ok(())
}

/// Throughput against devices (simulated).
pub(crate) fn plot_scale(out: &Path, scale: &[Value]) -> PlotResult {
    use plotters::prelude::*;
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let colours = colours();
    // Simulated scale.
    let path = out.join("scale.svg");
    let root = SVGBackend::new(&path, (760, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = scale
        .iter()
        .map(|r| f(r, "flashdiff_rps").max(f(r, "distrifusion_rps")))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("throughput vs devices (simulated)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1f64..64f64).log_scale(), (0.1f64..ymax).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("devices")
        .y_desc("requests / s")
        .draw()?;
    for (i, (key, label)) in [
        ("flashdiff_rps", "FlashDiff"),
        ("distrifusion_rps", "DistriFusion-style"),
    ]
    .iter()
    .enumerate()
    {
        let pts: Vec<(f64, f64)> = scale.iter().map(|r| (f(r, "devices"), f(r, key))).collect();
        let c = colours[i];
        chart
            .draw_series(LineSeries::new(pts.clone(), c))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picture_is_written_as_png_too() {
        let dir = std::env::temp_dir().join(format!("flashdiff-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (svg, png) = (dir.join("a.svg"), dir.join("a.png"));
        std::fs::write(
            &svg,
            r##"<svg width="40" height="30" xmlns="http://www.w3.org/2000/svg"><rect x="5" y="5" width="10" height="10" fill="#FF0000"/></svg>"##,
        )
        .unwrap();
        svg_to_png(&svg, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // The IHDR chunk: width and height.
        assert_eq!(&bytes[16..24], &[0, 0, 0, 40, 0, 0, 0, 30]);
        assert!(svg_to_png(&dir.join("missing.svg"), &png).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
