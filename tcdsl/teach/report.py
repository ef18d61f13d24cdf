"""Throughput runs as data, a text table and a PNG plot; shared by ``simulate`` and ``measure``.

A ``Run`` is what either command found: per class and per flow, the bytes sent, the packets
dropped and the queueing delay in each sampling interval. Nothing here knows how the numbers
were obtained, so a measurement on a real link reports exactly like a simulation.

Each series is sampled every ``interval`` microseconds from 0 to ``duration`` (the last
interval may be shorter). Throughput over a span that cuts through an interval takes that
interval's bytes in proportion to the overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tcdsl.units import format_rate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class Series:
    """One class's or one flow's counters, one entry per sampling interval."""

    name: str
    bytes: tuple[int, ...]
    """Bytes sent (dequeued onto the link) in each interval."""
    packets: tuple[int, ...]
    """Packets sent in each interval."""
    drops: tuple[int, ...]
    """Packets dropped in each interval."""
    delay: tuple[int, ...]
    """Sum of the queueing delays (microseconds) of the packets sent in each interval."""


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """A flow of the run: its name, spec, the class it ends in, its rate and its lifetime."""

    name: str
    spec: str
    cls: str
    rate: int | None
    """Bits per second; None: greedy."""
    start: int
    """Microseconds."""
    stop: int
    """Microseconds (the end of the run when the flow does not stop earlier)."""


@dataclass(frozen=True, slots=True)
class Period:
    """A span of the run during which the same flows are active."""

    start: int
    stop: int
    flows: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """The result of a simulation or a measurement."""

    source: str
    """The policy file."""
    interface: str
    link: int
    """The link rate, bits per second."""
    duration: int
    """Microseconds."""
    interval: int
    """Microseconds between samples."""
    flows: tuple[FlowInfo, ...]
    classes: tuple[Series, ...]
    flow_series: tuple[Series, ...]
    events: int = 0
    """Events the simulator processed (0 for a measurement)."""
    notes: tuple[str, ...] = ()
    """What the model left out for this policy, in words."""

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """The sampling intervals as (start, stop) microseconds."""
        edges = [*range(0, self.duration, self.interval), self.duration]
        return tuple(pairwise(edges))

    def periods(self) -> tuple[Period, ...]:
        """The spans between flow starts and stops, with the flows active in each."""
        cuts = {0, self.duration}
        for f in self.flows:
            cuts.update(t for t in (f.start, f.stop) if 0 < t < self.duration)
        edges = sorted(cuts)
        return tuple(
            Period(a, b, tuple(f.name for f in self.flows if f.start <= a and f.stop >= b))
            for a, b in pairwise(edges)
        )

    def bytes_between(self, series: Series, start: int, stop: int) -> float:
        """Bytes ``series`` sent between ``start`` and ``stop`` (microseconds)."""
        total = 0.0
        for (a, b), sent in zip(self.bounds, series.bytes, strict=True):
            overlap = min(b, stop) - max(a, start)
            if overlap > 0:
                total += sent * overlap / (b - a)
        return total

    def rate_between(self, series: Series, start: int, stop: int) -> float:
        """Mean throughput of ``series`` between ``start`` and ``stop``, bits per second."""
        if stop <= start:
            return 0.0
        return self.bytes_between(series, start, stop) * 8 * 1_000_000 / (stop - start)

    def rates(self, series: Series) -> tuple[float, ...]:
        """Throughput in each sampling interval, bits per second."""
        return tuple(
            sent * 8 * 1_000_000 / (b - a)
            for (a, b), sent in zip(self.bounds, series.bytes, strict=True)
        )

    def mean_delay(self, series: Series) -> float | None:
        """Mean queueing delay of the packets sent, microseconds (None: none sent)."""
        packets = sum(series.packets)
        return sum(series.delay) / packets if packets else None

    def series(self, name: str) -> Series:
        """The class series called ``name``; raises KeyError."""
        for s in self.classes:
            if s.name == name:
                return s
        raise KeyError(name)

    def flow(self, name: str) -> Series:
        """The flow series called ``name``; raises KeyError."""
        for s in self.flow_series:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The run as plain JSON data (rates in bits/s, times in microseconds)."""

        def series(s: Series) -> dict[str, Any]:
            return {
                "name": s.name,
                "bytes": list(s.bytes),
                "packets": list(s.packets),
                "drops": list(s.drops),
                "delay_us": list(s.delay),
                "mean_bps": round(self.rate_between(s, 0, self.duration)),
                "periods_bps": [round(self.rate_between(s, p.start, p.stop)) for p in periods],
                "mean_delay_us": None if (d := self.mean_delay(s)) is None else round(d),
            }

        periods = self.periods()
        return {
            "source": self.source,
            "interface": self.interface,
            "link_bps": self.link,
            "duration_us": self.duration,
            "interval_us": self.interval,
            "events": self.events,
            "notes": list(self.notes),
            "flows": [
                {
                    "name": f.name,
                    "spec": f.spec,
                    "class": f.cls,
                    "rate_bps": f.rate,
                    "start_us": f.start,
                    "stop_us": f.stop,
                }
                for f in self.flows
            ],
            "periods": [
                {"start_us": p.start, "stop_us": p.stop, "flows": list(p.flows)} for p in periods
            ],
            "classes": [series(s) for s in self.classes],
            "flow_series": [series(s) for s in self.flow_series],
        }


