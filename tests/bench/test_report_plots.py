"""The data the report's plots draw (the series handed to matplotlib, not the PNG's pixels)."""

from __future__ import annotations

import math

from tandem.report.bench import _ladder_plots

from .test_compare_report_cli import result


def test_a_ladder_point_of_0_tok_s_is_drawn_at_0_and_one_without_a_figure_as_a_gap():
    import matplotlib

    matplotlib.use("Agg")  # as write_plots draws
    import matplotlib.pyplot as plt

    run = result(0.1, 0.01)
    c2 = run.points[0].model_copy(deep=True)
    c2.point.label, c2.point.concurrency = "c2", 2
    c4 = c2.model_copy(deep=True)
    c4.point.label, c4.point.concurrency = "c4", 4
    c2.metrics.output_throughput_tok_s = 0.0
    c4.metrics.output_throughput_tok_s = None
    run.points += [c2, c4]
    figure = _ladder_plots(run, plt)["throughput_vs_concurrency.png"]
    try:
        total = figure.axes[0].get_lines()[0]
        assert total.get_label() == "output tok/s (all streams)"
        assert list(total.get_xdata()) == [1, 2, 4]
        first, zero, gap = total.get_ydata()
        assert first == run.points[0].metrics.output_throughput_tok_s > 0
        assert zero == 0.0 and math.isnan(gap)
    finally:
        plt.close(figure)
