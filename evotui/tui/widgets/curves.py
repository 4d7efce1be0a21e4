"""Live GRPO curves of one run (plotext), downsampled to the widget's width."""

from __future__ import annotations

from textual_plotext import PlotextPlot

METRICS = (
    ("reward", "reward"),
    ("reward_std", "reward std"),
    ("frac_reward_zero_std", "dead groups"),
    ("entropy", "entropy"),
    ("completions/mean_length", "completion length"),
    ("completions/clipped_ratio", "clipped ratio"),
    ("clip_ratio/region_mean", "clip ratio"),
    ("kl", "kl"),
)


def downsample(points: list[tuple[int, float]], width: int) -> list[tuple[float, float]]:
    """At most `width` points: consecutive steps averaged in equal buckets (a curve wider than the
    widget draws nothing more, only costs)."""
    if width <= 0 or len(points) <= width:
        return [(float(s), v) for s, v in points]
    size = len(points) / width
    out = []
    for i in range(width):
        bucket = points[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]
        out.append((sum(s for s, _ in bucket) / len(bucket), sum(v for _, v in bucket) / len(bucket)))
    return out


class Curves(PlotextPlot):
    """Holds the series of one run (all keys); draws the picked metric."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.series: dict[str, list[tuple[int, float]]] = {}
        self.metric_index = 0
        self.run_id: str | None = None

    @property
    def metric(self) -> str:
        return METRICS[self.metric_index][0]

    @property
    def last_step(self) -> int:
        return max((s[-1][0] for s in self.series.values() if s), default=0)

    def show_run(self, run_id: str | None, series: dict[str, list[tuple[int, float]]]) -> None:
        self.run_id = run_id
        self.series = {k: [tuple(p) for p in v] for k, v in series.items()}  # type: ignore[misc]
        self.replot()

    def extend(self, series: dict[str, list[tuple[int, float]]]) -> None:
        for key, points in series.items():
            known = self.series.setdefault(key, [])
            last = known[-1][0] if known else 0
            known.extend((int(s), float(v)) for s, v in points if s > last)
        self.replot()

    def cycle(self, step: int) -> None:
        self.metric_index = (self.metric_index + step) % len(METRICS)
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        label = dict(METRICS)[self.metric]
        points = downsample(self.series.get(self.metric, []), max(10, self.size.width - 10))
        if points:
            plt.plot([s for s, _ in points], [v for _, v in points], marker="braille")
            plt.title(f"{self.run_id}: {label} (step {int(points[-1][0])}, {points[-1][1]:.3f})")
        else:
            plt.title(f"{self.run_id or 'no run'}: no {label} yet")
        plt.xlabel("step")
        self.refresh()
