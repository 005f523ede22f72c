"""A tiny progress bar for the command line, drawn only when the stream is a terminal.

Not tqdm: the library is imported into training processes and images, and a one-line counter
is all the CLI needs, so it is not worth a runtime dependency. When ``stream`` is not a TTY
(piped, redirected, captured by CI) nothing at all is written, so scripted output stays clean.

    >>> import io
    >>> with Progress(1000, "rows", stream=io.StringIO()) as bar:  # not a TTY: silent
    ...     bar.update(400)
    ...     bar.update(600)
    >>> bar.enabled, bar.done
    (False, 1000)

On a terminal it redraws one line (``\\r``), at most every ``min_interval`` seconds::

    writing shards [############............]  52%  104,000/200,000 rows  1.3M rows/s  ETA 0:01
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["Progress", "is_tty"]

WIDTH = 24


def is_tty(stream: IO[str] | None) -> bool:
    """``stream.isatty()``, False for None or streams without it (or closed ones)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


def _rate(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}"


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class Progress:
    """Count work done out of ``total`` (None: unknown) and draw it on ``stream`` if a TTY.

    Args:
        total: units of work expected, or None (then no bar and no ETA, just the count).
        desc: what is being done, printed first.
        unit: name of one unit of work (``"rows"``, ``"shards"``, ``"steps"``).
        stream: where to draw; default ``sys.stderr`` (so stdout stays parseable).
        enabled: force on/off; default: whether ``stream`` is a TTY.
        min_interval: seconds between redraws.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        unit: str = "rows",
        stream: IO[str] | None = None,
        enabled: bool | None = None,
        min_interval: float = 0.1,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = is_tty(self.stream) if enabled is None else enabled
        self.min_interval = min_interval
        self.done = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._width = 0  # length of the last line drawn, to blank it out
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Add ``n`` units of work done; redraws if enough time passed."""
        self.done += n
        if self.enabled:
            now = time.perf_counter()
            if now - self._last_draw >= self.min_interval:
                self._last_draw = now
                self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The current status line (without ``\\r``)."""
        elapsed = (time.perf_counter() if now is None else now) - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [self.desc]
        if self.total:
            frac = min(1.0, self.done / self.total)
            fill = int(frac * WIDTH)
            parts.append(f"[{'#' * fill}{'.' * (WIDTH - fill)}] {frac * 100:3.0f}%")
            parts.append(f"{self.done:,}/{self.total:,} {self.unit}")
        else:
            parts.append(f"{self.done:,} {self.unit}")
        if elapsed > 0.2 and rate > 0:
            parts.append(f"{_rate(rate)} {self.unit}/s")
            if self.total and self.done < self.total:
                parts.append(f"ETA {_clock((self.total - self.done) / rate)}")
        return "  ".join(parts)

    def _draw(self, now: float | None = None) -> None:
        text = self.line(now)
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.stream.write("\r" + text + pad)
            self.stream.flush()
        except (OSError, ValueError):  # terminal gone: stop drawing, never fail the work
            self.enabled = False

    def close(self) -> None:
        """Erase the bar (the caller prints its own summary line)."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self._width:
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> Progress:
        if self.enabled:
            self._draw()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
