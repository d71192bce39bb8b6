//! SVG charts written by hand: horizontal bars for a figure per server, and
//! latency distributions (cumulative, logarithmic time axis) per
//! configuration. Plain SVG 1.1, readable in any browser.

use std::fmt::Write as _;

/// Width of every chart in pixels.
const WIDTH_PX: f64 = 900.0;
/// Room for labels left of the bars.
const LABEL_WIDTH_PX: f64 = 300.0;
/// Height of one bar and its gap.
const BAR_ROW_PX: f64 = 26.0;
/// Colours for series, repeated when there are more series than colours.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Line styles, one per pass through the palette: solid, dashed, dotted.
const DASHES: [&str; 3] = ["none", "7 4", "2 3"];
/// Height of one legend entry.
const LEGEND_ROW_PX: f64 = 18.0;
/// Width allowed per legend character (12 px sans-serif).
const LEGEND_CHAR_PX: f64 = 7.0;

/// Escapes text for use inside SVG elements and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A horizontal bar per `(label, value)`, scaled to the largest value.
pub fn bars(title: &str, unit: &str, items: &[(String, f64)]) -> String {
    let top = 50.0;
    let height = top + BAR_ROW_PX * items.len().max(1) as f64 + 30.0;
    let max = items.iter().map(|(_, v)| *v).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let scale = if max > 0.0 { (WIDTH_PX - LABEL_WIDTH_PX - 110.0) / max } else { 0.0 };
    let mut svg = header(WIDTH_PX, height, title);
    for (i, (label, value)) in items.iter().enumerate() {
        let y = top + BAR_ROW_PX * i as f64;
        let w = if value.is_finite() { (value * scale).max(1.0) } else { 0.0 };
        let color = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            svg,
            r#"<text x="{lx}" y="{ty}" text-anchor="end">{label}</text><rect x="{LABEL_WIDTH_PX}" y="{y}" width="{w:.1}" height="{bh}" fill="{color}"/><text x="{vx:.1}" y="{ty}">{value}</text>"#,
            lx = LABEL_WIDTH_PX - 8.0,
            ty = y + 15.0,
            label = escape(label),
            bh = BAR_ROW_PX - 6.0,
            vx = LABEL_WIDTH_PX + w + 6.0,
            value = escape(&if value.is_finite() {
                format!("{} {unit}", super::report::format_figure(*value, 1))
            } else {
                "no figure (see the table)".to_string()
            }),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Cumulative latency distributions, one line per `(label, histogram)`,
/// the time axis logarithmic in microseconds.
pub fn latency_cdf(title: &str, series: &[(String, Vec<(f64, u64)>)]) -> String {
    // The legend gets the room its longest label needs, and the plot is as
    // tall as the legend, so every series is named in full.
    let label_chars = series.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
    let legend_px = 50.0 + LEGEND_CHAR_PX * label_chars as f64;
    let width = WIDTH_PX - 260.0 + legend_px;
    let (left, right, top) = (70.0, WIDTH_PX - 260.0, 50.0);
    let bottom = (top + LEGEND_ROW_PX * series.len() as f64 + 10.0).max(400.0);
    let mut svg = header(width, bottom + 50.0, title);
    let values = series.iter().flat_map(|(_, h)| h.iter().map(|&(v, _)| v)).filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        svg.push_str(r#"<text x="70" y="100">no latency data</text></svg>"#);
        return svg;
    }
    let (lo_exp, hi_exp) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let floor_us = 10f64.powf(lo_exp);
    let x =
        |us: f64| left + (us.max(floor_us).log10() - lo_exp) / (hi_exp - lo_exp) * (right - left);
    // The fraction axis is stretched towards the tail: each "nine" (90%,
    // 99%, 99.9%, 99.99%) gets the same height, so p99 and p999 are visible.
    let y = |fraction: f64| bottom - tail_position(fraction) * (bottom - top);
    // Axes, decade grid lines and percentage grid lines.
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#333"/>"##,
        w = right - left,
        h = bottom - top
    );
    let mut exp = lo_exp;
    while exp <= hi_exp {
        let gx = x(10f64.powf(exp));
        let _ = writeln!(
            svg,
            r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{bottom}" stroke="#ddd"/><text x="{gx:.1}" y="{ty}" text-anchor="middle">{label}</text>"##,
            ty = bottom + 18.0,
            label = escape(&duration_label(10f64.powf(exp))),
        );
        exp += 1.0;
    }
    let marks = [
        (0.0, "0%"),
        (0.5, "50%"),
        (0.9, "90%"),
        (0.99, "99%"),
        (0.999, "99.9%"),
        (0.9999, "99.99%"),
    ];
    for (pct, name) in marks {
        let gy = y(pct);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{gy:.1}" x2="{right}" y2="{gy:.1}" stroke="#eee"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{name}</text>"##,
            tx = left - 6.0,
            ty = gy + 4.0,
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{cx}" y="{ty}" text-anchor="middle">latency (log scale)</text>"#,
        cx = (left + right) / 2.0,
        ty = bottom + 40.0
    );
    for (i, (label, histogram)) in series.iter().enumerate() {
        // Past the palette's ten colours the lines are dashed, then dotted:
        // no two series look alike.
        let color = PALETTE[i % PALETTE.len()];
        let dash = DASHES[(i / PALETTE.len()) % DASHES.len()];
        let points = cumulative(histogram);
        if !points.is_empty() {
            let mut path = String::new();
            let mut previous = 0.0;
            for (n, &(us, fraction)) in points.iter().enumerate() {
                let cmd = if n == 0 { 'M' } else { 'L' };
                // A step: the fraction holds until the next bucket's value.
                let _ = write!(path, "{cmd}{:.1},{:.1} ", x(us), y(previous));
                let _ = write!(path, "L{:.1},{:.1} ", x(us), y(fraction));
                previous = fraction;
            }
            let _ = writeln!(
                svg,
                r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="1.8" stroke-dasharray="{dash}"/>"#
            );
        }
        let ly = top + 10.0 + LEGEND_ROW_PX * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ry}" x2="{lx2}" y2="{ry}" stroke="{color}" stroke-width="3" stroke-dasharray="{dash}"/><text x="{tx}" y="{ly}">{label}</text>"#,
            lx = right + 10.0,
            lx2 = right + 32.0,
            ry = ly - 4.0,
            tx = right + 38.0,
            label = escape(label),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Nines shown on the fraction axis: up to 99.99%.
const TAIL_NINES_MAX: f64 = 4.0;

/// Where `fraction` sits on the tail-stretched axis, 0 (0%) to 1 (99.99%
/// and above): the number of nines, `-log10(1 - fraction)`, over four.
pub fn tail_position(fraction: f64) -> f64 {
    let nines = -(1.0 - fraction.clamp(0.0, 1.0)).max(1e-12).log10();
    (nines / TAIL_NINES_MAX).clamp(0.0, 1.0)
}

/// `(value_us, cumulative fraction)` for a histogram, sorted by value.
pub fn cumulative(histogram: &[(f64, u64)]) -> Vec<(f64, f64)> {
    let mut sorted: Vec<(f64, u64)> =
        histogram.iter().copied().filter(|(v, c)| v.is_finite() && *c > 0).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = sorted.iter().map(|(_, c)| c).sum();
    let mut seen = 0u64;
    sorted
        .into_iter()
        .map(|(v, c)| {
            seen += c;
            (v, seen as f64 / total as f64)
        })
        .collect()
}

fn duration_label(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{} s", us / 1_000_000.0)
    } else if us >= 1_000.0 {
        format!("{} ms", us / 1_000.0)
    } else {
        format!("{us} µs")
    }
}

fn header(width: f64, height: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{x}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{title}</text>\n",
        x = width / 2.0,
        title = escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_sorts_and_reaches_one() {
        let c = cumulative(&[(30.0, 1), (10.0, 2), (20.0, 1), (40.0, 0)]);
        assert_eq!(c, vec![(10.0, 0.5), (20.0, 0.75), (30.0, 1.0)]);
        assert!(cumulative(&[]).is_empty());
    }

    #[test]
    fn tail_axis_gives_each_nine_the_same_height() {
        assert_eq!(tail_position(0.0), 0.0);
        assert!((tail_position(0.9) - 0.25).abs() < 1e-9);
        assert!((tail_position(0.99) - 0.5).abs() < 1e-9);
        assert_eq!(tail_position(1.0), 1.0);
    }

    #[test]
    fn charts_are_well_formed_and_escaped() {
        let svg = bars("req/s <local>", "req/s", &[("a&b".into(), 10.0), ("c".into(), 5.0)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&amp;b") && svg.contains("&lt;local&gt;"));
        let svg = latency_cdf("t", &[("x".into(), vec![(5.0, 3), (250.0, 1)])]);
        assert!(svg.contains("<path") && svg.contains("99.99%"));
        assert!(latency_cdf("t", &[]).contains("no latency data"));
        let svg = bars("t", "req/s", &[("starved".into(), f64::NAN)]);
        assert!(svg.contains("starved") && svg.contains("no figure"));
        // Many series: all named, none styled like another.
        let many: Vec<_> =
            (0..21).map(|i| (format!("server {i:02} with a long name"), vec![(5.0, 1)])).collect();
        let svg = latency_cdf("t", &many);
        assert!(many.iter().all(|(l, _)| svg.contains(l.as_str())));
        let styles: std::collections::HashSet<_> = svg
            .lines()
            .filter(|l| l.starts_with("<path"))
            .map(|l| l.split("stroke=").nth(1).unwrap().to_string())
            .collect();
        assert_eq!(styles.len(), 21);
    }
}
