"""Live progress from ansible-runner's events: each task as it starts, each host's result, the role's summary."""
import sys


class Progress(object):
    """An ansible-runner event_handler that prints as the job runs and remembers the last failure."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.failure = None  # event_data of the last failed or unreachable task result

    def _print(self, line):
        self.out.write(line + "\n")
        self.out.flush()

    def __call__(self, event):
        kind, data = event.get("event"), event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self._print("PLAY %s" % data.get("play", ""))
        elif kind == "playbook_on_task_start":
            self._print("  TASK %s" % data.get("task", ""))
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            self._result(kind, data)
        elif kind == "playbook_on_stats":
            bad = sorted(set(data.get("failures") or {}) | set(data.get("dark") or {}))
            self._print("RECAP %s" % ("failed on " + ", ".join(bad) if bad else "ok"))
        return True  # keep every event in the artifacts

    def _result(self, kind, data):
        res, host = data.get("res") or {}, data.get("host", "?")
        if kind == "runner_on_skipped":
            self._print("    skipped: %s" % host)
        elif kind == "runner_on_ok":
            self._print("    %s: %s" % ("changed" if res.get("changed") else "ok", host))
            if data.get("task_action") in ("debug", "ansible.builtin.debug") and isinstance(res.get("msg"), str):
                for line in res["msg"].splitlines():
                    self._print("      " + line)
        else:
            self.failure = data
            self._print("    %s: %s: %s" % ("FAILED" if kind == "runner_on_failed" else "UNREACHABLE", host,
                                           res.get("msg", "")))
