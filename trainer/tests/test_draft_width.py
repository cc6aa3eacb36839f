"""--draft-intermediate-size: the drafter's MLP width, its own capacity lever beside --num-draft-layers. A real
dflash-train run on the tiny target trains a wider drafter, whose checkpoint, export and reload keep the width and
decode losslessly; a resume with another width, or a width under 1, is refused in one line; the default is the
target's width, as before the flag."""

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


@pytest.mark.parametrize("value", ["0", "-4", "wide"])
def test_a_width_under_one_or_not_a_number_is_refused_in_one_line(tiny, tmp_path, value):
    result = subprocess.run(train_cmd(tiny, tmp_path / "out", "--draft-intermediate-size", value),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "--draft-intermediate-size" in lines[0], result.stderr[-2000:]
    assert not (tmp_path / "out" / "checkpoints").exists()  # (the heartbeat says "refused" to the launcher)


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
