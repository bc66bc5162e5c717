//! The A/B report's SVG line charts, drawn with `plotters` (its SVG backend, no system fonts):
//! round tick values chosen by plotters' key-point search, a real logarithmic x axis (decades, not
//! evenly spaced logs of arbitrary values) where asked, a legend per series.

use plotters::coord::Shift;
use plotters::prelude::*;

pub struct Series<'a> {
    /// Legend label.
    pub name: &'a str,
    /// Line colour as `#rrggbb`.
    pub color: &'a str,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
}

pub struct Chart<'a> {
    /// Chart caption.
    pub title: &'a str,
    /// X axis description.
    pub x_label: &'a str,
    /// Y axis description.
    pub y_label: &'a str,
    /// Logarithmic x axis (points with x <= 0 are dropped).
    pub log_x: bool,
    /// The lines drawn.
    pub series: Vec<Series<'a>>,
}

const SIZE: (u32, u32) = (720, 420);

/// `#rrggbb` → a plotters colour (black when malformed).
fn rgb(hex: &str) -> RGBColor {
    let h = hex.trim_start_matches('#');
    let byte = |i: usize| h.get(i..i + 2).and_then(|s| u8::from_str_radix(s, 16).ok()).unwrap_or(0);
    RGBColor(byte(0), byte(2), byte(4))
}

/// A tick label: integers without decimals, others with up to three significant digits.
fn tick(v: f64) -> String {
    if v == v.round() && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The range of values (x0, x1, y0, y1) the series span; on a log axis only positive x count.
fn bounds(c: &Chart<'_>) -> (f64, f64, f64, f64) {
    let pts = c.series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite() && (!c.log_x || *x > 0.0));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0f64, f64::MIN);
    for &(x, y) in pts {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y1) = (1.0, 10.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        (x0, x1) = if c.log_x { (x0 / 2.0, x1 * 2.0) } else { (x0 - 0.5, x1 + 0.5) };
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 + 1.0;
    }
    (x0, x1, y0, y1)
}

/// Draws the mesh, the series and the legend on a chart context of either axis kind.
macro_rules! draw_chart {
    ($c:expr, $chart:expr, $log:expr) => {{
        let mut chart = $chart;
        chart
            .configure_mesh()
            .x_desc($c.x_label)
            .y_desc($c.y_label)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(|e| e.to_string())?;
        for s in &$c.series {
            let color = rgb(s.color);
            let pts = s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite() && (!$log || *x > 0.0));
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
        }
        if !$c.series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
    }};
}

impl Chart<'_> {
    /// The chart as an SVG document.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = self.draw(&mut out) {
            // Only a drawing bug gets here; keep the report writable.
            return format!("<svg xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"20\">chart failed: {}</text></svg>\n", e.replace('<', "&lt;"));
        }
        out
    }

    fn draw(&self, out: &mut String) -> Result<(), String> {
        let root: DrawingArea<SVGBackend, Shift> = SVGBackend::with_string(out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (x0, x1, y0, y1) = bounds(self);
        let mut builder = ChartBuilder::on(&root);
        builder.caption(self.title, ("sans-serif", 16)).margin(14).x_label_area_size(42).y_label_area_size(58);
        if self.log_x {
            let chart = builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1).map_err(|e| e.to_string())?;
            draw_chart!(self, chart, true);
        } else {
            let chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(|e| e.to_string())?;
            draw_chart!(self, chart, false);
        }
        root.present().map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_well_formed_chart_with_round_ticks() {
        let c = Chart {
            title: "latency <CDF>",
            x_label: "ms",
            y_label: "share",
            log_x: true,
            series: vec![Series { name: "off", color: "#c00000", points: vec![(1.3, 0.0), (17.0, 0.5), (870.0, 1.0)] }],
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains("latency &lt;CDF&gt;") && svg.contains("polyline"), "{svg}");
        // A log axis from 1.3 to 870: decade ticks, printed as round numbers.
        let labels: Vec<&str> = svg.split("</text>").filter_map(|t| t.rsplit_once('>').map(|(_, l)| l.trim())).collect();
        for label in ["10", "100"] {
            assert!(labels.contains(&label), "missing tick {label} in {labels:?}");
        }
        assert!(!labels.iter().any(|l| l.starts_with("1.3") || l.starts_with("870")), "ticks are round values: {labels:?}");
        // An empty chart still renders.
        assert!(Chart { series: vec![], ..c }.render().contains("</svg>"));
    }

    #[test]
    fn tick_labels() {
        assert_eq!((tick(100.0), tick(0.25), tick(2.5), tick(0.1)), ("100".into(), "0.25".into(), "2.5".into(), "0.1".into()));
    }
}
