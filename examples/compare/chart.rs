//! The SVG chart, drawn with `plotters` (its SVG backend alone: the SVG names a font family
//! and the viewer lays the text out, so no font is compiled in).
//!
//! Four panels of horizontal bars, a group per tier: W1 p50 latency, W2 throughput, W2 max
//! wait and W3 recovery, each with lockkit beside its raw floor and its peer where the tier
//! has them. Latency and wait are on log scales (memory and etcd are two orders apart); on
//! the linear ones a tier far beyond the others (memory's throughput) has its bar cut at the
//! end of the axis, its value written inside it.

use plotters::coord::Shift;
use plotters::coord::ranged1d::{SegmentValue, SegmentedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordi32;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::TierReport;

const WIDTH: u32 = 960;
const LEGEND_HEIGHT: u32 = 34;
/// The height of one tier's group of bars in a panel.
const GROUP_HEIGHT: u32 = 60;
/// The caption, the x axis and the margins of a panel.
const PANEL_CHROME: u32 = 84;
const FONT: &str = "sans-serif";

/// The contenders of a tier: lockkit, lockkit with non-fair mutexes, the raw floor, the peer.
const CONTENDERS: usize = 4;

/// Their colours, in that order.
const COLORS: [RGBColor; CONTENDERS] = [
    RGBColor(0x48, 0x78, 0xa8),
    RGBColor(0x9c, 0xc3, 0xe6),
    RGBColor(0xa0, 0xa0, 0xa0),
    RGBColor(0xe0, 0x8a, 0x2c),
];
/// Slots per tier: a bar per contender (peer lowest, lockkit on top) and a gap above them.
const SLOTS: i32 = CONTENDERS as i32 + 1;

/// One panel: a value per tier and contender (see [`CONTENDERS`]), or why there is none.
struct Panel {
    title: &'static str,
    unit: &'static str,
    log: bool,
    values: Vec<[Option<f64>; CONTENDERS]>,
    /// Shown in place of lockkit's bar where it has no value: `FAILED`, `not run`.
    missing: Vec<&'static str>,
}

impl Panel {
    fn new(
        title: &'static str,
        unit: &'static str,
        log: bool,
        reports: &[TierReport],
        workload: &str,
        values: impl Fn(&TierReport) -> Option<[Option<f64>; CONTENDERS]>,
    ) -> Panel {
        let values: Vec<_> = reports
            .iter()
            .map(|r| {
                // A value a scale cannot place (NaN, or 0 on a log scale) is left out.
                values(r)
                    .unwrap_or([None; CONTENDERS])
                    .map(|v| v.filter(|v| v.is_finite() && (*v > 0.0 || !log && *v == 0.0)))
            })
            .collect();
        let missing = reports
            .iter()
            .map(|r| {
                if r.failed(workload) {
                    "FAILED"
                } else {
                    "not run"
                }
            })
            .collect();
        Panel {
            title,
            unit,
            log,
            values,
            missing,
        }
    }

    fn max(&self) -> Option<f64> {
        self.values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .reduce(f64::max)
    }

    /// The largest value of the tiers other than the one with the largest.
    fn runner_up(&self) -> Option<f64> {
        let mut tops: Vec<f64> = self
            .values
            .iter()
            .filter_map(|v| v.iter().flatten().copied().reduce(f64::max))
            .collect();
        tops.sort_by(f64::total_cmp);
        tops.len().checked_sub(2).map(|i| tops[i])
    }

    fn min(&self) -> Option<f64> {
        self.values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .reduce(f64::min)
    }
}

/// The chart of `reports` as an SVG document.
pub(crate) fn svg(reports: &[TierReport]) -> Result<String, String> {
    let peer = reports
        .iter()
        .find_map(|r| r.contended.as_ref()?.peer.as_ref().map(|p| p.what.clone()))
        .or_else(|| {
            reports
                .iter()
                .find_map(|r| r.uncontended.as_ref()?.peer.clone())
        });
    let panels = [
        Panel::new(
            "W1 uncontended: acquire+release p50 (µs, log)",
            "µs",
            true,
            reports,
            "W1",
            |r| {
                let u = r.uncontended.as_ref()?;
                Some([Some(u.p50_us), None, u.floor_p50_us, u.peer_p50_us])
            },
        ),
        Panel::new(
            "W2 contended, 8 workers: increments/s",
            "/s",
            false,
            reports,
            "W2",
            |r| {
                let c = r.contended.as_ref()?;
                let of = |s: Option<&crate::speed::ContendedSide>| s.map(|s| s.increments_per_sec);
                Some([
                    Some(c.lockkit.increments_per_sec),
                    of(c.non_fair.as_ref()),
                    of(c.floor.as_ref()),
                    of(c.peer.as_ref()),
                ])
            },
        ),
        Panel::new(
            "W2 contended: max wait for the lock (ms, log)",
            "ms",
            true,
            reports,
            "W2",
            |r| {
                let c = r.contended.as_ref()?;
                let of = |s: Option<&crate::speed::ContendedSide>| s.map(|s| s.wait_max_us / 1e3);
                Some([
                    Some(c.lockkit.wait_max_us / 1e3),
                    of(c.non_fair.as_ref()),
                    of(c.floor.as_ref()),
                    of(c.peer.as_ref()),
                ])
            },
        ),
        Panel::new(
            "W3 holder killed: granted after (ms, TTL 2 s)",
            "ms",
            false,
            reports,
            "W3",
            |r| Some([Some(r.holder_crash.as_ref()?.recovery_ms), None, None, None]),
        ),
    ];
    let names: Vec<&str> = reports.iter().map(|r| r.target.as_str()).collect();
    let panel_height = PANEL_CHROME + GROUP_HEIGHT * names.len().max(1) as u32;
    let height = LEGEND_HEIGHT + 2 * panel_height;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (legend_area, body) = root.split_vertically(LEGEND_HEIGHT);
        legend(&legend_area, peer.as_deref()).map_err(|e| e.to_string())?;
        for (area, panel) in body.split_evenly((2, 2)).iter().zip(&panels) {
            draw_panel(area, panel, &names).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

type DrawResult =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>>;

/// A font of `px` pixels as the SVG shows it (plotters' SVG backend writes the size it is
/// given over 1.24).
fn font(px: f64) -> FontDesc<'static> {
    (FONT, px * 1.24).into_font()
}

/// The colour key, across the top.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, peer: Option<&str>) -> DrawResult {
    let peer = format!("peer: {}", peer.unwrap_or("none in this run"));
    let entries = [
        "lockkit",
        "lockkit, non-fair",
        "raw floor: the same protocol by hand (floors.rs)",
        peer.as_str(),
    ];
    let style = TextStyle::from(font(LEGEND_PX)).pos(Pos::new(HPos::Left, VPos::Center));
    let mut x = 16;
    let y = LEGEND_HEIGHT as i32 / 2;
    for (entry, color) in entries.iter().zip(COLORS) {
        area.draw(&Rectangle::new(
            [(x, y - 7), (x + 14, y + 7)],
            color.filled(),
        ))?;
        area.draw(&Text::new(entry.to_string(), (x + 20, y), style.clone()))?;
        x += 20 + text_width(entry, LEGEND_PX) + 32;
    }
    Ok(())
}

const LEGEND_PX: f64 = 14.0;
const CAPTION_PX: f64 = 15.0;
const TIER_PX: f64 = 13.0;
const VALUE_PX: f64 = 12.0;
const AXIS_PX: f64 = 11.5;

/// A generous estimate of the width of `text` in a sans-serif font of `px` pixels (the SVG
/// viewer lays the text out: the chart only leaves room for it).
fn text_width(text: &str, px: f64) -> i32 {
    (text.chars().count() as f64 * px * 0.55).ceil() as i32
}

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    panel: &Panel,
    names: &[&str],
) -> DrawResult {
    let label_width = names
        .iter()
        .map(|n| text_width(n, TIER_PX))
        .max()
        .unwrap_or(40) as u32
        + 14;
    let slots = SLOTS * names.len().max(1) as i32;
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(panel.title, font(CAPTION_PX))
        .margin(10)
        .margin_right(18)
        .x_label_area_size(24)
        .y_label_area_size(label_width);
    let y = (0..slots).into_segmented();
    let Some(max) = panel.max() else {
        let mut chart = builder.build_cartesian_2d(0.0..1.0, y)?;
        mesh(&mut chart, names, 0)?;
        chart.draw_series(std::iter::once(Text::new(
            "not run",
            (0.02, SegmentValue::CenterOf(slots / 2)),
            font(VALUE_PX),
        )))?;
        return Ok(());
    };
    // The axis ends where the longest bar leaves room for its value, or where the second
    // longest tier's does if one tier is far beyond the others (memory's throughput): that
    // one's bar is cut at the end of the axis and its value written inside it.
    let plot_width = (area.dim_in_pixel().0 as f64 - label_width as f64 - 30.0).max(100.0);
    let runner_up = panel.runner_up();
    let (top, cut) = match runner_up {
        Some(second) if !panel.log && max > 3.0 * second => (second, true),
        _ => (max, false),
    };
    let label_room = text_width(&value_label(top, panel.unit), VALUE_PX) as f64 + 8.0;
    let share = (plot_width - label_room) / plot_width;
    if panel.log {
        let low = 10f64.powf(panel.min().unwrap_or(1.0).max(1e-3).log10().floor() - 0.3);
        let high = 10f64.powf(low.log10() + (top.log10() - low.log10()) / share);
        let mut chart = builder.build_cartesian_2d((low..high).log_scale(), y)?;
        mesh(&mut chart, names, 6)?;
        bars(&mut chart, panel, low, None)
    } else {
        let high = top / share;
        let mut chart = builder.build_cartesian_2d(0.0..high, y)?;
        mesh(&mut chart, names, 5)?;
        bars(&mut chart, panel, 0.0, cut.then_some(high))
    }
}

