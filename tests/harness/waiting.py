"""Polling for a condition in tests that drive real processes (containers, torchrun jobs)."""
import time


def wait_for(pred, timeout=20, what="condition", interval=0.1):
    """pred()'s first truthy value within `timeout` seconds; else an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
