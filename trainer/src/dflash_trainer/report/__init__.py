"""dflash-report: a run's pictures (report/cli.py)."""
