//! The plots of a sweep: a grid of panels, one row per operation and one column per
//! pattern, all panels of a figure on the same scales so they can be compared at a glance.
//!
//! SVG is always written: the SVG backend writes text as `<text>` elements and needs no
//! font. PNG needs glyphs, so it is written only when a system font can be loaded. Nothing
//! here measures text (plotters' captions and legends would, and fail without a font), so
//! titles and legends are placed at fixed positions.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::bench_result::{human_size, Op, Pattern, PointResult};

/// Fonts tried for PNG text, in order (Debian/Ubuntu, Fedora, Arch, then Liberation).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

const PANEL_W: u32 = 640;
const PANEL_H: u32 = 420;
const TITLE_H: u32 = 40;
const LEGEND_W: u32 = 110;
const FONT: &str = "sans-serif";

/// Colours for the lines of a panel (the "tab10" palette: distinct, and readable on white).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The files a successful `draw` wrote, with what each shows.
pub struct Drawn {
    pub files: Vec<(&'static str, &'static str)>,
}

#[derive(Clone, Copy)]
enum Axis {
    /// Request size in bytes, plotted as log2.
    Size,
    /// Queue depth, plotted as log2.
    Depth,
}

struct Series {
    label: String,
    color: RGBColor,
    /// Drawn solid, with markers.
    solid: Vec<(f64, f64)>,
    /// Drawn dashed (p99 latency); empty for bandwidth.
    dashed: Vec<(f64, f64)>,
}

struct Panel {
    title: String,
    series: Vec<Series>,
}

struct Figure {
    svg: &'static str,
    png: &'static str,
    what: &'static str,
    title: String,
    x: Axis,
    x_desc: &'static str,
    y_desc: &'static str,
    y_log: bool,
    rows: usize,
    cols: usize,
    panels: Vec<Panel>,
}

/// Draws bandwidth.svg, latency.svg and latency-vs-depth.svg (and .png copies when a
/// font is available) into `dir`.
pub fn draw(dir: &Path, results: &[PointResult], uri: &str) -> Result<Drawn, String> {
    let png = load_font();
    let mut files = Vec::new();
    for fig in figures(results, uri) {
        let dims = (PANEL_W * fig.cols as u32, TITLE_H + PANEL_H * fig.rows as u32);
        let svg_path = dir.join(fig.svg);
        render(SVGBackend::new(&svg_path, dims).into_drawing_area(), &fig).map_err(|e| format!("{}: {e}", svg_path.display()))?;
        files.push((fig.svg, fig.what));
        if png {
            let png_path = dir.join(fig.png);
            render(BitMapBackend::new(&png_path, dims).into_drawing_area(), &fig).map_err(|e| format!("{}: {e}", png_path.display()))?;
            files.push((fig.png, "the same, as PNG"));
        }
    }
    if !png {
        eprintln!("sluice bench: no DejaVu Sans or Liberation Sans font found; wrote SVG plots only (no PNG)");
    }
    Ok(Drawn { files })
}

/// Registers a system font for the bitmap backend; false when none loads.
fn load_font() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        FONT_PATHS.iter().any(|path| {
            let Ok(bytes) = std::fs::read(path) else { return false };
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok()
        })
    })
}