def _seconds(us: int) -> str:
    text = f"{us / 1_000_000:.3f}".rstrip("0").rstrip(".")
    return f"{text}s"


def _cell(run: Run, bps: float) -> str:
    return f"{bps / 1e6:.2f} ({100 * bps / run.link:.1f}%)"


def _delay(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def table(run: Run) -> str:
    """An aligned text table: per class and per flow, the mean throughput over the run and over
    each period (Mbit/s and % of the link), the mean queueing delay and the drops."""
    periods = run.periods()
    letters = [chr(ord("A") + i) if i < 26 else f"P{i + 1}" for i in range(len(periods))]
    lines = [
        f"{run.source} on {run.interface}: link {format_rate(run.link)}, "
        f"{_seconds(run.duration)}, sampled every {_seconds(run.interval)}",
        "flows:",
    ]
    width = max((len(f.name) for f in run.flows), default=0)
    for f in run.flows:
        rate = "greedy" if f.rate is None else f"rate {format_rate(f.rate)}"
        lines.append(
            f"  {f.name:<{width}}  {f.spec}; {rate}, {_seconds(f.start)}-{_seconds(f.stop)}"
            f" -> {f.cls}"
        )
    lines.append("periods:")
    for letter, p in zip(letters, periods, strict=True):
        flows = ", ".join(p.flows) or "no flow"
        lines.append(f"  {letter}  {_seconds(p.start)}-{_seconds(p.stop)}: {flows}")
    lines.append("")
    lines.append("mean throughput in Mbit/s (% of the link), queueing delay in ms:")
    head = ["", "run", *letters, "delay", "drops"]
    rows = [head]
    for kind, group in (("class", run.classes), ("flow", run.flow_series)):
        for s in group:
            cells = [f"{kind} {s.name}", _cell(run, run.rate_between(s, 0, run.duration))]
            cells += [_cell(run, run.rate_between(s, p.start, p.stop)) for p in periods]
            cells += [_delay(run.mean_delay(s)), str(sum(s.drops))]
            rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        first = r[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
    lines.extend(f"note: {n}" for n in run.notes)
    return "\n".join(lines) + "\n"


HEADROOM = 1.08
"""The y axis reaches this much above the link rate or the highest sample, whichever is higher."""


def samples(run: Run, series: Series) -> tuple[list[float], list[float]]:
    """The points to plot: the middle of each sampling interval (seconds) and the throughput in
    it (bits/s). A last interval shorter than half the others is left out: a run whose duration
    is not a multiple of the interval ends with a sliver (20 us of an 8 s run sampled every
    266666 us), where one packet reads as hundreds of Mbit/s."""
    points = [
        ((a + b) / 2 / 1_000_000, rate)
        for (a, b), rate in zip(run.bounds, run.rates(series), strict=True)
    ]
    last = run.bounds[-1] if run.bounds else (0, 0)
    if len(points) > 1 and (last[1] - last[0]) * 2 < run.interval:
        points.pop()
    return [t for t, _ in points], [r for _, r in points]


def new_figure() -> Figure:
    """A figure for two stacked throughput plots (classes, flows), each legend on its right."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    # Constrained layout leaves room for the legends outside the axes, whatever their width.
    return Figure(figsize=(9, 6), dpi=100, layout="constrained")


def finish_axes(ax: Axes, title: str, run: Run, peak: float) -> None:
    """Title, labels, limits and legend of one throughput plot of ``run``.

    ``peak`` is the highest sample drawn (bits/s). The y axis starts at 0 and leaves headroom
    above the link rate and above ``peak``, so no sample touches the top; the legend sits
    outside the axes, on the right, where it can never hide a sample.
    """
    ax.set_title(f"{title}: throughput on {run.interface} ({format_rate(run.link)} link)")
    ax.set_ylabel("Mbit/s")
    ax.set_xlim(0, run.duration / 1_000_000)
    ax.set_ylim(0, max(run.link, peak) * HEADROOM / 1e6)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")


def save(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` as a PNG; the same figure gives the same bytes (no version, no date)."""
    fig.savefig(str(path), format="png", metadata={"Software": None})


def figure(run: Run) -> Figure:
    """Per-class (top) and per-flow (bottom) throughput over time."""
    fig = new_figure()
    for i, (title, group) in enumerate(
        (("classes", run.classes), ("flows", run.flow_series)), start=1
    ):
        ax = fig.add_subplot(2, 1, i)
        peak = 0.0
        for s in group:
            times, rates = samples(run, s)
            peak = max([peak, *rates])
            ax.plot(times, [r / 1e6 for r in rates], marker=".", label=s.name)
        finish_axes(ax, title, run, peak)
    fig.axes[-1].set_xlabel("time (s)")
    return fig


def plot(run: Run, path: str | Path) -> None:
    """Write a PNG of per-class and per-flow throughput over time to ``path``.

    The same run gives the same bytes: fixed size and dpi, Agg, and no metadata that changes
    (no software version, no timestamp).
    """
    save(figure(run), path)