type Chart<'a, X> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, SegmentedCoord<RangedCoordi32>>>;

/// The axes, with `x_labels` values below (none if 0), and the tier names on the left of
/// their groups (drawn here rather than as axis labels: those go on every slot).
fn mesh<X>(chart: &mut Chart<'_, X>, names: &[&str], x_labels: usize) -> DrawResult
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let values = |v: &f64| axis_label(*v);
    let mut mesh = chart.configure_mesh();
    mesh.disable_y_mesh()
        .light_line_style(WHITE)
        .set_tick_mark_size(LabelAreaPosition::Left, 0)
        .y_labels(1)
        .y_label_formatter(&|_| String::new())
        .x_labels(x_labels)
        .x_label_formatter(&values)
        .x_label_style(font(AXIS_PX));
    if x_labels == 0 {
        mesh.disable_x_axis().disable_x_mesh();
    }
    mesh.draw()?;
    let base = chart.x_range().start;
    let style = TextStyle::from(font(TIER_PX)).pos(Pos::new(HPos::Right, VPos::Center));
    let tiers = names.len() as i32;
    chart.draw_series(names.iter().enumerate().map(|(i, name)| {
        let group = (tiers - 1 - i as i32) * SLOTS;
        EmptyElement::at((base, SegmentValue::CenterOf(group + 2)))
            + Text::new(name.to_string(), (-8, 0), style.clone())
    }))?;
    Ok(())
}

