"""--draft-intermediate-size: the drafter's MLP width, its own capacity lever beside --num-draft-layers. A real
dflash-train run on the tiny target trains a wider drafter, whose checkpoint, export and reload keep the width and
decode losslessly; a resume with another width is refused, and so is a width under 1, naming the flag; the default
is the target's width, as before the flag."""

import json
import subprocess

import pytest
from safetensors.torch import load_file

from trainer_testlib import train_cmd
from dflash_trainer.cli import config_from_args
from dflash_trainer.eval.evaluate import main as eval_main
from dflash_trainer.export.exporter import export_checkpoint
from dflash_trainer.loop.checkpoint import find_latest
from dflash_trainer.loop.train import drafter_config_for

WIDE = 3 * 64  # the tiny target: hidden 64, MLP 128


def _config(tiny, tmp_path, *extra):
    argv = train_cmd(tiny, tmp_path / "out", *extra)[3:]  # (python -m dflash_trainer.cli)
    cfg = config_from_args(argv)
    cfg.mask_token_id = 511
    return drafter_config_for(cfg)


def test_the_default_width_is_the_targets_and_the_flag_sets_only_the_mlp(tiny, tmp_path):
    _, _, plain = _config(tiny, tmp_path)
    _, _, wide = _config(tiny, tmp_path, "--draft-intermediate-size", str(WIDE))
    assert plain.intermediate_size == 128 and wide.intermediate_size == WIDE
    assert {k: v for k, v in vars(wide).items() if k != "intermediate_size"} == \
        {k: v for k, v in vars(plain).items() if k != "intermediate_size"}


@pytest.mark.parametrize("value,words", [("0", "it must be at least 1"), ("-4", "it must be at least 1"),
                                         ("wide", "is not an integer; pass a whole number")])
def test_a_width_under_one_or_not_a_number_is_refused_naming_the_flag(tiny, tmp_path, value, words):
    # (the parsing dflash-train and its --check run; test_cli.py shows a refusal reaches stderr as one line)
    with pytest.raises(ValueError, match=f"--draft-intermediate-size.*{words}"):
        config_from_args(train_cmd(tiny, tmp_path / "out", "--draft-intermediate-size", value)[3:])


@pytest.mark.timeout(300)
def test_a_wider_drafter_trains_exports_reloads_and_decodes_losslessly(tiny, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(train_cmd(tiny, out, "--max-steps", "3", "--draft-intermediate-size", str(WIDE)),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"MLP {WIDE}," in result.stdout + result.stderr
    step = find_latest(str(out))
    assert json.load(open(f"{step}/drafter_config.json"))["intermediate_size"] == WIDE

    export = tmp_path / "export"
    export_checkpoint(step, tiny["target"], str(export), dtype="float32")
    assert json.load(open(export / "config.json"))["intermediate_size"] == WIDE  # what an engine builds the MLP from
    assert load_file(str(export / "model.safetensors"))["layers.0.mlp.up_proj.weight"].shape == (WIDE, 64)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in ([5, 17, 33, 2], list(range(60, 80)))))
    assert eval_main(["--target-model", tiny["target"], "--drafter", str(export), "--prompts", str(prompts),
                      "--max-new-tokens", "16", "--device", "cpu", "--out", str(tmp_path / "eval.json")]) == 0
    dflash = json.load(open(tmp_path / "eval.json"))["methods"]["dflash"]
    assert dflash["lossless"], dflash["mismatches"]
    assert dflash["num_steps"] < dflash["num_new_tokens"] or dflash["tau"] == 1.0

    # the run's checkpoint holds the wide MLP: resuming it at the target's width is refused, nothing overwritten
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    again = subprocess.run(train_cmd(tiny, out, "--max-steps", "4"), capture_output=True, text=True, timeout=240)
    assert again.returncode != 0
    assert "trained with a different drafter config" in again.stderr + again.stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before
