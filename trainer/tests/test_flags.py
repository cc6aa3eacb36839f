"""One vocabulary of flags: every dflash-train flag and default is declared once (a TrainConfig field), and every
parser that takes a trainer flag (dflash-train's, the proof driver's, the step benchmark's) gets it from there."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

import pytest

from trainer_testlib import load_benchmark
from dflash_trainer import cli
from dflash_trainer.config import (TrainConfig, changed_settings, declared_default, env_fields, flag_fields,
                                   option_name)

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "dflash_trainer")
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
PROOFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proofs")
TRAIN_FLAGS = {option_name(f): f for f in flag_fields()}


def trainer_flag_problems(parser: argparse.ArgumentParser) -> list[str]:
    """Every action of `parser` that names a trainer flag must come from cli.add_train_flags (and so hold no
    default of its own)."""
    problems = []
    for action in parser._actions:
        for opt in action.option_strings:
            if opt in TRAIN_FLAGS:
                if getattr(action, "train_field", None) != TRAIN_FLAGS[opt].name:
                    problems.append(f"{opt} declared by hand")
                elif action.default is not argparse.SUPPRESS:
                    problems.append(f"{opt} has an argparse default {action.default!r}")
    return problems


def _parsers():
    yield "dflash-train", cli.build_parser()
    yield "proof_smollm2", load_benchmark("proofs.proof_smollm2").build_parser()
    yield "train_step", load_benchmark("benchmarks.train_step").build_parser()
    yield "target_forward", load_benchmark("benchmarks.target_forward").build_parser()
    yield "seed_layout", load_benchmark("benchmarks.seed_layout").build_parser()


@pytest.mark.parametrize("name,parser", list(_parsers()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_trainer_flag_of_every_parser_comes_from_the_declaration(name, parser):
    assert trainer_flag_problems(parser) == []


def test_the_check_finds_a_default_declared_twice():
    parser = argparse.ArgumentParser()
    cli.add_train_flags(parser, only=("block_size",))
    parser.add_argument("--lr", type=float, default=1e-3)
    assert trainer_flag_problems(parser) == ["--lr declared by hand"]
    parser = argparse.ArgumentParser()
    cli.add_train_flags(parser, only=("gamma",))
    parser._actions[-1].default = 7.0
    assert trainer_flag_problems(parser) == ["--gamma has an argparse default 7.0"]


# The files that take dflash-train's flags. (dflash-eval, dflash-prepare-data, dflash-export, dflash-make-tiny and
# the evaluation worker are other commands, with flags of their own: e.g. prepare-data's --max-seq-len refuses
# longer rows where dflash-train's truncates.)
TAKERS = ([os.path.join(SRC, "cli.py")]
          + [os.path.join(PROOFS, n) for n in ("proof_smollm2.py", "proof_toy_cpu.py", "proof_report.py")]
          + [os.path.join(BENCHMARKS, n) for n in ("train_step.py", "target_forward.py", "seed_layout.py")])


def test_no_taker_declares_a_trainer_flag_by_hand():
    """No add_argument("--<trainer flag>" ...) in a file that takes dflash-train's flags: only add_train_flags."""
    found = []
    for path in TAKERS:
        for flag in re.findall(r"add_argument\(\s*[\"'](--[a-z0-9-]+)", open(path).read()):
            if flag in TRAIN_FLAGS:
                found.append(f"{os.path.basename(path)}: {flag}")
    assert found == []
    assert "default=" not in open(TAKERS[0]).read()  # cli.py: argparse holds no default at all


def test_old_proof_flag_names_are_gone():
    """The proof's own vocabulary (before it drove dflash-train) is not used by any benchmark or script."""
    old = ("--soft-labels", "--layers", "--taps", "--minutes", "--train-devices", "--warmup-batches", "--log-every",
           "--eager-layers", "--head-chunk ", "--anchors", "--block ", "--labels")
    for folder in (BENCHMARKS, PROOFS):
        for name in sorted(os.listdir(folder)):
            if name.endswith((".py", ".sh")):
                text = open(os.path.join(folder, name)).read()
                used = [flag for flag in old if re.search(re.escape(flag) + r"(?![a-z-])", text)]
                assert used == [], name