fn figures(results: &[PointResult], uri: &str) -> Vec<Figure> {
    let ops = distinct(results.iter().map(|r| r.op));
    let patterns = distinct(results.iter().map(|r| r.pattern));
    let depths = sorted(results.iter().map(|r| r.depth as u64));
    let sizes = sorted(results.iter().map(|r| r.size));
    let connections = results.first().map_or(1, |r| r.connections);
    let conn = if connections == 1 { String::new() } else { format!(", {connections} connections") };
    let log2 = |v: u64| (v as f64).log2();
    let with_ios = |r: &&PointResult| r.ios > 0;

    let grid = |series: &dyn Fn(Op, Pattern) -> Vec<Series>| -> Vec<Panel> {
        let mut panels = Vec::new();
        for &op in &ops {
            for &pattern in &patterns {
                panels.push(Panel { title: format!("{} {}", pattern.title(), op.name()), series: series(op, pattern) });
            }
        }
        panels
    };
    let of = |op: Op, pattern: Pattern| results.iter().filter(move |r| r.op == op && r.pattern == pattern);

    let bandwidth = grid(&|op, pattern| {
        depths
            .iter()
            .enumerate()
            .map(|(i, &d)| Series {
                label: format!("QD {d}"),
                color: COLORS[i % COLORS.len()],
                solid: by_x(of(op, pattern).filter(|r| r.depth as u64 == d).map(|r| (log2(r.size), r.mb_per_s()))),
                dashed: Vec::new(),
            })
            .collect()
    });
    let latency = grid(&|op, pattern| {
        depths
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let points: Vec<_> = of(op, pattern).filter(|r| r.depth as u64 == d).filter(with_ios).collect();
                Series {
                    label: format!("QD {d}"),
                    color: COLORS[i % COLORS.len()],
                    solid: by_x(points.iter().map(|r| (log2(r.size), r.lat_p50_us))),
                    dashed: by_x(points.iter().map(|r| (log2(r.size), r.lat_p99_us))),
                }
            })
            .collect()
    });
    let latency_depth = grid(&|op, pattern| {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let points: Vec<_> = of(op, pattern).filter(|r| r.size == s).filter(with_ios).collect();
                Series {
                    label: human_size(s),
                    color: COLORS[i % COLORS.len()],
                    solid: by_x(points.iter().map(|r| (log2(r.depth as u64), r.lat_p50_us))),
                    dashed: by_x(points.iter().map(|r| (log2(r.depth as u64), r.lat_p99_us))),
                }
            })
            .collect()
    });

    let (rows, cols) = (ops.len().max(1), patterns.len().max(1));
    vec![
        Figure {
            svg: "bandwidth.svg",
            png: "bandwidth.png",
            what: "bandwidth (MB/s) vs request size, a line per queue depth",
            title: format!("Bandwidth vs request size: {uri}{conn}"),
            x: Axis::Size,
            x_desc: "request size (bytes, log2 scale)",
            y_desc: "bandwidth (MB/s)",
            y_log: false,
            rows,
            cols,
            panels: bandwidth,
        },
        Figure {
            svg: "latency.svg",
            png: "latency.png",
            what: "latency p50 (solid) and p99 (dashed) vs request size",
            title: format!("Latency vs request size: {uri}{conn}"),
            x: Axis::Size,
            x_desc: "request size (bytes, log2 scale)",
            y_desc: "latency (µs, log scale)",
            y_log: true,
            rows,
            cols,
            panels: latency,
        },
        Figure {
            svg: "latency-vs-depth.svg",
            png: "latency-vs-depth.png",
            what: "latency p50 (solid) and p99 (dashed) vs queue depth",
            title: format!("Latency vs queue depth: {uri}{conn}"),
            x: Axis::Depth,
            x_desc: "queue depth (requests in flight, log2 scale)",
            y_desc: "latency (µs, log scale)",
            y_log: true,
            rows,
            cols,
            panels: latency_depth,
        },
    ]
}

fn distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn sorted(items: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn by_x(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut v: Vec<_> = points.collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let (top, body) = root.split_vertically(TITLE_H);
    let (w, _) = top.dim_in_pixel();
    let title = TextStyle::from((FONT, 18).into_font()).color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
    top.draw(&Text::new(fig.title.clone(), (w as i32 / 2, TITLE_H as i32 / 2), title)).map_err(err)?;

    let all = fig.panels.iter().flat_map(|p| &p.series).flat_map(|s| s.solid.iter().chain(&s.dashed));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 1.0, 1.0);
    }
    let x_range = (x0 - 0.3)..(x1 + 0.3);
    let cells = body.split_evenly((fig.rows, fig.cols));
    for (cell, panel) in cells.iter().zip(&fig.panels) {
        if fig.y_log {
            let lo = (y0 * 0.7).max(1e-3);
            let hi = (y1 * 1.4).max(lo * 10.0);
            draw_panel(cell, fig, panel, x_range.clone(), (lo..hi).log_scale()).map_err(err)?;
        } else {
            let hi = (y1 * 1.1).max(1.0);
            draw_panel(cell, fig, panel, x_range.clone(), 0.0..hi).map_err(err)?;
        }
    }
    root.present().map_err(err)
}

