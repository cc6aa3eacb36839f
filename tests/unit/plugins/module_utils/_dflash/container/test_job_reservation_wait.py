"""A second restart's reserve waits for the restart holding the node (job_steps.wait_while_reserved): bounded by
lock_timeout, then refused with one line naming the holder; nothing to wait for returns at once."""
import json
import time

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import job_steps


class Refused(Exception):
    pass


def _req(root, lock_timeout):
    return {"runs_root": str(root), "job_token": "mine", "lock_timeout": lock_timeout}


def test_no_reservation_or_our_own_is_no_wait(tmp_path):
    assert job_steps.wait_while_reserved(_req(tmp_path, 5), Refused) is None
    (tmp_path / job_steps.RESERVATION).write_text(json.dumps({"token": "mine", "run": "j", "at": time.time()}))
    assert job_steps.wait_while_reserved(_req(tmp_path, 5), Refused) is None


def test_a_holder_that_never_gives_the_node_back_is_named_after_lock_timeout(tmp_path):
    # taken "later than now" (another clock): alive for the whole wait, so the wait's own bound ends it
    (tmp_path / job_steps.RESERVATION).write_text(json.dumps({"token": "other", "run": "j", "at": time.time() + 60}))
    with pytest.raises(Refused) as refused:
        job_steps.wait_while_reserved(_req(tmp_path, 0.3), Refused, poll_s=0.05)
    message = str(refused.value)
    assert "reserved by the restart of job j (token other" in message and "waited 0s for it" in message, message
    assert "\n" not in message