def test_generated_parser_defaults_are_the_declarations():
    cfg = cli.config_from_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o"])
    for f in dataclasses.fields(TrainConfig):
        if f.name == "run_dir":
            assert cfg.run_dir == "o"
        elif f.name not in ("target_model", "data_dir", "output_dir") and not f.metadata.get("env"):
            assert getattr(cfg, f.name) == declared_default(f), f.name
    helps = {a.dest: a.help for a in cli.build_parser()._actions}
    assert helps["token_budget"].endswith("(default: 49152)") and helps["warmup_ratio"].endswith("(default: 0.04)")
    assert helps["target_gpus"].endswith("(default: '')") and "default" not in helps["use_soft_labels"]
    epilog = cli.build_parser().epilog
    for f in env_fields():
        assert option_name(f) in epilog


def test_given_flags_are_handed_on_unchanged():
    """A driver's parser (the generated flags beside its own) hands exactly the given flags to dflash-train."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    cli.add_train_flags(parser, skip=("data_dir", "output_dir"), required=False)
    argv = ["--out", "x", "--block-size", "16", "--use-soft-labels", "--target-gpus=", "--snapshot-minutes", "2,5",
            "--target-layer-ids", "1,3", "--lr=1e-3"]
    given = cli.given_train_argv(parser.parse_args(argv))
    assert given == ["--target-gpus=", "--lr=1e-3", "--snapshot-minutes=2,5", "--block-size=16",
                     "--use-soft-labels", "--target-layer-ids=1,3"]
    cfg = cli.config_from_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *given])
    assert (cfg.block_size, cfg.use_soft_labels, cfg.target_gpus, cfg.snapshot_minutes, cfg.target_layer_ids,
            cfg.num_target_taps, cfg.lr) == (16, True, [], [2.0, 5.0], [1, 3], 2, 1e-3)


@pytest.mark.parametrize("argv,needle", [
    (["--snapshot-minutes", "5,2"], "--snapshot-minutes 5,2 must be positive and increasing"),
    (["--time-budget-min", "0"], "--time-budget-min is 0.0; it must be > 0"),
    (["--time-budget-min", "1", "--snapshot-minutes", "2"], "--snapshot-minutes 2 is past --time-budget-min 1"),
    (["--compile-warmup-batches", "-1"], "--compile-warmup-batches is -1; it must be at least 0"),
    (["--epochs", "x"], "--epochs 'x' is not an integer"),
])
def test_new_flags_are_checked_where_declared(argv, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        cli.config_from_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *argv])


def test_readme_states_the_declared_defaults():
    """trainer/README.md lists the main flags with their defaults: each must be the declared one."""
    text = open(README).read()
    section = text[text.index("## CLI"):text.index("## The run contract")]
    # `--flag value` outside [optional examples]; a list value (2,5) is an example, not a default
    pairs = re.findall(r"(?<!\[)(--[a-z0-9-]+) ([0-9][0-9.e-]*|uniform|auto)(?![0-9a-z,])", section)
    assert len(pairs) >= 20
    for flag, value in pairs:
        default = declared_default(TRAIN_FLAGS[flag])
        assert type(default)(value) == default, flag


def test_train_settings_are_the_given_values_over_the_declared_defaults():
    """A benchmark's trainer settings: parsed values where given, the one declared default elsewhere, nothing else."""
    p = argparse.ArgumentParser()
    cli.add_train_flags(p, only=("lr", "block_size", "seed"))
    settings = cli.train_settings(p.parse_args(["--lr", "2e-3"]), ("lr", "block_size"))
    assert settings == {"lr": 2e-3, "block_size": declared_default(TrainConfig.__dataclass_fields__["block_size"])}


def test_changed_settings_name_what_a_restart_changed_in_training_only():
    """A resumed run's log names the training settings that differ from the checkpoint's run (what moves its
    learning rate or its loss), not paths or logging, and not settings an older checkpoint did not record."""
    base = ["--target-model", "t", "--data-dir", "d", "--output-dir", "o"]
    saved = cli.config_from_args(base + ["--lr-schedule", "cosine", "--gamma", "7", "--snapshot-minutes", "5"])
    now = cli.config_from_args(base + ["--lr-schedule", "wsd", "--gamma", "3", "--snapshot-minutes", "5,10",
                                       "--use-soft-labels", "--log-interval", "1", "--output-dir", "elsewhere"])
    record = saved.to_dict()
    assert changed_settings(record, now) == ["--lr-schedule cosine -> wsd", "--snapshot-minutes 5 -> 5,10",
                                             "--gamma 7 -> 3", "--use-soft-labels off -> on"]
    assert changed_settings(record, saved) == []
    del record["gamma"]  # a checkpoint of a trainer that had no such flag yet
    assert "--gamma 7 -> 3" not in changed_settings(record, now)
