//! Output of the txn_size benchmark: the markdown table (min / median / max over the
//! repetitions), the goals with their measured ratios, and the plot (SVG and PNG).

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::common::Point;

/// Plot/table order of the modes and their colours.
const MODES: [(&str, RGBColor); 6] = [
    ("raw-txn", RGBColor(0, 0, 0)),
    ("raw-copy", RGBColor(140, 86, 75)),
    ("none", RGBColor(150, 150, 150)),
    ("at-least-once", RGBColor(31, 119, 180)),
    ("transactional-offsets", RGBColor(255, 127, 14)),
    ("two-phase-commit", RGBColor(214, 39, 40)),
];

/// The goals: (mode, baseline, checkpoint interval ms, minimum ratio of medians). The copy
/// loop has no checkpoints: `none` at every interval is compared with the same raw-copy row.
pub const GOALS: [(&str, &str, u64, f64); 4] = [
    ("two-phase-commit", "at-least-once", 100, 0.97),
    ("two-phase-commit", "at-least-once", 10, 0.90),
    ("none", "raw-copy", 100, 0.80),
    ("none", "raw-copy", 10, 0.80),
];

/// Largest share of a job's run (spawn -> whole backlog visible) its start-up may take for the
/// steady-part ratios to stand for the run.
pub const STARTUP_SHARE_GOAL: f64 = 0.05;

fn f(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.digits$}")
    }
}

/// 1234567 -> "1.23M", 45600 -> "45.6k", 12 -> "12".
pub fn human(v: f64) -> String {
    if v.is_nan() {
        return "-".into();
    }
    let (x, unit) = if v.abs() >= 1e6 {
        (v / 1e6, "M")
    } else if v.abs() >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if x.abs() >= 100.0 || x.fract() == 0.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{x:.digits$}{unit}")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    let v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// The repetitions of one row of the grid.
pub struct Row<'a> {
    /// Storage label.
    pub storage: &'a str,
    /// Value bytes.
    pub bytes: usize,
    /// Mode.
    pub mode: &'a str,
    /// Checkpoint interval (pipeline).
    pub interval_ms: Option<u64>,
    /// Repetitions in run order.
    pub reps: Vec<&'a Point>,
}

impl Row<'_> {
    fn med(&self, g: impl Fn(&Point) -> f64) -> f64 {
        median(self.reps.iter().map(|p| g(p)).collect())
    }
    /// Median records/s.
    pub fn rate(&self) -> f64 {
        self.med(|p| p.records_per_s)
    }
    /// (min, max) records/s.
    pub fn rate_spread(&self) -> (f64, f64) {
        min_max(
            &self
                .reps
                .iter()
                .map(|p| p.records_per_s)
                .collect::<Vec<_>>(),
        )
    }
    /// Median records per transaction.
    pub fn per_txn(&self) -> f64 {
        self.med(|p| p.records_per_txn)
    }
}

/// Groups points into rows (same storage, record size, mode, interval; raw-txn: same
/// transaction size), in first-seen order.
pub fn rows(points: &[Point]) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for p in points {
        let same = |r: &Row<'_>| {
            r.storage == p.storage
                && r.bytes == p.record_bytes
                && r.mode == p.mode
                && r.interval_ms == p.interval_ms
                && (p.interval_ms.is_some() || r.reps[0].records_per_txn == p.records_per_txn)
        };
        match rows.iter_mut().find(|r| same(r)) {
            Some(r) => r.reps.push(p),
            None => rows.push(Row {
                storage: &p.storage,
                bytes: p.record_bytes,
                mode: &p.mode,
                interval_ms: p.interval_ms,
                reps: vec![p],
            }),
        }
    }
    rows
}

/// The markdown table: one line per row, medians over its repetitions.
pub fn table(points: &[Point]) -> String {
    let mut s = String::new();
    s.push_str("| storage | record | mode | checkpoint | runs | records/s median | min - max | MB/s | records/txn | start-up s (share of run) | CPU s / M records | commit p50 / p99 ms | e2e p50 / p99 ms |\n");
    s.push_str("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in rows(points) {
        let (lo, hi) = r.rate_spread();
        let startup = r.med(|p| p.startup_s);
        let share = r.med(|p| p.startup_s / p.run_s);
        let _ = writeln!(
            s,
            "| {} | {} B | {} | {} | {} | {} | {} - {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            r.storage,
            r.bytes,
            r.mode,
            r.interval_ms
                .map(|i| format!("{i} ms"))
                .unwrap_or_else(|| "-".into()),
            r.reps.len(),
            human(r.rate()),
            human(lo),
            human(hi),
            f(r.rate() * r.bytes as f64 / 1e6, 1),
            human(r.per_txn()),
            if startup.is_nan() {
                "-".into()
            } else {
                format!("{startup:.2} ({:.1}%)", share * 100.0)
            },
            f(r.med(|p| p.cpu_s_per_m), 2),
            f(r.med(|p| p.commit_ms.0), 2),
            f(r.med(|p| p.commit_ms.1), 2),
            f(r.med(|p| p.e2e_ms.0), 1),
            f(r.med(|p| p.e2e_ms.1), 1),
        );
    }
    s
}

