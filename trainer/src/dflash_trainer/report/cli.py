"""dflash-report RUN_DIR [--out FILE]: the run's pictures as one self-contained HTML page (report/page.py).

Needs matplotlib (the optional extra dflash_trainer[report]); refuses in one line when it is missing or the run
directory has nothing to draw, before writing anything. The page is written to a temporary file and renamed, so a
reader (or training_status.yml fetching it) never sees half a page."""

from __future__ import annotations

import argparse
import os
import sys

from dflash_trainer.telemetry.heartbeat import write_text_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dflash-report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the run directory (the trainer's --run-dir, by default its --output-dir)")
    p.add_argument("--out", default=None, help="the HTML file to write (default: RUN_DIR/report.html)")
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("dflash-report: matplotlib is not installed; pip install 'dflash_trainer[report]'", file=sys.stderr)
        return 2
    from dflash_trainer.report.page import render
    from dflash_trainer.report.run_files import RunFiles
    try:
        run = RunFiles.read(args.run_dir)
    except ValueError as e:
        print(f"dflash-report: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.run_dir, "report.html")
    write_text_atomic(out, render(run))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
