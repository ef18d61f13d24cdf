"""The throughput plots of simulate and measure are readable: the legend never hides a sample
and no sample runs off the top. Checked in display coordinates on the drawn figure."""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg

from tcdsl.teach.measure import figure_both
from tcdsl.teach.report import HEADROOM, FlowInfo, Run, Series, figure, samples

LINK = 10_000_000
INTERVAL = 500_000


def _series(name: str, mbits: list[float]) -> Series:
    n = len(mbits)
    sent = tuple(round(m * 1e6 * INTERVAL / 1e6 / 8) for m in mbits)
    return Series(name, sent, tuple(s // 1514 for s in sent), (0,) * n, (0,) * n)


def _run(shapes: dict[str, list[float]]) -> Run:
    """A run whose series have these Mbit/s samples; each a flow in a class of its name."""
    n = len(next(iter(shapes.values())))
    flows = tuple(
        FlowInfo(name, f"udp dport {i}", name, None, 0, n * INTERVAL)
        for i, name in enumerate(shapes)
    )
    series = tuple(_series(name, mbits) for name, mbits in shapes.items())
    return Run("lab.tcp", "s2-eth2", LINK, n * INTERVAL, INTERVAL, flows, series, series)


# Full link where a legend in the upper right used to sit, and a last sample above the link
# rate (a measurement's last interval can catch a burst): both used to be hidden or cut off.
SHAPES: dict[str, list[float]] = {
    "a-flow-with-a-long-name": [10.0] * 23 + [10.4],
    "h2": [0.0] * 8 + [3.0] * 8 + [0.0] * 7 + [12.9],
    "h3": [2.0] * 24,
}


def _check(fig: Any) -> None:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert len(fig.axes) == 2
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        box = legend.get_window_extent(renderer)
        area = ax.get_window_extent(renderer)
        assert not box.overlaps(area), "the legend covers the plotting area"
        page = fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1, "the legend is cut off"
        assert page.y0 <= box.y0 and box.y1 <= page.y1, "the legend is cut off"
        top = ax.get_ylim()[1]
        drawn = [line.get_xydata() for line in ax.get_lines() if len(line.get_xydata())]
        assert drawn
        for xy in drawn:
            assert xy[:, 1].max() * HEADROOM <= top * 1.0001, "a sample touches the top"
            for x, y in ax.transData.transform(xy):
                assert area.contains(x, y), "a sample is outside the plot"
                assert not box.contains(x, y), "the legend hides a sample"


def test_simulate_plot_keeps_legend_and_samples_apart() -> None:
    run = _run(SHAPES)
    fig = figure(run)
    _check(fig)
    assert fig.axes[0].get_ylim()[1] >= 12.9 * HEADROOM - 0.01


def test_measure_simulate_plot_keeps_legend_and_samples_apart() -> None:
    measured = _run(SHAPES)
    simulated = _run({name: [min(m, 10.0) for m in mbits] for name, mbits in SHAPES.items()})
    fig = figure_both(measured, simulated)
    _check(fig)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[-2:] == ["measured", "simulated"]


def test_a_quiet_run_still_reaches_above_the_link_rate() -> None:
    fig = figure(_run({"idle": [0.0] * 4}))
    _check(fig)
    assert fig.axes[1].get_ylim()[1] == LINK * HEADROOM / 1e6


def test_a_sliver_of_a_last_interval_is_not_drawn() -> None:
    """8 s sampled every 266666 us ends with a 20 us interval: one packet there would read as
    605 Mbit/s and squash the plot (or, with a fixed axis, run off its top)."""
    n = 30
    interval = 266_666
    sent = (333_332,) * n + (1514,)  # 10 Mbit/s, then one packet in the last 20 us
    series = Series("h1", sent, (1,) * (n + 1), (0,) * (n + 1), (0,) * (n + 1))
    flow = FlowInfo("h1", "udp", "h1", None, 0, 8_000_000)
    run = Run("lab.tcp", "eth0", LINK, 8_000_000, interval, (flow,), (series,), (series,))
    assert run.rates(series)[-1] > 600e6
    times, rates = samples(run, series)
    assert len(times) == n and max(rates) < 10.1e6
    fig = figure(run)
    _check(fig)
    assert fig.axes[0].get_ylim()[1] == LINK * HEADROOM / 1e6
    # An interval of half the others or more is a sample like any other.
    even = Run(
        "lab.tcp",
        "eth0",
        LINK,
        n * interval + interval // 2,
        interval,
        (flow,),
        (series,),
        (series,),
    )
    assert len(samples(even, series)[0]) == n + 1