fn find<'a>(
    rows: &'a [Row<'a>],
    storage: &str,
    bytes: usize,
    mode: &str,
    ms: u64,
) -> Option<&'a Row<'a>> {
    rows.iter().find(|r| {
        r.storage == storage
            && r.bytes == bytes
            && r.mode == mode
            && (r.interval_ms == Some(ms) || (mode == "raw-copy" && r.interval_ms.is_some()))
    })
}

/// Ratio of medians of `a` over `b`, and (min, max) of the ratios of repetitions with the
/// same index (run side by side).
pub fn ratio(a: &Row<'_>, b: &Row<'_>) -> (f64, f64, f64) {
    let paired: Vec<f64> = a
        .reps
        .iter()
        .filter_map(|x| {
            b.reps
                .iter()
                .find(|y| y.rep == x.rep)
                .map(|y| x.records_per_s / y.records_per_s)
        })
        .collect();
    let (lo, hi) = min_max(&paired);
    (a.rate() / b.rate(), lo, hi)
}

fn configs(points: &[Point]) -> Vec<(String, usize)> {
    let mut c: Vec<(String, usize)> = points
        .iter()
        .map(|p| (p.storage.clone(), p.record_bytes))
        .collect();
    c.sort();
    c.dedup();
    c
}

/// The goals, each with the figures measured in this run, then the other ratios worth a look.
pub fn targets(points: &[Point]) -> String {
    let rows = rows(points);
    let mut s = String::new();
    for (storage, bytes) in configs(points) {
        for (mode, base, ms, goal) in GOALS {
            let (Some(a), Some(b)) = (
                find(&rows, &storage, bytes, mode, ms),
                find(&rows, &storage, bytes, base, ms),
            ) else {
                continue;
            };
            let (r, lo, hi) = ratio(a, b);
            let _ = writeln!(
                s,
                "- {storage}, {bytes} B, {ms} ms: {mode} / {base} = {} / {} records/s = **{r:.2}x** [{lo:.2}-{hi:.2}] (goal >= {goal:.2}x: {})",
                human(a.rate()),
                human(b.rate()),
                if r >= goal { "met" } else { "not met" }
            );
        }
        // the ratios above are of steady parts; they stand for whole runs only when start-up
        // is a small part of every run
        let worst = rows
            .iter()
            .filter(|r| r.storage == storage && r.bytes == bytes)
            .filter_map(|r| Some((r.med(|p| p.startup_s / p.run_s), r.mode, r.interval_ms?)))
            .filter(|(share, _, _)| share.is_finite())
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((worst, mode, ms)) = worst {
            let _ = writeln!(
                s,
                "- {storage}, {bytes} B: start-up is at most {:.1}% of a job's run ({mode}, {ms} ms; goal < {:.0}%: {})",
                worst * 100.0,
                STARTUP_SHARE_GOAL * 100.0,
                if worst < STARTUP_SHARE_GOAL {
                    "met"
                } else {
                    "not met: the runs are too short, raise --backlog-secs"
                }
            );
        }
        for ms in [10, 100, 1000] {
            let (Some(a), Some(b)) = (
                find(&rows, &storage, bytes, "transactional-offsets", ms),
                find(&rows, &storage, bytes, "at-least-once", ms),
            ) else {
                continue;
            };
            let (r, lo, hi) = ratio(a, b);
            let _ = writeln!(
                s,
                "- {storage}, {bytes} B, {ms} ms: transactional-offsets / at-least-once = **{r:.2}x** [{lo:.2}-{hi:.2}] (no goal)"
            );
        }
        // two-phase commit against the raw producers at the nearest transaction size
        for a in rows
            .iter()
            .filter(|r| r.storage == storage && r.bytes == bytes && r.mode == "two-phase-commit")
        {
            let raw = rows
                .iter()
                .filter(|r| r.storage == storage && r.bytes == bytes && r.mode == "raw-txn")
                .min_by(|x, y| {
                    let dx = (x.per_txn().ln() - a.per_txn().ln()).abs();
                    let dy = (y.per_txn().ln() - a.per_txn().ln()).abs();
                    dx.total_cmp(&dy)
                });
            if let Some(b) = raw {
                let _ = writeln!(
                    s,
                    "- {storage}, {bytes} B: two-phase-commit at {} ms ({} records/txn/subtask, {} records/s) / raw transactional producers at {} records/txn ({} records/s) = **{:.2}x** (no goal)",
                    a.interval_ms.unwrap_or(0),
                    human(a.per_txn()),
                    human(a.rate()),
                    human(b.per_txn()),
                    human(b.rate()),
                    a.rate() / b.rate()
                );
            }
        }
    }
    s
}

