"""scripts/setup on a prepared checkout (issue 30): no traceback, one closing line with the versions. The version
line no longer pipes `ansible --version` into `head`, whose early close made ansible print a BrokenPipeError."""
import os
import re
import subprocess

from ansible_helpers import ROOT


def test_setup_prints_no_traceback_and_says_the_venv_is_ready():
    proc = subprocess.run([os.path.join(ROOT, "scripts", "setup")], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out and "Error" not in out, out
    assert re.fullmatch(r"setup: \.venv ready \(Python 3\.11\.\d+, ansible-core 2\.19\.\d+\)",
                        proc.stdout.strip().splitlines()[-1]), out
