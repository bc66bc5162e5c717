//! Minimal SVG line charts for the A/B report (no plotting dependency: two charts, a few
//! hundred points each).

use std::fmt::Write;

pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub series: Vec<Series<'a>>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Chart<'_> {
    pub fn render(&self) -> String {
        let fx = |x: f64| if self.log_x { x.max(1e-3).log10() } else { x };
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0f64, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(fx(x));
            x1 = x1.max(fx(x));
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y1) = (0.0, 1.0, 1.0);
        }
        if x1 - x0 < 1e-9 {
            x1 = x0 + 1.0;
        }
        if y1 - y0 < 1e-9 {
            y1 = y0 + 1.0;
        }
        let px = |x: f64| L + (fx(x) - x0) / (x1 - x0) * (W - L - R);
        let py = |y: f64| H - B - (y - y0) / (y1 - y0) * (H - T - B);
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            W / 2.0,
            esc(self.title)
        );
        // Axes, ticks, labels.
        let _ = write!(s, r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>"#, H - B, W - R, H - B, H - B);
        for i in 0..=5 {
            let f = i as f64 / 5.0;
            let xv = x0 + f * (x1 - x0);
            let label = if self.log_x { fmt_num(10f64.powf(xv)) } else { fmt_num(xv) };
            let x = L + f * (W - L - R);
            let _ = write!(s, r#"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="black"/><text x="{x}" y="{}" text-anchor="middle">{label}</text>"#, H - B, H - B + 5.0, H - B + 20.0);
            let yv = y0 + f * (y1 - y0);
            let y = py(yv);
            let _ = write!(s, r##"<line x1="{}" y1="{y}" x2="{L}" y2="{y}" stroke="black"/><line x1="{L}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##, L - 5.0, W - R, L - 8.0, y + 4.0, fmt_num(yv));
        }
        let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, (L + W - R) / 2.0, H - 15.0, esc(self.x_label));
        let _ = write!(s, r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#, (T + H - B) / 2.0, (T + H - B) / 2.0, esc(self.y_label));
        for (i, series) in self.series.iter().enumerate() {
            let path: Vec<String> = series.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
            let _ = write!(s, r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#, series.color, path.join(" "));
            let ly = T + 8.0 + i as f64 * 18.0;
            let _ = write!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                L + 15.0,
                L + 40.0,
                series.color,
                L + 46.0,
                ly + 4.0,
                esc(series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_well_formed_chart() {
        let c = Chart {
            title: "latency <CDF>",
            x_label: "ms",
            y_label: "share",
            log_x: true,
            series: vec![Series { name: "off", color: "#c00", points: vec![(1.0, 0.0), (10.0, 0.5), (100.0, 1.0)] }],
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("latency &lt;CDF&gt;") && svg.contains("polyline"));
        // An empty chart still renders.
        assert!(Chart { series: vec![], ..c }.render().contains("</svg>"));
    }
}
