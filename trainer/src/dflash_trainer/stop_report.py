"""A stop that does not end shows where it waits: every thread's stack in the log, some seconds after SIGTERM.

SIGTERM only sets a flag; the loop finishes its step, checkpoints and exits. When that does not happen (a peer rank
that stopped answering holds a collective, a transfer waits for a message that never comes), torchrun SIGKILLs the
rank --shutdown-timeout seconds later and the log says nothing of where it waited. Python runs a signal's handler in
the main thread only, between bytecodes, so a main thread blocked inside torch never runs it; but Python's C-level
handler writes the signal number to the wakeup fd at once, whatever the main thread does: a thread here reads it.
Stdlib only (cli.py installs it before torch is imported).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time


# The wakeup fd's socketpair, open for the life of the process: Python's C-level handler writes to that fd number
# at every signal it catches, so closing it (as a thread's end would) could send those bytes into whatever file
# reuses the number. A later watch() replaces it; the old writer then closes and the old thread's recv ends.
_wakeup: tuple[socket.socket, socket.socket] | None = None


def watch(after_s: float) -> None:
    """Called from the main thread; `after_s` seconds after SIGTERM, if this process still runs, its threads'
    stacks go to stderr (the run's log). 0: never."""
    global _wakeup
    if after_s <= 0:
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # set_wakeup_fd needs it: a signal handler must never block on a full buffer
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _wakeup = (reader, writer)
    threading.Thread(target=_report_when_stalled, args=(reader, after_s), name="stop-report", daemon=True).start()


def _report_when_stalled(reader: socket.socket, after_s: float) -> None:
    while True:
        signals = reader.recv(64)  # one byte per signal caught; b"" once a later watch() closed the writer
        if not signals:
            return
        if signal.SIGTERM in signals:
            break
    time.sleep(after_s)
    print(f"dflash-train: pid {os.getpid()} is still stopping {after_s:g} s after SIGTERM; where each thread is "
          f"(DFLASH_STOP_REPORT_S sets when this is printed, 0 never):", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
