//! The SVG chart, drawn with `plotters` (its SVG backend alone: the SVG names a font family
//! and the viewer lays the text out, so no font is compiled in).
//!
//! Four panels of horizontal bars, a group per tier: W1 p50 latency, W2 throughput, W2 max
//! wait and W3 recovery, each with lockkit beside its raw floor and its peer where the tier
//! has them (and beside its second raw floor, PostgreSQL's lease table, in a bar that every
//! group has when a tier of the run has one). Latency and wait are on log scales (memory and etcd are two orders apart); on
//! the linear ones a tier far beyond the others (memory's throughput) has its bar cut at the
//! end of the axis, its value written inside it.

use plotters::coord::Shift;
use plotters::coord::ranged1d::{SegmentValue, SegmentedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordi32;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::TierReport;

const WIDTH: u32 = 960;
/// The height of a row of the colour key (it takes a second row when it does not fit in one).
const LEGEND_ROW_HEIGHT: u32 = 34;
/// The height of one bar's slot in a panel: a tier's group is a slot per bar and one more.
const SLOT_HEIGHT: u32 = 12;
/// The caption, the x axis and the margins of a panel.
const PANEL_CHROME: u32 = 84;
const FONT: &str = "sans-serif";

/// The contenders of a tier: lockkit, lockkit with non-fair mutexes, the raw floor, the
/// second raw floor, the peer.
const CONTENDERS: usize = 5;

/// The second raw floor's index in [`CONTENDERS`]: its bar is drawn only in a chart where a
/// tier has one.
const SECOND_FLOOR: usize = 3;

/// Their colours, in that order.
const COLORS: [RGBColor; CONTENDERS] = [
    RGBColor(0x48, 0x78, 0xa8),
    RGBColor(0x9c, 0xc3, 0xe6),
    RGBColor(0xa0, 0xa0, 0xa0),
    RGBColor(0x6a, 0x6a, 0x6a),
    RGBColor(0xe0, 0x8a, 0x2c),
];

/// The contenders that have a bar in each tier's group, in [`CONTENDERS`] order (lockkit on
/// top, the peer lowest): all but the second raw floor, and that one too when a tier of the
/// chart has one. A group is a slot per bar and a gap above them.
#[derive(Debug)]
struct Bars(Vec<usize>);

impl Bars {
    fn of(panels: &[Panel]) -> Bars {
        let second_floor = panels
            .iter()
            .any(|p| p.values.iter().any(|v| v[SECOND_FLOOR].is_some()));
        Bars(
            (0..CONTENDERS)
                .filter(|&c| c != SECOND_FLOOR || second_floor)
                .collect(),
        )
    }

    /// Slots per tier.
    fn slots(&self) -> i32 {
        self.0.len() as i32 + 1
    }

    /// The slot of `contender`'s bar within its group (0: the lowest), if it has one.
    fn slot(&self, contender: usize) -> Option<i32> {
        let place = self.0.iter().position(|&c| c == contender)?;
        Some((self.0.len() - 1 - place) as i32)
    }

    /// The slot the tier's name (and a missing value's note) is centred on.
    fn middle(&self) -> i32 {
        self.0.len() as i32 / 2
    }
}

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
                Some([
                    Some(u.p50_us),
                    None,
                    u.floor_p50_us,
                    u.second_floor_p50_us,
                    u.peer_p50_us,
                ])
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
                    of(c.second_floor.as_ref()),
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
                    of(c.second_floor.as_ref()),
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
            |r| {
                let recovery = r.holder_crash.as_ref()?.recovery_ms;
                Some([Some(recovery), None, None, None, None])
            },
        ),
    ];
    let bars = Bars::of(&panels);
    let names: Vec<&str> = reports.iter().map(|r| r.target.as_str()).collect();
    let group_height = SLOT_HEIGHT * bars.slots() as u32;
    let panel_height = PANEL_CHROME + group_height * names.len().max(1) as u32;
    let entries = legend_entries(&bars, peer.as_deref());
    let legend_height = LEGEND_ROW_HEIGHT * legend_rows(&entries);
    let height = legend_height + 2 * panel_height;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (legend_area, body) = root.split_vertically(legend_height);
        legend(&legend_area, &entries).map_err(|e| e.to_string())?;
        for (area, panel) in body.split_evenly((2, 2)).iter().zip(&panels) {
            draw_panel(area, panel, &bars, &names).map_err(|e| e.to_string())?;
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

/// The colour key's entries, a text and a colour per bar of a group.
fn legend_entries(bars: &Bars, peer: Option<&str>) -> Vec<(String, RGBColor)> {
    bars.0
        .iter()
        .map(|&contender| {
            let text = match contender {
                0 => "lockkit".to_owned(),
                1 => "lockkit, non-fair".to_owned(),
                2 => "raw floor: the same protocol by hand (floors.rs)".to_owned(),
                SECOND_FLOOR => "2nd raw floor: a lease table (PostgreSQL)".to_owned(),
                _ => format!("peer: {}", peer.unwrap_or("none in this run")),
            };
            (text, COLORS[contender])
        })
        .collect()
}

/// Where each entry of the colour key goes: its x and its row, the entries laid out left to
/// right and wrapped onto another row where the chart's width ends.
fn legend_places(entries: &[(String, RGBColor)]) -> Vec<(i32, i32)> {
    const START: i32 = 16;
    let (mut x, mut row) = (START, 0);
    entries
        .iter()
        .map(|(text, _)| {
            let width = 20 + text_width(text, LEGEND_PX);
            if x > START && x + width > WIDTH as i32 - START {
                (x, row) = (START, row + 1);
            }
            let place = (x, row);
            x += width + 32;
            place
        })
        .collect()
}

/// How many rows the colour key takes.
fn legend_rows(entries: &[(String, RGBColor)]) -> u32 {
    legend_places(entries)
        .last()
        .map_or(1, |&(_, row)| row as u32 + 1)
}

/// The colour key, across the top.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[(String, RGBColor)]) -> DrawResult {
    let style = TextStyle::from(font(LEGEND_PX)).pos(Pos::new(HPos::Left, VPos::Center));
    for ((text, color), (x, row)) in entries.iter().zip(legend_places(entries)) {
        let y = row * LEGEND_ROW_HEIGHT as i32 + LEGEND_ROW_HEIGHT as i32 / 2;
        area.draw(&Rectangle::new(
            [(x, y - 7), (x + 14, y + 7)],
            color.filled(),
        ))?;
        area.draw(&Text::new(text.clone(), (x + 20, y), style.clone()))?;
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
    bars: &Bars,
    names: &[&str],
) -> DrawResult {
    let label_width = names
        .iter()
        .map(|n| text_width(n, TIER_PX))
        .max()
        .unwrap_or(40) as u32
        + 14;
    let slots = bars.slots() * names.len().max(1) as i32;
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
        mesh(&mut chart, bars, names, 0)?;
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
        mesh(&mut chart, bars, names, 6)?;
        draw_bars(&mut chart, panel, bars, low, None)
    } else {
        let high = top / share;
        let mut chart = builder.build_cartesian_2d(0.0..high, y)?;
        mesh(&mut chart, bars, names, 5)?;
        draw_bars(&mut chart, panel, bars, 0.0, cut.then_some(high))
    }
}

