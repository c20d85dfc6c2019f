"""How a view reaches the screen: fitted to a terminal, at its full width into a pipe or file.

Into a pipe or a file rich assumes 80 columns and squeezes a wide table to fit, cutting its
headers to "TT…" and its figures to "57…": the captured output of `tandem bench` in a CI log or
a device run's `tee` could not be read. There the view is printed as wide as it needs to be,
up to ``PIPE_MAX_WIDTH`` (a log is read with a pager or grep, which do not wrap it).
"""

from __future__ import annotations

from rich.console import Console, RenderableType

from tandem import screen

PIPE_MAX_WIDTH = 400
"""Widest a view is printed when the output is not a terminal (columns)."""


def show(renderable: RenderableType, console: Console | None = None) -> None:
    """Print ``renderable`` on ``console`` (stdout by default), at full width off a terminal."""
    console = console or screen.console()
    if console.is_terminal:
        console.print(renderable)
        return
    natural = console.measure(renderable, options=console.options.update_width(PIPE_MAX_WIDTH))
    screen.like(console, width=max(console.width, natural.maximum)).print(renderable)
