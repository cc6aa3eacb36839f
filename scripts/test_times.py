#!/usr/bin/env python3
"""Where the test command's time goes, from the JUnit XML files pytest wrote (scripts/test writes them to
.artifacts/test-times/): wall time per pytest run, seconds per test file and the slowest tests (with their CPU seconds,
the property cpu_s the rootdir's conftest.py records: pytest's own and that of the processes it waited for), as
Markdown tables for the README's tests section.

    python3 scripts/test_times.py [--top 15] [XML ...]     (default: .artifacts/test-times/*.xml)
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".artifacts" / "test-times"


def test_file(case: ET.Element) -> str:
    """classname is dotted (tests.unit.test_x.TestY); the file is the part up to the module."""
    parts = case.get("classname", "").split(".")
    while parts and not parts[-1].startswith("test_") and len(parts) > 1:
        parts.pop()
    return "/".join(parts) + ".py"


def cpu_seconds(case: ET.Element) -> float | None:
    for prop in case.iter("property"):
        if prop.get("name") == "cpu_s":
            return float(prop.get("value"))
    return None


def read(paths: list[Path]):
    runs, per_file, per_file_cpu, cases = [], defaultdict(float), defaultdict(float), []
    for path in paths:
        root = ET.parse(path).getroot()
        for suite in root.iter("testsuite"):
            runs.append((path.stem, float(suite.get("time", 0)), int(suite.get("tests", 0))))
            for case in suite.iter("testcase"):
                seconds = float(case.get("time", 0))
                name = f"{test_file(case)}::{case.get('name')}"
                cpu = cpu_seconds(case)
                per_file[test_file(case)] += seconds
                per_file_cpu[test_file(case)] += cpu or 0.0
                cases.append((seconds, name, cpu))
    return runs, per_file, per_file_cpu, sorted(cases, reverse=True)


def cpu_cell(cpu: float | None) -> str:
    return "" if cpu is None else f"{cpu:.0f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="*", type=Path)
    parser.add_argument("--top", type=int, default=15, help="how many files and tests to list (default 15)")
    args = parser.parse_args(argv)
    paths = args.xml or sorted(DEFAULT_DIR.glob("*.xml"))
    if not paths:
        print(f"test_times: no JUnit XML in {DEFAULT_DIR}; run scripts/test first", file=sys.stderr)
        return 2
    runs, per_file, per_file_cpu, cases = read(paths)
    print("| pytest run | tests | wall s |\n|---|---:|---:|")
    for name, seconds, count in runs:
        print(f"| {name} | {count} | {seconds:.0f} |")
    print("\n| test file | s (sum of its tests) | CPU s |\n|---|---:|---:|")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{name}` | {seconds:.0f} | {cpu_cell(per_file_cpu[name] or None)} |")
    print("\n| slowest tests | s | CPU s |\n|---|---:|---:|")
    for seconds, name, cpu in cases[: args.top]:
        print(f"| `{name}` | {seconds:.1f} | {cpu_cell(cpu)} |")
    by_cpu = sorted((c for c in cases if c[2] is not None), key=lambda c: -c[2])
    if by_cpu:
        print("\n| tests that used the most CPU | CPU s | s |\n|---|---:|---:|")
        for seconds, name, cpu in by_cpu[: args.top]:
            print(f"| `{name}` | {cpu:.0f} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