type Chart<'a, X> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, SegmentedCoord<RangedCoordi32>>>;

/// The axes, with `x_labels` values below (none if 0), and the tier names on the left of
/// their groups (drawn here rather than as axis labels: those go on every slot).
fn mesh<X>(chart: &mut Chart<'_, X>, bars: &Bars, names: &[&str], x_labels: usize) -> DrawResult
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
        let group = (tiers - 1 - i as i32) * bars.slots();
        EmptyElement::at((base, SegmentValue::CenterOf(group + bars.middle())))
            + Text::new(name.to_string(), (-8, 0), style.clone())
    }))?;
    Ok(())
}

/// The bars of `panel`, from `base`, each with its value at its end; a bar beyond `cut` ends
/// there, with its value inside it.
fn draw_bars<X>(
    chart: &mut Chart<'_, X>,
    panel: &Panel,
    bars: &Bars,
    base: f64,
    cut: Option<f64>,
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
{
    let tiers = panel.values.len() as i32;
    let outside = TextStyle::from(font(VALUE_PX)).pos(Pos::new(HPos::Left, VPos::Center));
    let inside = TextStyle::from(font(VALUE_PX))
        .pos(Pos::new(HPos::Right, VPos::Center))
        .color(&WHITE);
    for (i, values) in panel.values.iter().enumerate() {
        let group = (tiers - 1 - i as i32) * bars.slots();
        if values[0].is_none() {
            chart.draw_series(std::iter::once(
                EmptyElement::at((base, SegmentValue::CenterOf(group + bars.middle())))
                    + Text::new(panel.missing[i], (4, 0), outside.clone()),
            ))?;
        }
        for (contender, value) in values.iter().enumerate() {
            let (Some(value), Some(slot)) = (*value, bars.slot(contender)) else {
                continue;
            };
            let slot = group + slot;
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
mod tests;
