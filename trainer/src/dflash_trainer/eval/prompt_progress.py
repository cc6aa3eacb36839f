"""Progress of an evaluation, prompt by prompt: a bar redrawn in place on a terminal, else a line every
`every_s` seconds and at the end (a log file, the proof's log), each with prompts done of total and an ETA at the
pace so far. dflash-eval and the proof's evaluation (proofs/proof_eval.py) report through it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator

BAR = 24


class PromptProgress:
    """`say`: where lines go (default: stderr, a bar when it is a terminal); `every_s`: seconds between lines."""

    def __init__(self, say: Callable[[str], None] | None = None, every_s: float = 10.0, stream=None):
        self.stream = stream or sys.stderr
        self.tty = say is None and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.say = say or (lambda line: print(line, file=self.stream, flush=True))
        self.every_s = every_s

    def each(self, label: str, items: list) -> Iterator:
        """The items of `items`, reporting after each one."""
        total, t0, last = len(items), time.monotonic(), float("-inf")
        for i, item in enumerate(items, 1):
            yield item
            now = time.monotonic()
            if self.tty:
                self._bar(label, i, total, now - t0)
            elif i == total or now - last >= self.every_s:
                last = now
                self.say(self.line(label, i, total, now - t0))

    @staticmethod
    def line(label: str, done: int, total: int, elapsed: float) -> str:
        eta = elapsed / done * (total - done)
        return f"{label}: prompt {done}/{total} ({100 * done / total:.0f}%), {elapsed:.1f} s, ETA {eta:.0f} s"

    def _bar(self, label: str, done: int, total: int, elapsed: float) -> None:
        fill = BAR * done // total
        end = "\n" if done == total else ""
        self.stream.write(f"\r[{'#' * fill}{'.' * (BAR - fill)}] {self.line(label, done, total, elapsed)}{end}")
        self.stream.flush()


def each(progress: PromptProgress | None, label: str, items: list) -> Iterable:
    """`items` reported through `progress`, or as they are when there is none."""
    return items if progress is None else progress.each(label, items)
