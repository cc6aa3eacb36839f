"""Command lines of the benchmarks that take a --preset: the preset's flags go first, so that the command
line's own flags override them (argparse keeps the last value)."""

from __future__ import annotations

import sys


def parse_with_preset(build_parser, preset_argv, argv=None):
    """(args, preset name or None). `preset_argv(name)`: the flags that preset stands for."""
    argv = sys.argv[1:] if argv is None else list(argv)
    preset = build_parser().parse_known_args(argv)[0].preset
    return build_parser().parse_args(preset_argv(preset) + argv), preset
