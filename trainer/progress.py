"""How a training run talks to its user: a live progress bar on a terminal, plain lines everywhere else.

Messages (`say`) are always whole lines, so logs and CI output read the same as before. On a terminal the per-step
progress (step, reward, zero-variance groups, step time, ETA, spend) is one live bar that rich redraws in place,
with messages printed above it; piped or redirected, each step is one plain line, as `grep` and log files want.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO


class Console:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.live = not quiet and (bool(isatty and isatty()) if live is None else live)
        self._progress: Any = None
        self._task: Any = None

    def say(self, line: str) -> None:
        """One message line (above the live bar when there is one)."""
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)

    def step(self, done: int, total: int, line: str) -> None:
        """Progress after a training step: `line` is the plain-text form ("[SFT ]step 3/10  reward ... ETA 12s")."""
        if self.quiet:
            return
        if not self.live:
            print(line, file=self.stream, flush=True)
            return
        # The bar and "done/total" show the step; the line's other fields follow them.
        match = re.match(r"^(?:(\w+) )?step \d+/\d+  ", line)
        label = f"{match.group(1)} warm-up" if match and match.group(1) else "training"
        metrics = line[match.end() :] if match else line
        if self._progress is None:
            self._start(total, label)
        self._progress.update(
            self._task, completed=done, total=total, description=label, metrics=metrics, refresh=True
        )

    def _start(self, total: int, label: str) -> None:
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
        from rich.table import Column

        console = RichConsole(file=self.stream, force_terminal=True)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=9)),
            # On a narrow terminal the metrics wrap onto the next line rather than being cut off.
            TextColumn("{task.fields[metrics]}", table_column=Column(overflow="fold")),
            console=console,
            # Redraw only when a step ends: the numbers change then, and a 2-core machine has no cycles to spare.
            auto_refresh=False,
        )
        self._task = self._progress.add_task(label, total=total, metrics="")
        self._progress.start()

    def close(self) -> None:
        """Leave the bar's last state on screen and go back to plain lines."""
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()
            self._progress = None