/// The bars of `panel`, from `base`, each with its value at its end; a bar beyond `cut` ends
/// there, with its value inside it.
fn bars<X>(chart: &mut Chart<'_, X>, panel: &Panel, base: f64, cut: Option<f64>) -> DrawResult
where
    X: Ranged<ValueType = f64>,
{
    let tiers = panel.values.len() as i32;
    let outside = TextStyle::from(font(VALUE_PX)).pos(Pos::new(HPos::Left, VPos::Center));
    let inside = TextStyle::from(font(VALUE_PX))
        .pos(Pos::new(HPos::Right, VPos::Center))
        .color(&WHITE);
    for (i, values) in panel.values.iter().enumerate() {
        let group = (tiers - 1 - i as i32) * SLOTS;
        if values[0].is_none() {
            chart.draw_series(std::iter::once(
                EmptyElement::at((base, SegmentValue::CenterOf(group + 2)))
                    + Text::new(panel.missing[i], (4, 0), outside.clone()),
            ))?;
        }
        for (contender, value) in values.iter().enumerate() {
            let Some(value) = *value else { continue };
            let slot = group + CONTENDERS as i32 - 1 - contender as i32;
            let end = cut.map_or(value, |cut| value.min(cut));
            let mut bar = Rectangle::new(
                [
                    (base, SegmentValue::Exact(slot)),
                    (end, SegmentValue::Exact(slot + 1)),
                ],
                COLORS[contender].filled(),
            );
            bar.set_margin(1, 1, 0, 0);
            chart.draw_series(std::iter::once(bar))?;
            let label = value_label(value, panel.unit);
            let text = if end < value {
                Text::new(format!("{label} »"), (-4, 0), inside.clone())
            } else {
                Text::new(label, (4, 0), outside.clone())
            };
            chart.draw_series(std::iter::once(
                EmptyElement::at((end, SegmentValue::CenterOf(slot))) + text,
            ))?;
        }
    }
    Ok(())
}

fn value_label(value: f64, unit: &str) -> String {
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {unit}")
}

fn axis_label(value: f64) -> String {
    if value >= 1000.0 {
        format!("{}k", value / 1000.0)
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::HolderCrash;
    use crate::speed::{Contended, ContendedSide, Uncontended};
    use crate::{Failure, TierReport};

    fn side(what: &str, increments_per_sec: f64, wait_max_us: f64) -> ContendedSide {
        ContendedSide {
            what: what.to_owned(),
            final_value: 6000,
            lost_updates: 0,
            increments_per_sec,
            wait_p50_us: wait_max_us / 20.0,
            wait_p99_us: wait_max_us / 2.0,
            wait_max_us,
            cpu_us_per_increment: None,
            wait_max_all_rounds_us: wait_max_us,
            rounds: Vec::new(),
        }
    }

    fn tier(
        target: &str,
        w1: [Option<f64>; 3],
        w2: [Option<(f64, f64)>; 3],
        w3: Option<f64>,
    ) -> TierReport {
        let [lockkit, floor, peer] = w2;
        let (lockkit_incr, lockkit_wait) = lockkit.unwrap_or((1.0, 1.0));
        TierReport {
            target: target.to_owned(),
            tier: "single".to_owned(),
            uncontended: w1[0].map(|p50_us| Uncontended {
                cycles: 2000,
                cycles_per_sec: 1e6 / p50_us,
                p50_us,
                p99_us: p50_us * 3.0,
                floor: w1[1].map(|_| "floor".to_owned()),
                floor_p50_us: w1[1],
                vs_floor: w1[1].map(|f| p50_us / f),
                peer: w1[2].map(|_| "rslock 0.10".to_owned()),
                peer_cycles_per_sec: w1[2].map(|p| 1e6 / p),
                peer_p50_us: w1[2],
                peer_p99_us: w1[2],
                vs_peer: w1[2].map(|p| p50_us / p),
                reference: None,
                reference_p50_us: None,
                vs_reference: None,
            }),
            contended: lockkit.map(|_| Contended {
                workers: 8,
                iterations: 250,
                rounds: 3,
                lockkit: side("lockkit", lockkit_incr, lockkit_wait),
                non_fair: None,
                floor: floor.map(|(i, w)| side("floor", i, w)),
                peer: peer.map(|(i, w)| side("rslock 0.10", i, w)),
                throughput_vs_floor: None,
                throughput_vs_peer: None,
                max_wait_vs_floor: None,
                max_wait_vs_peer: None,
            }),
            holder_crash: w3.map(|recovery_ms| HolderCrash {
                ttl_ms: 2000,
                recovery_ms,
            }),
            ..TierReport::default()
        }
    }

    /// A run like the suite's, with a tier whose W2 failed.
    fn reports() -> Vec<TierReport> {
        let mut etcd = tier(
            "etcd-3",
            [Some(3223.5), Some(2899.0), None],
            [None, None, None],
            Some(2120.0),
        );
        etcd.failures.push(Failure {
            workload: "W2",
            error: "a test failure".to_owned(),
        });
        vec![
            tier(
                "memory",
                [Some(15.0), None, None],
                [Some((16057.0, 1100.0)), None, None],
                None,
            ),
            tier(
                "redis",
                [Some(249.2), Some(208.3), Some(216.9)],
                [
                    Some((2057.0, 15_800.0)),
                    Some((1527.0, 111_200.0)),
                    Some((634.0, 197_400.0)),
                ],
                Some(2004.0),
            ),
            tier(
                "redis-sentinel",
                [Some(315.7), Some(246.6), None],
                [Some((1072.0, 77_900.0)), Some((1199.0, 142_900.0)), None],
                Some(2010.0),
            ),
            tier(
                "redlock-5",
                [Some(993.4), Some(456.3), Some(497.1)],
                [
                    Some((436.0, 179_300.0)),
                    Some((542.0, 101_000.0)),
                    Some((371.0, 295_000.0)),
                ],
                Some(2033.0),
            ),
            etcd,
            tier(
                "zk-3",
                [Some(2061.0), Some(2064.3), None],
                [Some((580.0, 23_000.0)), Some((700.0, 18_000.0)), None],
                Some(2400.0),
            ),
        ]
    }

    /// Every `<text>` of the chart: its x, size, anchor and content.
    fn texts(svg: &str) -> Vec<(f64, f64, String, String)> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let attr = |name: &str| {
                    t.split(&format!(" {name}=\""))
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                        .unwrap_or_default()
                        .to_owned()
                };
                let content = t
                    .split_once('>')
                    .and_then(|(_, rest)| rest.split_once("</text>"))
                    .map_or(String::new(), |(content, _)| content.trim().to_owned());
                let px: f64 = attr("font-size").parse().unwrap_or(f64::NAN);
                (
                    attr("x").parse().unwrap_or(f64::NAN),
                    px,
                    attr("text-anchor"),
                    content,
                )
            })
            .collect()
    }

    #[test]
    fn the_chart_shows_every_panel_and_every_tier_within_its_width() {
        let svg = svg(&reports()).expect("the chart is drawn");
        if let Ok(path) = std::env::var("COMPARE_CHART_SAMPLE") {
            std::fs::write(path, &svg).expect("the sample is written");
        }
        let texts = texts(&svg);
        let shown = |s: &str| texts.iter().filter(|(.., t)| t == s).count();
        for title in [
            "W1 uncontended",
            "W2 contended, 8",
            "W2 contended: max",
            "W3 holder",
        ] {
            assert_eq!(
                texts.iter().filter(|(.., t)| t.starts_with(title)).count(),
                1,
                "{title}"
            );
        }
        for name in [
            "memory",
            "redis",
            "redis-sentinel",
            "redlock-5",
            "etcd-3",
            "zk-3",
        ] {
            assert_eq!(shown(name), 4, "{name} is named in every panel");
        }
        assert_eq!(shown("FAILED"), 2, "etcd's W2 failed, in both W2 panels");
        assert_eq!(shown("not run"), 1, "memory has no W3");
        assert_eq!(shown("2057 /s"), 1, "a value is shown at its bar");
        let legend = [
            "lockkit",
            "lockkit, non-fair",
            "raw floor: the same protocol by hand (floors.rs)",
            "peer: rslock 0.10",
        ];
        for (x, px, anchor, text) in &texts {
            let width = text_width(text, *px) as f64;
            let (left, right) = match anchor.as_str() {
                "middle" => (x - width / 2.0, x + width / 2.0),
                "end" => (x - width, *x),
                _ => (*x, x + width),
            };
            // Within the chart, and within its column but for the legend across the top.
            let column = WIDTH as f64 / 2.0;
            let edge = if left < column && !legend.contains(&text.as_str()) {
                column
            } else {
                WIDTH as f64
            };
            assert!(
                left >= 0.0 && right <= edge,
                "{text:?} at {x} ({anchor}) is cut off"
            );
        }
    }
}
