"""A target rank whose hidden-state send is blocked on a drafter that takes no more (it failed elsewhere) ends as
soon as the job's first error is in the store, instead of waiting until torchrun kills it: two real gloo
processes on the CPU, the drafter receiving nothing and then recording its error as dist_train's failure path
does."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import time

import pytest
import torch

ERROR_AFTER_S = 2.0


def _target(ports, results) -> None:
    import torch.distributed as dist
    from dflash_trainer.distributed.hs_transport import Item, Sender
    from dflash_trainer.distributed.world import job_error

    store = dist.TCPStore("127.0.0.1", ports.get(timeout=30), 2, False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=2)
    sender = Sender(None, "gloo", torch.device("cpu"), depth=1, job_error=lambda: job_error(store))
    t0, sent = time.monotonic(), 0
    try:
        while time.monotonic() - t0 < 20:
            ids = torch.zeros(2, 64, dtype=torch.int64)
            sender.send(1, Item(sent, 0, 0, ids, ids.bool(), torch.full((2,), 64), [torch.randn(2, 64, 4096)], None))
            sent += 1
        results.put(("not stopped", time.monotonic() - t0, sent))
    except RuntimeError as e:
        results.put((str(e), time.monotonic() - t0, sent))
    results.close()
    results.join_thread()  # put() hands the row to a feeder thread: let it reach the pipe before the exit below
    os._exit(0)  # the sender's thread is still inside a send no one receives


def _drafter(ports) -> None:
    import torch.distributed as dist
    from dflash_trainer.distributed.world import ERROR_KEY

    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)  # a free port, published before the target joins
    ports.put(store.port)
    dist.init_process_group("gloo", store=store, rank=1, world_size=2)
    time.sleep(ERROR_AFTER_S)  # posts no receive: a drafter whose own step broke
    store.set(ERROR_KEY, "rank 1: checkpoint step-6 could not be written")
    time.sleep(15)  # alive (its sockets open) until the target has answered
    os._exit(0)


@pytest.mark.timeout(60)
def test_a_send_blocked_on_a_failed_drafter_ends_with_the_jobs_error():
    ctx = multiprocessing.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    drafter = ctx.Process(target=_drafter, args=(ports,))
    target = ctx.Process(target=_target, args=(ports, results))
    drafter.start()
    target.start()
    try:
        message, elapsed, sent = results.get(timeout=40)
    finally:
        for p in (target, drafter):
            p.kill()
            p.join(10)
    assert message == ("sending hidden states stopped: the job failed "
                       "(rank 1: checkpoint step-6 could not be written)"), (message, elapsed, sent)
    # the sends did block (a few items went out, then none) and the stop came with the error, not before
    assert sent < 10 and ERROR_AFTER_S <= elapsed < ERROR_AFTER_S + 5, (elapsed, sent)