fn draw_panel<DB: DrawingBackend, Y>(
    cell: &DrawingArea<DB, Shift>,
    fig: &Figure,
    panel: &Panel,
    x_range: std::ops::Range<f64>,
    y_range: Y,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (cw, _) = cell.dim_in_pixel();
    let (plot, legend) = cell.split_horizontally(cw - LEGEND_W);
    let (pw, _) = plot.dim_in_pixel();
    let heading = TextStyle::from((FONT, 15).into_font()).color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    plot.draw(&Text::new(panel.title.clone(), (pw as i32 / 2 + 30, 6), heading))?;

    let mut chart = ChartBuilder::on(&plot)
        .margin_top(30)
        .margin_left(8)
        .margin_right(12)
        .margin_bottom(8)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone(), y_range)?;
    let axis = fig.x;
    let x_fmt = move |v: &f64| {
        let r = v.round();
        if (v - r).abs() > 1e-6 || !(0.0..63.0).contains(&r) {
            return String::new();
        }
        match axis {
            Axis::Size => human_size(1u64 << r as u32),
            Axis::Depth => (1u64 << r as u32).to_string(),
        }
    };
    let y_fmt = |v: &f64| short_number(*v);
    let x_labels = ((x_range.end - x_range.start).ceil() as usize + 2).min(24);
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_label_formatter(&x_fmt)
        .y_labels(8)
        .y_label_formatter(&y_fmt)
        .x_desc(fig.x_desc)
        .y_desc(fig.y_desc)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;

    for s in &panel.series {
        if !s.dashed.is_empty() {
            chart.draw_series(DashedLineSeries::new(s.dashed.iter().copied(), 6, 4, s.color.stroke_width(1)))?;
        }
        chart.draw_series(LineSeries::new(s.solid.iter().copied(), s.color.stroke_width(2)))?;
        chart.draw_series(s.solid.iter().map(|&p| Circle::new(p, 3, s.color.filled())))?;
    }

    let entry = TextStyle::from((FONT, 12).into_font()).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    let mut y = 44;
    let line = |y: i32, color: &RGBColor, dashed: bool| -> Vec<PathElement<(i32, i32)>> {
        if dashed {
            vec![
                PathElement::new(vec![(4, y), (12, y)], color.stroke_width(1)),
                PathElement::new(vec![(18, y), (26, y)], color.stroke_width(1)),
            ]
        } else {
            vec![PathElement::new(vec![(4, y), (26, y)], color.stroke_width(2))]
        }
    };
    for s in &panel.series {
        for l in line(y, &s.color, false) {
            legend.draw(&l)?;
        }
        legend.draw(&Circle::new((15, y), 3, s.color.filled()))?;
        legend.draw(&Text::new(s.label.clone(), (32, y), entry.clone()))?;
        y += 18;
    }
    if panel.series.iter().any(|s| !s.dashed.is_empty()) {
        y += 8;
        for (label, dashed) in [("p50", false), ("p99", true)] {
            for l in line(y, &BLACK, dashed) {
                legend.draw(&l)?;
            }
            legend.draw(&Text::new(label, (32, y), entry.clone()))?;
            y += 18;
        }
    }
    Ok(())
}

/// Axis numbers: no more digits than the scale needs.
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if a >= 10_000.0 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
