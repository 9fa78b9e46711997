"""The benchmark's progress bar stays readable in a log (CI, a pipe) and live in a terminal."""

from __future__ import annotations

import io

from bench.progress import LOG_WIDTH, bar_options, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_thousands_of_updates_write_a_few_lines_and_the_final_count():
    log = io.StringIO()
    bar = progress_bar(5000, stream=log)
    for _ in range(5000):
        bar.update(1)
    bar.close()
    written = log.getvalue()
    redraws = written.count("\r")
    assert "5000/5000" in written
    assert redraws <= 4, written  # first draw, perhaps one timed redraw, the final one
    assert len(written) < 4 * (LOG_WIDTH + 2)


def test_in_a_terminal_the_bar_redraws_live_as_tqdm_likes():
    options = bar_options(Terminal())
    assert options["dynamic_ncols"] is True
    assert "mininterval" not in options and "ascii" not in options
