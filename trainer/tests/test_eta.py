"""loop/eta.py: step of total, the share done and the ETA by the steps or the time budget, whichever ends the run
first, at this process's own pace (a clock given here, so the figures are exact)."""

from dflash_trainer.loop.eta import Eta, format_eta


def ticking(seconds_per_reading):
    now = [0.0]

    def clock():
        now[0] += seconds_per_reading
        return now[0]
    return clock


def test_the_eta_by_steps_is_the_steps_left_at_this_process_pace():
    eta = Eta(total_steps=20, budget_s=None, clock=ticking(2.0))
    first = eta.update(10, train_s=300.0)  # resumed at step 9: no pace of its own yet
    assert first == {"total_steps": 20, "done_pct": 50.0, "eta_s": None, "ends_by": "steps"}
    eta.update(11, train_s=302.0)
    assert eta.update(12, train_s=304.0) == {"total_steps": 20, "done_pct": 60.0, "eta_s": 16.0, "ends_by": "steps"}
    assert eta.log_words() == "/20 (60.0%) eta 16s by steps"
    for step in range(13, 21):
        last = eta.update(step, train_s=0.0)
    assert last["eta_s"] == 0.0 and last["done_pct"] == 100.0


def test_the_time_budget_ends_the_run_when_it_comes_first():
    eta = Eta(total_steps=1000, budget_s=100.0, clock=ticking(1.0))
    assert eta.update(1, train_s=1.0)["ends_by"] == "time budget"  # no pace yet: the budget is what is known
    f = eta.update(2, train_s=90.0)  # 998 steps at 1 s would take longer than the 10 s of budget left
    assert f == {"total_steps": 1000, "done_pct": 90.0, "eta_s": 10.0, "ends_by": "time budget"}
    short = Eta(total_steps=4, budget_s=100.0, clock=ticking(1.0))
    short.update(1, train_s=1.0)
    assert short.update(2, train_s=2.0) == {"total_steps": 4, "done_pct": 50.0, "eta_s": 2.0, "ends_by": "steps"}


def test_format_eta():
    assert [format_eta(s) for s in (None, 0, 12.4, 245, 3720)] == ["?", "0s", "12s", "4m05s", "1h02m"]
