"""PVE worker tasks: UPIDs and their status, each task run on a thread of the server.

UPID = `UPID:<node>:<pid %08X>:<pstart %08X>:<starttime %08X>:<type>:<id>:<user>:` (docs/proxmox.md). The pid and
pstart are the worker thread's own (its native thread id and its start time in clock ticks from
/proc/self/task/<tid>/stat), as PVE's are those of its forked worker.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


class TaskError(Exception):
    """A task's failure; its text becomes the task's exitstatus (one line)."""


@dataclass
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    status: str = "running"
    exitstatus: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def as_status(self) -> dict:
        d = {"upid": self.upid, "node": self.node, "pid": self.pid, "pstart": self.pstart,
             "starttime": self.starttime, "type": self.type, "id": self.id, "user": self.user,
             "status": self.status}
        if self.status == "stopped":
            d["exitstatus"] = self.exitstatus
        return d


def parse_upid(upid: str) -> dict | None:
    parts = upid.split(":")
    if len(parts) != 9 or parts[0] != "UPID" or parts[8] != "":
        return None
    try:
        return {"node": parts[1], "pid": int(parts[2], 16), "pstart": int(parts[3], 16),
                "starttime": int(parts[4], 16), "type": parts[5], "id": parts[6], "user": parts[7]}
    except ValueError:
        return None


def _pstart(tid: int) -> int:
    try:
        stat = open(f"/proc/self/task/{tid}/stat").read()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class Tasks:
    def __init__(self, node: str):
        self.node = node
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()

    def get(self, upid: str) -> Task | None:
        with self._lock:
            return self._tasks.get(upid)

    def run(self, type_: str, id_: str, user: str, work) -> Task:
        """Start `work()` on a thread; returns the task once its UPID is known (work may still be running)."""
        ready = threading.Event()
        box: dict = {}

        def worker():
            ready.wait()
            task = box["task"]
            try:
                work()
                task.exitstatus = "OK"
            except TaskError as e:
                task.exitstatus = " ".join(str(e).split()) or "unknown error"
            except Exception as e:  # noqa: BLE001 - a task reports every failure as its exitstatus
                task.exitstatus = " ".join(f"{type(e).__name__}: {e}".split())
            task.status = "stopped"
            task.done.set()

        t = threading.Thread(target=worker, name=f"task-{type_}-{id_}", daemon=True)
        t.start()
        while t.native_id is None:
            time.sleep(0.001)
        tid = t.native_id
        starttime = int(time.time())
        upid = f"UPID:{self.node}:{tid:08X}:{_pstart(tid):08X}:{starttime:08X}:{type_}:{id_}:{user}:"
        task = Task(upid, self.node, tid, _pstart(tid), starttime, type_, id_, user)
        with self._lock:
            self._tasks[upid] = task
        box["task"] = task
        ready.set()
        return task

    def wait_all(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            tasks = list(self._tasks.values())
        for t in tasks:
            t.done.wait(max(0.0, deadline - time.monotonic()))