/// A log range snapped to whole decades around the finite positive values.
fn decades(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = v.filter(|x| x.is_finite() && *x > 0.0).collect();
    if v.is_empty() {
        return (1.0, 10.0);
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

/// Registers a sans-serif font with plotters' pure-Rust text renderer: `TXN_SIZE_FONT` or
/// the first of a few usual system paths. None: no plot can be drawn.
fn register_font() -> Option<&'static str> {
    let candidates = [
        std::env::var("TXN_SIZE_FONT").unwrap_or_default(),
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into(),
        "/usr/share/fonts/dejavu/DejaVuSans.ttf".into(),
        "/usr/share/fonts/TTF/DejaVuSans.ttf".into(),
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf".into(),
        "/Library/Fonts/Arial.ttf".into(),
    ];
    for c in candidates.iter().filter(|c| !c.is_empty()) {
        if let Ok(bytes) = std::fs::read(c) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Some(Box::leak(c.clone().into_boxed_str()));
            }
        }
    }
    None
}

const PANEL: (u32, u32) = (560, 380);

fn mode_color(mode: &str) -> RGBColor {
    MODES
        .iter()
        .find(|(n, _)| *n == mode)
        .map_or(BLACK, |c| c.1)
}

/// Writes the plot as SVG and PNG: one column per (storage, record size); rows: throughput
/// against records per transaction, the goal ratios against the checkpoint interval, and
/// median end-to-end latency against records per transaction. Both axes of the first and
/// last row are logarithmic with ticks at whole decades.
pub fn plot(points: &[Point], svg: &Path, png: &Path) -> anyhow::Result<()> {
    let configs = configs(points);
    if configs.is_empty() {
        return Ok(());
    }
    static FONT: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    if FONT.get_or_init(register_font).is_none() {
        eprintln!("no TrueType font found (set TXN_SIZE_FONT=/path/to/font.ttf): no plot drawn");
        return Ok(());
    }
    let size = (PANEL.0 * configs.len() as u32, PANEL.1 * 3);
    {
        let root = SVGBackend::new(svg, size).into_drawing_area();
        draw(points, &configs, &root)?;
        root.present()?;
    }
    let mut buf = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
        draw(points, &configs, &root)?;
        root.present()?;
    }
    let file = std::io::BufWriter::new(std::fs::File::create(png)?);
    let mut enc = png::Encoder::new(file, size.0, size.1);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&buf)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    points: &[Point],
    configs: &[(String, usize)],
    root: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let rows_all = rows(points);
    let grid = root.split_evenly((3, configs.len()));
    for (c, (storage, bytes)) in configs.iter().enumerate() {
        let rows: Vec<&Row<'_>> = rows_all
            .iter()
            .filter(|r| r.storage == storage && r.bytes == *bytes)
            .collect();
        let per_txn = |r: &Row<'_>| r.per_txn();
        // a margin either side, so a point on a whole decade is not drawn on the frame
        let x = decades(
            rows.iter()
                .flat_map(|r| [per_txn(r) / 1.5, per_txn(r) * 1.5]),
        );
        let human_fmt = |v: &f64| human(*v);
        // throughput
        {
            let y = decades(rows.iter().flat_map(|r| {
                let (lo, hi) = r.rate_spread();
                [lo, hi]
            }));
            let mut chart = ChartBuilder::on(&grid[c])
                .caption(
                    format!("records/s, {storage} broker, {bytes} B"),
                    ("sans-serif", 17),
                )
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())?;
            chart
                .configure_mesh()
                .x_labels(6)
                .y_labels(6)
                .x_label_formatter(&human_fmt)
                .y_label_formatter(&human_fmt)
                .x_desc("records per transaction per producer")
                .draw()?;
            for (mode, color) in MODES {
                let mut line: Vec<(f64, f64, f64, f64)> = rows
                    .iter()
                    .filter(|r| r.mode == mode)
                    .map(|r| {
                        let (lo, hi) = r.rate_spread();
                        (per_txn(r), r.rate(), lo, hi)
                    })
                    .collect();
                if mode == "raw-copy" {
                    // no transactions: a horizontal line (the ceiling of `none`) across the panel
                    let Some(&(_, v, _, _)) = line.first() else {
                        continue;
                    };
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(x.0, v), (x.1, v)],
                            8,
                            4,
                            color.stroke_width(2),
                        ))?
                        .label("raw-copy (ceiling of none)")
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                        });
                    let goal = v * 0.8;
                    let grey = RGBColor(150, 150, 150);
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(x.0, goal), (x.1, goal)],
                            3,
                            3,
                            grey.stroke_width(1),
                        ))?
                        .label("goal of none: 0.8x raw-copy")
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1))
                        });
                    continue;
                }
                line.retain(|p| p.0.is_finite() && p.0 > 0.0 && p.1 > 0.0);
                if line.is_empty() {
                    continue;
                }
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(
                        line.iter().map(|p| (p.0, p.1)),
                        color.stroke_width(2),
                    ))?
                    .label(mode)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart.draw_series(
                    line.iter()
                        .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
                )?;
                // min-max of the repetitions
                chart.draw_series(line.iter().filter(|p| p.2 < p.3).map(|p| {
                    PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))
                }))?;
            }
            chart
                .configure_series_labels()
                // the points sit mid-height and to the right (raw-txn at the largest sizes)
                .position(SeriesLabelPosition::UpperLeft)
                .label_font(("sans-serif", 12))
                .border_style(BLACK)
                .background_style(WHITE.mix(0.85))
                .draw()?;
        }
        // goal ratios against the checkpoint interval
        {
            let ms: Vec<u64> = rows.iter().filter_map(|r| r.interval_ms).collect();
            let xr = decades(ms.iter().map(|&m| m as f64));
            let mut chart = ChartBuilder::on(&grid[configs.len() + c])
                .caption(
                    format!("ratio to baseline, {storage} broker, {bytes} B"),
                    ("sans-serif", 17),
                )
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d((xr.0..xr.1).log_scale(), 0.0..1.4)?;
            chart
                .configure_mesh()
                .x_labels(4)
                .y_labels(8)
                .x_label_formatter(&|v| format!("{} ms", human(*v)))
                .y_label_formatter(&|v| format!("{v:.1}x"))
                .x_desc("checkpoint interval")
                .draw()?;
            let series = [
                ("two-phase-commit", "at-least-once"),
                ("transactional-offsets", "at-least-once"),
                ("none", "raw-copy"),
            ];
            for (mode, base) in series {
                let color = mode_color(mode);
                let mut line: Vec<(f64, f64, f64, f64)> = Vec::new();
                for r in rows.iter().filter(|r| r.mode == mode) {
                    let Some(m) = r.interval_ms else { continue };
                    let Some(b) = find(&rows_all, storage, *bytes, base, m) else {
                        continue;
                    };
                    let (v, lo, hi) = ratio(r, b);
                    line.push((m as f64, v, lo, hi));
                }
                if line.is_empty() {
                    continue;
                }
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(
                        line.iter().map(|p| (p.0, p.1)),
                        color.stroke_width(2),
                    ))?
                    .label(format!("{mode} / {base}"))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart.draw_series(
                    line.iter()
                        .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
                )?;
                chart.draw_series(line.iter().filter(|p| p.2 < p.3).map(|p| {
                    PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))
                }))?;
            }
            // the goals as short dashed lines at their interval
            for (mode, _, m, goal) in GOALS {
                let color = mode_color(mode);
                let m = m as f64;
                chart.draw_series(DashedLineSeries::new(
                    vec![(m / 1.6, goal), (m * 1.6, goal)],
                    4,
                    3,
                    color.stroke_width(2),
                ))?;
                // above the dash's left end, inside the panel
                chart.draw_series(std::iter::once(Text::new(
                    format!("goal {goal:.2}x"),
                    ((m / 1.6).max(xr.0), goal + 0.07),
                    ("sans-serif", 11).into_font().color(&color),
                )))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerLeft)
                .label_font(("sans-serif", 12))
                .border_style(BLACK)
                .background_style(WHITE.mix(0.85))
                .draw()?;
        }
        // latency
        {
            let y = decades(rows.iter().map(|r| r.med(|p| p.e2e_ms.0)));
            let mut chart = ChartBuilder::on(&grid[2 * configs.len() + c])
                .caption(
                    format!("median end-to-end latency, {storage} broker, {bytes} B"),
                    ("sans-serif", 17),
                )
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())?;
            chart
                .configure_mesh()
                .x_labels(6)
                .y_labels(6)
                .x_label_formatter(&human_fmt)
                .y_label_formatter(&|v| format!("{} ms", human(*v)))
                .x_desc("records per transaction per producer")
                .draw()?;
            for (mode, color) in MODES {
                let mut line: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| r.mode == mode)
                    .map(|r| (per_txn(r), r.med(|p| p.e2e_ms.0)))
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
                .position(SeriesLabelPosition::UpperLeft)
                .label_font(("sans-serif", 12))
                .border_style(BLACK)
                .background_style(WHITE.mix(0.85))
                .draw()?;
        }
    }
    Ok(())
}
