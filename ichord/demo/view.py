"""How the demo shows it: one plain line per transition in a pipe, a table redrawn in place on a terminal."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, TextIO

from ichord.api.names import ReadyReason

if TYPE_CHECKING:
    from ichord.demo.observe import Row


class View:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.rows: list[Row] = []

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:6.2f}s]"

    def say(self, text: str) -> None:
        self.write(text + "\n")

    def write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): finish silently; stdout now points at /dev/null so that
            # the interpreter's own flush at exit does not fail either.
            self.out = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
            os.dup2(self.out.fileno(), sys.stdout.fileno())

    def transition(self, row: Row) -> None: ...

    def applied(self, row: Row) -> None: ...

    def refresh(self) -> None: ...

    def freeze(self) -> None: ...

    def close(self) -> None: ...


class Lines(View):
    """Without a terminal: one line per transition, nothing redrawn."""

    def transition(self, row: Row) -> None:
        extra = f"  rebootPaths: {', '.join(row.reboot_paths)}" if row.reason == ReadyReason.REBOOT_REQUIRED else ""
        self.say(f"{self.stamp()}   {row.name:<16} {row.role:<13} Ready={row.ready:<7} {row.reason}{extra}")

    def applied(self, row: Row) -> None:
        config, mode = row.applies[-1]
        stage = f" ({row.stage})" if row.stage else ""
        self.say(f"{self.stamp()}   {row.name:<16} {row.role:<13} apply #{len(row.applies)} {mode}, "
                 f"config {config[:12]}{stage}")


_COLOURS = {"True": "\x1b[32m", "False": "\x1b[31m", "Unknown": "\x1b[33m"}


class LiveTable(View):
    """With a terminal: step lines scroll, the machines' table below them is redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        self._drawn = 0
        self._dirty = False
        self._live = True  # False once frozen: the table stays where it is, lines follow below it
        self.write("\x1b[?25l")  # hide the cursor while redrawing

    def say(self, text: str) -> None:
        self._erase()
        super().say(text)
        self._draw()

    def transition(self, row: Row) -> None:
        self._dirty = True

    def applied(self, row: Row) -> None:
        self._dirty = True

    def refresh(self) -> None:
        if self._dirty and self._live:
            self._erase()
            self._draw()

    def freeze(self) -> None:
        self.refresh()
        self._live, self._drawn = False, 0

    def close(self) -> None:
        self.freeze()
        self.write("\x1b[?25h")

    def _erase(self) -> None:
        if self._drawn:
            self.write(f"\x1b[{self._drawn}A\x1b[J")
            self._drawn = 0

    def _draw(self) -> None:
        if not self.rows or not self._live:
            return
        width = max(len(r.name) for r in self.rows)
        cells = [("MACHINE".ljust(width), "ROLE        ", "READY  ", "REASON          ", "APPLIES", "RUNNING")]
        cells += [(r.name.ljust(width), r.role.ljust(12), r.ready.ljust(7), r.reason.ljust(16),
                   str(len(r.applies)).ljust(7), r.running[:12]) for r in self.rows]
        # A wrapped line would break the erase count: never write past the terminal's width.
        columns = shutil.get_terminal_size().columns - 1
        lines = []
        for name, role, ready, reason, applies, running in cells:
            plain = f"  {name} {role} {ready} {reason} {applies} {running}"[:columns]
            colour = _COLOURS.get(ready.strip())
            lines.append(plain.replace(f" {ready} ", f" {colour}{ready}\x1b[0m ", 1) if colour else plain)
        self.write("".join(line + "\n" for line in lines))
        self._drawn, self._dirty = len(lines), False
