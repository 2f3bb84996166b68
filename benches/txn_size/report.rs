//! Output of the txn_size benchmark: the markdown table, the target ratios and the SVG plot.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::common::Point;

/// Plot/table order of the modes and their colours.
const MODES: [(&str, RGBColor); 5] = [
    ("raw-txn", RGBColor(0, 0, 0)),
    ("none", RGBColor(150, 150, 150)),
    ("at-least-once", RGBColor(31, 119, 180)),
    ("transactional-offsets", RGBColor(255, 127, 14)),
    ("two-phase-commit", RGBColor(214, 39, 40)),
];

fn f(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.digits$}")
    }
}

fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The markdown table of every point, in run order.
pub fn table(points: &[Point]) -> String {
    let mut s = String::new();
    s.push_str("| storage | record | mode | checkpoint | records | records/txn | records/s | MB/s | commit p50 ms | commit p99 ms | e2e p50 ms | e2e p99 ms |\n");
    s.push_str(
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} B | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.storage,
            p.record_bytes,
            p.mode,
            p.interval_ms
                .map(|i| format!("{i} ms"))
                .unwrap_or_else(|| "-".into()),
            p.records,
            human(p.records_per_txn),
            human(p.records_per_s),
            f(p.mb_per_s(), 1),
            f(p.commit_ms.0, 2),
            f(p.commit_ms.1, 2),
            f(p.e2e_ms.0, 1),
            f(p.e2e_ms.1, 1),
        );
    }
    s
}

fn find<'a>(
    points: &'a [Point],
    storage: &str,
    bytes: usize,
    mode: &str,
    ms: u64,
) -> Option<&'a Point> {
    points.iter().find(|p| {
        p.storage == storage
            && p.record_bytes == bytes
            && p.mode == mode
            && p.interval_ms == Some(ms)
    })
}

/// The three targets, each with the figure measured in this run.
pub fn targets(points: &[Point]) -> String {
    let mut s = String::new();
    let mut configs: Vec<(String, usize)> = points
        .iter()
        .map(|p| (p.storage.clone(), p.record_bytes))
        .collect();
    configs.dedup();
    configs.sort();
    configs.dedup();
    for (storage, bytes) in &configs {
        let alo = find(points, storage, *bytes, "at-least-once", 100);
        for eo in ["two-phase-commit", "transactional-offsets"] {
            if let (Some(a), Some(e)) = (alo, find(points, storage, *bytes, eo, 100)) {
                let r = e.records_per_s / a.records_per_s;
                let _ = writeln!(
                    s,
                    "- {storage}, {bytes} B, 100 ms: {eo} / at-least-once = {} / {} records/s = **{r:.3}x** (target >= 0.97x: {})",
                    human(e.records_per_s),
                    human(a.records_per_s),
                    if r >= 0.97 { "met" } else { "not met" }
                );
            }
        }
        for p in points.iter().filter(|p| {
            &p.storage == storage && p.record_bytes == *bytes && p.mode == "two-phase-commit"
        }) {
            let raw = points
                .iter()
                .filter(|r| {
                    &r.storage == storage && r.record_bytes == *bytes && r.mode == "raw-txn"
                })
                .min_by(|a, b| {
                    let da = (a.records_per_txn.ln() - p.records_per_txn.ln()).abs();
                    let db = (b.records_per_txn.ln() - p.records_per_txn.ln()).abs();
                    da.total_cmp(&db)
                });
            if let Some(r) = raw {
                let ratio = p.records_per_s / r.records_per_s;
                let _ = writeln!(
                    s,
                    "- {storage}, {bytes} B: two-phase-commit at {} ms ({} records/txn/subtask) = {} records/s vs raw-txn at {} records/txn = {} records/s: **{ratio:.2}x** (target >= 0.90x: {})",
                    p.interval_ms.unwrap_or(0),
                    human(p.records_per_txn),
                    human(p.records_per_s),
                    human(r.records_per_txn),
                    human(r.records_per_s),
                    if ratio >= 0.9 { "met" } else { "not met" }
                );
            }
        }
        for m in ["two-phase-commit", "transactional-offsets"] {
            if let Some(p) = find(points, storage, *bytes, m, 100) {
                let _ = writeln!(
                    s,
                    "- {storage}, {bytes} B, 100 ms: {m} median end-to-end latency **{:.1} ms** = {:.2}x the interval (target < 1.5x: {})",
                    p.e2e_ms.0,
                    p.e2e_ms.0 / 100.0,
                    if p.e2e_ms.0 < 150.0 { "met" } else { "not met" }
                );
            }
        }
    }
    s
}

fn range(v: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let lo = v
        .clone()
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold(f64::INFINITY, f64::min);
    let hi = v.filter(|x| x.is_finite() && *x > 0.0).fold(0.0, f64::max);
    if !lo.is_finite() || hi <= 0.0 {
        (1.0, 10.0)
    } else {
        (lo / 1.5, hi * 1.5)
    }
}

/// Writes the SVG: one row per (storage, record size); left throughput, right median
/// end-to-end latency, both against records per transaction; one line per mode.
pub fn plot(points: &[Point], path: &Path) -> anyhow::Result<()> {
    let mut configs: Vec<(String, usize)> = points
        .iter()
        .map(|p| (p.storage.clone(), p.record_bytes))
        .collect();
    configs.sort();
    configs.dedup();
    if configs.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1200, 400 * configs.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let rows = root.split_evenly((configs.len(), 2));
    for (i, (storage, bytes)) in configs.iter().enumerate() {
        let pts: Vec<&Point> = points
            .iter()
            .filter(|p| &p.storage == storage && p.record_bytes == *bytes)
            .collect();
        let x = range(pts.iter().map(|p| p.records_per_txn));
        for (j, area) in rows[2 * i..2 * i + 2].iter().enumerate() {
            let value = |p: &Point| if j == 0 { p.records_per_s } else { p.e2e_ms.0 };
            let y = range(pts.iter().map(|p| value(p)));
            let title = if j == 0 {
                format!("throughput, {storage} broker, {bytes} B records")
            } else {
                format!("median end-to-end latency, {storage} broker, {bytes} B records")
            };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("records per transaction (per sink subtask)")
                .y_desc(if j == 0 {
                    "records/s"
                } else {
                    "ms (read_committed)"
                })
                .draw()?;
            for (mode, color) in MODES {
                let mut line: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|p| p.mode == mode)
                    .map(|p| (p.records_per_txn, value(p)))
                    .filter(|(a, b)| a.is_finite() && b.is_finite() && *a > 0.0 && *b > 0.0)
                    .collect();
                if line.is_empty() {
                    continue;
                }
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                    .label(mode)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart.draw_series(line.into_iter().map(|c| Circle::new(c, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .position(if j == 0 {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperLeft
                })
                .border_style(BLACK)
                .background_style(WHITE.mix(0.85))
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}
