"""Live progress from ansible-runner's events: each task as it starts, each host's result, the role's summary."""
import json
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
            for diff in ([res["diff"]] if isinstance(res.get("diff"), dict) else res.get("diff") or []):
                self._diff(diff)
            if data.get("task_action") in ("debug", "ansible.builtin.debug") and isinstance(res.get("msg"), str):
                for line in res["msg"].splitlines():
                    self._print("      " + line)
        else:
            self.failure = data
            self._print("    %s: %s: %s" % ("FAILED" if kind == "runner_on_failed" else "UNREACHABLE", host,
                                           res.get("msg", "")))

    def _diff(self, diff):
        """--diff (a preview): each key whose value would change, before -> after."""
        before, after = diff.get("before"), diff.get("after")
        if not isinstance(before, dict) or not isinstance(after, dict):
            return
        changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
        self._print("      diff %s: %s" % (diff.get("after_header") or "", "no change" if not changed else ""))
        for key in changed:
            self._print("        %s: %s -> %s" % (key, json.dumps(before.get(key)), json.dumps(after.get(key))))
