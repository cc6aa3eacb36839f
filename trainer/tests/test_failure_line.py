"""The error line of an unexplained failure (failures.failure_line): a failure raised inside torch.compile says so
and names the switch that keeps that part eager; any other failure keeps its plain `Type: text` line."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dflash_trainer.failures import failure_line

# A real torch.compile failure on the CPU: inductor needs a C++ compiler to build its kernels, and CXX names one
# that does not exist (what a container without a toolchain gives).
COMPILE_WITHOUT_A_COMPILER = textwrap.dedent("""
    import torch
    from dflash_trainer.failures import failure_line

    @torch.compile
    def f(x):
        return (x.sin() + 1).sum()

    try:
        f(torch.randn(8))
    except Exception as e:
        print(failure_line(e))
    else:
        print("compiled")
""")


@pytest.mark.parametrize("mix_order_reduction", [None, "0"])
def test_a_failure_inside_torch_compile_names_the_eager_switches(tmp_path, mix_order_reduction):
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TORCHINDUCTOR_MIX_ORDER_REDUCTION", None)
    if mix_order_reduction is not None:
        env["TORCHINDUCTOR_MIX_ORDER_REDUCTION"] = mix_order_reduction
    out = subprocess.run([sys.executable, "-c", COMPILE_WITHOUT_A_COMPILER], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line
    assert line.startswith("InductorError: ") and "No working C++ compiler" in line, line
    assert "raised inside torch.compile" in line
    assert "DFLASH_EAGER_LAYERS=1" in line and "DFLASH_EAGER_HEAD_LOSS=1" in line
    # the switch that keeps the layers compiled comes first, unless the run already has it
    if mix_order_reduction is None:
        assert "rerun with TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 " in line and "else with DFLASH_EAGER_LAYERS=1" in line
    else:
        assert "MIX_ORDER" not in line and "rerun with DFLASH_EAGER_LAYERS=1" in line


def test_an_eager_failure_keeps_its_plain_line():
    try:
        torch.arange(8).view(3, 3)
    except RuntimeError as e:
        line = failure_line(e)
    assert line == "RuntimeError: shape '[3, 3]' is invalid for input of size 8"


def test_a_multi_line_message_becomes_one_line():
    try:
        raise ValueError("first\n  second")
    except ValueError as e:
        assert failure_line(e) == "ValueError: first second"
