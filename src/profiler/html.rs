//! Self-contained HTML reports: one file, inline CSS and SVG, no scripts and nothing fetched,
//! so a report opens anywhere and can be mailed or committed.

use super::table::{human_bytes, shapes_text};
use super::{EventKind, MemDevice, Profile, SortBy};
use std::fmt::Write as _;

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px 32px;color:#1d2330;background:#fff;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.sub{color:#5b6577;margin:0 0 14px}
table{border-collapse:collapse;margin:6px 0 12px;font-variant-numeric:tabular-nums}
th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #eef1f5;white-space:nowrap}
th{background:#f4f6f9;font-weight:600;position:sticky;top:0}
td.l,th.l{text-align:left}td.ops{text-align:left;color:#5b6577;white-space:normal;max-width:420px;font-size:12px}
tr.group td{background:#fafbfd;border-top:2px solid #dde2ea}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:8px 0 4px}
.card{border:1px solid #dde2ea;border-radius:6px;padding:8px 14px;min-width:150px}
.card b{display:block;font-size:19px}.card span{color:#5b6577;font-size:12px}
.bar{display:inline-block;height:11px;border-radius:2px;vertical-align:middle}
.b0{background:#3b6fd8}.b1{background:#e08a2c}.b2{background:#3aa56b}.b3{background:#9a5bd0}
td.barcell{text-align:left;min-width:260px}
.legend span{margin-right:16px}.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px}
.scroll{max-height:640px;overflow:auto;border:1px solid #eef1f5;display:inline-block}
svg text{font:11px system-ui,sans-serif;fill:#3a4250}
";

/// A page being built: sections are appended in order.
pub struct Page {
    title: String,
    body: String,
}

/// A cell of a [`Page::table`].
pub enum Cell {
    /// Left-aligned text.
    Text(String),
    /// A right-aligned figure, already formatted.
    Num(String),
    /// Bars (one per series, widths as fractions of the column, with a caption).
    Bars(Vec<(usize, f64)>, String),
    /// Small print for lists (the ops of a kernel).
    Ops(String),
}

impl Page {
    /// An empty page with a title.
    pub fn new(title: &str) -> Page {
        Page {
            title: title.to_string(),
            body: String::new(),
        }
    }
    /// A heading.
    pub fn h2(&mut self, text: &str) {
        let _ = writeln!(self.body, "<h2>{}</h2>", escape(text));
    }
    /// A smaller heading.
    pub fn h3(&mut self, text: &str) {
        let _ = writeln!(self.body, "<h3>{}</h3>", escape(text));
    }
    /// A paragraph of plain text.
    pub fn p(&mut self, text: &str) {
        let _ = writeln!(self.body, "<p class=sub>{}</p>", escape(text));
    }
    /// Key figures as cards: (figure, caption).
    pub fn cards(&mut self, cards: &[(String, String)]) {
        self.body.push_str("<div class=cards>");
        for (v, c) in cards {
            let _ = write!(
                self.body,
                "<div class=card><b>{}</b><span>{}</span></div>",
                escape(v),
                escape(c)
            );
        }
        self.body.push_str("</div>\n");
    }
    /// A legend for bar series.
    pub fn legend(&mut self, series: &[&str]) {
        self.body.push_str("<div class=legend>");
        for (i, s) in series.iter().enumerate() {
            let _ = write!(
                self.body,
                "<span><i class=b{}></i>{}</span>",
                i % 4,
                escape(s)
            );
        }
        self.body.push_str("</div>\n");
    }
    /// A table; `groups` marks rows that begin a group (drawn with a rule above).
    pub fn table(&mut self, headers: &[&str], rows: &[Vec<Cell>], groups: &[bool]) {
        let scroll = rows.len() > 30;
        if scroll {
            self.body.push_str("<div class=scroll>");
        }
        self.body.push_str("<table><tr>");
        for (i, h) in headers.iter().enumerate() {
            let left = rows
                .first()
                .and_then(|r| r.get(i))
                .is_some_and(|c| !matches!(c, Cell::Num(_)));
            let _ = write!(
                self.body,
                "<th{}>{}</th>",
                if left { " class=l" } else { "" },
                escape(h)
            );
        }
        self.body.push_str("</tr>\n");
        for (k, r) in rows.iter().enumerate() {
            let g = groups.get(k).copied().unwrap_or(false);
            self.body
                .push_str(if g { "<tr class=group>" } else { "<tr>" });
            for c in r {
                match c {
                    Cell::Text(t) => {
                        let _ = write!(self.body, "<td class=l>{}</td>", escape(t));
                    }
                    Cell::Num(t) => {
                        let _ = write!(self.body, "<td>{}</td>", escape(t));
                    }
                    Cell::Ops(t) => {
                        let _ = write!(self.body, "<td class=ops>{}</td>", escape(t));
                    }
                    Cell::Bars(bars, caption) => {
                        self.body.push_str("<td class=barcell>");
                        for (s, f) in bars {
                            let w = (f.clamp(0.0, 1.0) * 220.0).max(1.0);
                            let _ = write!(
                                self.body,
                                "<span class='bar b{}' style='width:{w:.1}px'></span><br>",
                                s % 4
                            );
                        }
                        let _ = write!(self.body, "<small>{}</small></td>", escape(caption));
                    }
                }
            }
            self.body.push_str("</tr>\n");
        }
        self.body.push_str("</table>");
        if scroll {
            self.body.push_str("</div>");
        }
        self.body.push('\n');
    }
    /// Raw markup (an SVG chart from [`line_chart`] or [`roofline`]).
    pub fn raw(&mut self, html: &str) {
        self.body.push_str(html);
        self.body.push('\n');
    }
    /// The finished document.
    pub fn finish(self) -> String {
        format!(
            "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\
             <meta name=viewport content='width=device-width,initial-scale=1'>\
             <title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n{}\
             </body></html>\n",
            self.body,
            t = escape(&self.title)
        )
    }
}

const W: f64 = 720.0;
const H: f64 = 260.0;
const PAD_L: f64 = 70.0;
const PAD_B: f64 = 36.0;
const COLORS: [&str; 4] = ["#3b6fd8", "#e08a2c", "#3aa56b", "#9a5bd0"];

fn axes(svg: &mut String, x_label: &str, y_label: &str) {
    let _ = write!(
        svg,
        "<line x1={PAD_L} y1={y0} x2={x1} y2={y0} stroke='#8a93a3'/>\
         <line x1={PAD_L} y1=10 x2={PAD_L} y2={y0} stroke='#8a93a3'/>\
         <text x={xm} y={yl} text-anchor=middle>{}</text>\
         <text x=14 y={ym} transform='rotate(-90 14 {ym})' text-anchor=middle>{}</text>",
        escape(x_label),
        escape(y_label),
        y0 = H - PAD_B,
        x1 = W - 10.0,
        xm = (PAD_L + W) / 2.0,
        yl = H - 6.0,
        ym = (H - PAD_B) / 2.0,
    );
}

/// A horizontal grid line at height `py` with its label on the y axis.
fn y_grid(svg: &mut String, py: f64, label: &str) {
    let _ = write!(
        svg,
        "<line x1={PAD_L} x2={} y1={py:.1} y2={py:.1} stroke='#eef1f5'/>\
         <text x={} y={:.1} text-anchor=end>{label}</text>",
        W - 10.0,
        PAD_L - 4.0,
        py + 4.0,
    );
}

/// Step lines over a shared x axis: `series` are (name, points), drawn in order.
pub fn line_chart(series: &[(&str, Vec<(f64, f64)>)], x_label: &str, y_label: &str) -> String {
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-12);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let sx = |x: f64| PAD_L + x / xmax * (W - PAD_L - 10.0);
    let sy = |y: f64| H - PAD_B - y / ymax * (H - PAD_B - 10.0);
    let mut svg = format!("<svg width={W} height={H} viewBox='0 0 {W} {H}'>");
    axes(&mut svg, x_label, y_label);
    for k in 0..=4 {
        let y = ymax * k as f64 / 4.0;
        y_grid(&mut svg, sy(y), &human_bytes(y as u64));
    }
    for k in 0..=4 {
        let x = xmax * k as f64 / 4.0;
        let label = if xmax >= 8.0 {
            format!("{}", x.round())
        } else {
            format!("{x:.2}")
        };
        let _ = write!(
            svg,
            "<text x={:.1} y={} text-anchor=middle>{label}</text>",
            sx(x),
            H - PAD_B + 14.0
        );
    }
    for (i, (_, pts)) in series.iter().enumerate() {
        let mut d = String::new();
        let mut last_y = 0.0;
        for (j, &(x, y)) in pts.iter().enumerate() {
            if j == 0 {
                let _ = write!(d, "M{:.1},{:.1}", sx(x), sy(y));
            } else {
                let _ = write!(
                    d,
                    " L{:.1},{:.1} L{:.1},{:.1}",
                    sx(x),
                    sy(last_y),
                    sx(x),
                    sy(y)
                );
            }
            last_y = y;
        }
        let _ = write!(
            svg,
            "<path d='{d}' fill='none' stroke='{}' stroke-width='2'/>",
            COLORS[i % 4]
        );
    }
    svg.push_str("</svg>");
    let mut legend = String::from("<div class=legend>");
    for (i, (name, _)) in series.iter().enumerate() {
        let _ = write!(
            legend,
            "<span><i class=b{}></i>{}</span>",
            i % 4,
            escape(name)
        );
    }
    legend.push_str("</div>");
    format!("{legend}{svg}")
}

/// A roofline-style chart on log axes: each point is (label, FLOP per byte, GFLOP/s), and
/// the line is what `gbps` of bandwidth allows at each intensity.
pub fn roofline(points: &[(String, f64, f64)], gbps: f64) -> String {
    let pts: Vec<&(String, f64, f64)> = points
        .iter()
        .filter(|p| p.1 > 0.0 && p.2 > 0.0 && p.1.is_finite() && p.2.is_finite())
        .collect();
    let lx = |v: f64| v.log10();
    let (mut x0, mut x1) = (-2.0f64, 2.0f64);
    let (mut y0, mut y1) = (-1.0f64, 2.0f64);
    for p in &pts {
        x0 = x0.min(lx(p.1).floor());
        x1 = x1.max(lx(p.1).ceil());
        y0 = y0.min(lx(p.2).floor());
        y1 = y1.max(lx(p.2).ceil());
    }
    if gbps > 0.0 {
        y1 = y1.max(lx(gbps * 10f64.powf(x0)).ceil().min(y1 + 1.0));
    }
    let sx = |v: f64| PAD_L + (lx(v) - x0) / (x1 - x0) * (W - PAD_L - 10.0);
    let sy = |v: f64| H - PAD_B - (lx(v) - y0) / (y1 - y0) * (H - PAD_B - 10.0);
    let mut svg = format!("<svg width={W} height={H} viewBox='0 0 {W} {H}'>");
    axes(
        &mut svg,
        "arithmetic intensity (FLOP per byte moved)",
        "GFLOP/s",
    );
    let mut e = x0 as i32;
    while e as f64 <= x1 {
        let v = 10f64.powi(e);
        let _ = write!(
            svg,
            "<text x={:.1} y={} text-anchor=middle>{}</text>",
            sx(v),
            H - PAD_B + 14.0,
            fmt_pow(e)
        );
        e += 1;
    }
    let mut e = y0 as i32;
    while e as f64 <= y1 {
        let v = 10f64.powi(e);
        y_grid(&mut svg, sy(v), &fmt_pow(e));
        e += 1;
    }
    if gbps > 0.0 {
        // GFLOP/s = intensity × GB/s, clipped to the plot
        let xa = 10f64.powf(x0);
        let xb = 10f64.powf(x1).min(10f64.powf(y1) / gbps);
        let _ = write!(
            svg,
            "<line x1={:.1} y1={:.1} x2={:.1} y2={:.1} stroke='#c0392b' stroke-dasharray='5 3'/>\
             <text x={:.1} y={:.1} fill='#c0392b'>copy bandwidth {gbps:.1} GB/s</text>",
            sx(xa),
            sy(xa * gbps),
            sx(xb),
            sy(xb * gbps),
            sx(xa) + 6.0,
            sy(xa * gbps) - 6.0
        );
    }
    for p in &pts {
        let _ = write!(
            svg,
            "<circle cx={:.1} cy={:.1} r=4 fill='#3b6fd8' fill-opacity=0.7><title>{}: {:.3} FLOP/B, {:.2} GFLOP/s</title></circle>",
            sx(p.1),
            sy(p.2),
            escape(&p.0),
            p.1,
            p.2
        );
    }
    svg.push_str("</svg>");
    svg
}

fn fmt_pow(e: i32) -> String {
    match e {
        0 => "1".into(),
        1 => "10".into(),
        e if e < 0 => format!("1e{e}"),
        e => format!("1e{e}"),
    }
}

/// Milliseconds from nanoseconds, formatted.
pub fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// A time given in milliseconds, in the unit that shows its digits: `1.25 s`, `3.142 ms`,
/// `12.3 µs`, `0.48 µs`.
pub fn time_text(ms: f64) -> String {
    if !ms.is_finite() {
        "–".into()
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 1.0 {
        format!("{ms:.3} ms")
    } else if ms >= 0.01 {
        format!("{:.1} µs", ms * 1e3)
    } else {
        format!("{:.2} µs", ms * 1e3)
    }
}

/// The scale of a column of bars: the 98th percentile of `values`, so that one outlier
/// does not flatten every other bar (bars above it are drawn full width).
pub fn bar_scale(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 1.0;
    }
    v.sort_by(f64::total_cmp);
    let k = ((v.len() - 1) as f64 * 0.98).round() as usize;
    v[k].max(1e-12)
}

/// A page with one section per profile: the figures, the key-averages table with bars of
/// self time, and live memory over time.
pub fn profiles_page(title: &str, profiles: &[(&str, &Profile)]) -> String {
    let mut page = Page::new(title);
    page.p("Recorded with smelt::profiler. Times are wall-clock; bars are self time.");
    for (label, p) in profiles {
        if !label.is_empty() {
            page.h2(label);
        }
        profile_section(&mut page, p);
    }
    page.finish()
}

fn profile_section(page: &mut Page, p: &Profile) {
    let ops = p.of_kind(EventKind::Op).count();
    let kernels = p
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Kernel | EventKind::Extern))
        .count();
    let (alloc, _) = p.memory_totals(MemDevice::Cpu);
    page.cards(&[
        (format!("{} ms", ms(p.wall_ns)), "recorded".into()),
        (ops.to_string(), "eager ops".into()),
        (
            kernels.to_string(),
            "compiled kernels and extern calls".into(),
        ),
        (human_bytes(alloc), "host memory allocated".into()),
        (
            human_bytes(p.peak_memory(MemDevice::Cpu).max(0) as u64),
            "peak live host memory".into(),
        ),
    ]);
    let avg = p.key_averages_by_shape();
    let rows = avg.sorted(SortBy::SelfTime);
    let top = rows.first().map_or(1, |r| r.self_ns.max(1));
    let shown: Vec<Vec<Cell>> = rows
        .iter()
        .take(60)
        .map(|r| {
            vec![
                Cell::Text(r.name.clone()),
                Cell::Text(r.kind.name().into()),
                Cell::Num(r.calls.to_string()),
                Cell::Bars(
                    vec![(0, r.self_ns as f64 / top as f64)],
                    time_text(r.self_ns as f64 / 1e6),
                ),
                Cell::Num(ms(r.total_ns)),
                Cell::Num(human_bytes(r.bytes)),
                Cell::Num(fmt_rate(r.gbps())),
                Cell::Num(human_bytes(r.self_alloc)),
                Cell::Ops(shapes_text(&r.shapes)),
            ]
        })
        .collect();
    page.table(
        &[
            "name",
            "kind",
            "calls",
            "self time",
            "total ms",
            "bytes",
            "GB/s",
            "self mem",
            "input shapes",
        ],
        &shown,
        &[],
    );
    if rows.len() > 60 {
        page.p(&format!("{} more rows not shown.", rows.len() - 60));
    }
    let mut devices: Vec<MemDevice> = p.memory.iter().map(|m| m.device).collect();
    devices.sort();
    devices.dedup();
    for d in devices {
        let pts: Vec<(f64, f64)> = p
            .memory
            .iter()
            .filter(|m| m.device == d)
            .map(|m| (m.t_ns as f64 / 1e6, m.live.max(0) as f64))
            .collect();
        page.h3(&format!("live {d} memory allocated during the session"));
        page.raw(&line_chart(
            &[(&format!("{d} bytes live"), pts)],
            "time (ms)",
            "bytes",
        ));
    }
}

/// A rate with two decimals, or a dash when there is none.
pub fn fmt_rate(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "–".into()
    }
}
