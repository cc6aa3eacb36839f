"""--init-layers-from-target (model/from_target.py, loop/starting_weights.py): a new run's drafter layers start as
the target's evenly spaced layers, in one process and on a torchrun drafter rank alike; the seed family's norms are
converted to the drafter's convention; refusals come in one line before anything is written.

Real tiny targets saved by transformers (Qwen3, and the seed's Qwen3.5 family), real dflash-train runs."""

import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer_testlib import start, torchrun_cmd, train_cmd
from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
from dflash_trainer.model.drafter import DrafterConfig, RMSNorm
from dflash_trainer.config import spaced_layer_ids
from dflash_trainer.model.from_target import (_target_modules, layers_from_target, norm_convention,
                                              plan_layers_from_target)
from dflash_trainer.prep.make_tiny import write_target

# an Adam step moves each weight by about lr: 1e-9 leaves the starting weights readable in the step-1 checkpoint
STILL = ("--max-steps", "1", "--lr", "1e-9", "--num-draft-layers", "3")


def _target_tensors(target_dir):
    return {k: v for name in os.listdir(target_dir) if name.endswith(".safetensors")
            for k, v in load_file(os.path.join(target_dir, name)).items()}


def _checkpoint(out):
    return load_checkpoint(find_latest(str(out)))[0]


def _assert_started_from_the_target(target_dir, weights):
    target = _target_tensors(target_dir)
    for j, i in enumerate(spaced_layer_ids(8, 3)):  # the tiny target's 8 layers: 0, 4, 7
        for name in ("self_attn.q_proj.weight", "self_attn.k_norm.weight", "mlp.down_proj.weight",
                     "input_layernorm.weight"):
            torch.testing.assert_close(weights[f"layers.{j}.{name}"], target[f"model.layers.{i}.{name}"],
                                       atol=1e-6, rtol=0)
    torch.testing.assert_close(weights["norm.weight"], target["model.norm.weight"], atol=1e-6, rtol=0)


def test_spaced_layers_take_the_first_and_the_last():
    assert spaced_layer_ids(30, 5) == [0, 7, 14, 22, 29]  # SmolLM2-135M under the proof's 5-layer drafter
    assert spaced_layer_ids(64, 5) == [0, 16, 32, 47, 63]
    assert spaced_layer_ids(8, 1) == [7]
    with pytest.raises(ValueError, match="more than the target's 8"):
        spaced_layer_ids(8, 9)


@pytest.mark.timeout(300)
def test_a_run_starts_from_the_targets_layers_and_keeps_the_seeded_rest(tiny, tmp_path):
    logs = {}
    for name, extra in (("copied", ("--init-layers-from-target",)), ("random", ())):
        result = subprocess.run(train_cmd(tiny, tmp_path / name, *STILL, *extra), capture_output=True, text=True,
                                timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        logs[name] = result.stdout + result.stderr
    assert ("drafter layers from target layers [0, 4, 7]: 33 of their 33 tensors copied, and the final norm; "
            "the rest (fc, hidden_norm) random") in logs["copied"]
    assert "drafter layers from target" not in logs["random"]
    copied, random = _checkpoint(tmp_path / "copied"), _checkpoint(tmp_path / "random")
    _assert_started_from_the_target(tiny["target"], copied)
    # what has no counterpart in the target keeps the same seeded random start as a run without the flag
    for name in ("fc.weight", "hidden_norm.weight"):
        torch.testing.assert_close(copied[name], random[name], atol=1e-6, rtol=0)
    assert not torch.allclose(copied["layers.0.self_attn.q_proj.weight"], random["layers.0.self_attn.q_proj.weight"])


@pytest.mark.timeout(300)
def test_a_torchrun_drafter_rank_starts_from_the_targets_layers_too(tiny, tmp_path):
    out = tmp_path / "out"
    proc = start(torchrun_cmd(tiny, out, 2, 1, *STILL, "--init-layers-from-target"), tmp_path / "log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "log").read_text()[-3000:]
    assert "drafter layers from target layers [0, 4, 7]" in (tmp_path / "log").read_text()
    _assert_started_from_the_target(tiny["target"], _checkpoint(out))


def test_the_seed_familys_norms_are_converted_and_its_gated_query_is_left_alone(tmp_path):
    target_dir = str(tmp_path / "qwen3_5")
    write_target(target_dir, seed=0, family="qwen3_5")  # layers 3 and 7 full attention, the rest Gated DeltaNet
    path = os.path.join(target_dir, "model.safetensors")
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(0)
    for key in [k for k in tensors if k.endswith("norm.weight")]:  # the saved norms are zeros: give them values
        tensors[key] = torch.randn(tensors[key].shape, generator=generator) * 0.3
    save_file(tensors, path, metadata={"format": "pt"})
    from transformers import AutoConfig
    drafter_cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(target_dir), 3, [1, 3, 5], 4, 511)
    state, words = layers_from_target(target_dir, drafter_cfg)

    layers, _final = _target_modules(target_dir)
    assert norm_convention(layers[0].input_layernorm) == "offset"
    prefix = "model.language_model.layers"
    w = tensors[f"{prefix}.4.post_attention_layernorm.weight"]
    torch.testing.assert_close(state["layers.1.post_attention_layernorm.weight"], 1 + w)
    # the drafter's norm with the converted weight computes what the target's norm computes
    target_norm = layers[4].post_attention_layernorm.to_empty(device="cpu").float()
    with torch.no_grad():
        target_norm.weight.copy_(w)
        mine = RMSNorm(w.numel(), drafter_cfg.rms_norm_eps)
        mine.weight.copy_(state["layers.1.post_attention_layernorm.weight"])
        x = torch.randn(3, w.numel(), generator=generator)
        torch.testing.assert_close(mine(x), target_norm(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state["layers.2.mlp.up_proj.weight"], tensors[f"{prefix}.7.mlp.up_proj.weight"])
    # layer 7 is full attention with a gated query twice the drafter's: k, v, o copied, q left random
    assert "layers.2.self_attn.k_proj.weight" in state and "layers.2.self_attn.q_proj.weight" not in state
    # layers 0 and 4 are Gated DeltaNet: no attention tensor to copy
    assert not any(k.startswith(("layers.0.self_attn.", "layers.1.self_attn.")) for k in state)
    assert "20 of their 33 tensors copied, and the final norm; the rest (fc, hidden_norm, 13 in the layers)" in words


def test_refusals_come_in_one_line_before_anything_is_written(tiny, tmp_path):
    cases = ((("--init-layers-from-target", "--init-drafter", str(tmp_path)),
              "--init-drafter and --init-layers-from-target both choose the starting weights"),
             (("--init-layers-from-target", "--num-draft-layers", "9"), "the drafter's 9 layers are more than"))
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        result = subprocess.run(train_cmd(tiny, out, *extra), capture_output=True, text=True, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
        assert not os.path.exists(out / "checkpoints")


def check_here(capsys, argv):
    """dflash-train --check of train_cmd's argv in this process: (exit status, stderr lines). test_preflight.py runs
    it as the collection does, a process of its own; here it saves a process start (~4 s of imports) a check."""
    from dflash_trainer import cli
    capsys.readouterr()
    rc = cli.main([cli.CHECK_FLAG] + argv[3:])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_the_check_before_a_restart_refuses_what_the_start_would(tiny, tmp_path, capsys):
    """dflash-train --check (run by the collection before it stops a live run) refuses a bad --init-drafter or
    --init-layers-from-target in the line the start would print; a good one is ok."""
    def check(*extra):
        return check_here(capsys, train_cmd(tiny, tmp_path / "out", *extra))

    assert check("--init-layers-from-target", "--num-draft-layers", "3") == (0, [])
    rc, err = check("--init-layers-from-target", "--num-draft-layers", "9")
    assert rc == 2 and err == ["dflash-train: error: --init-layers-from-target: the drafter's 9 layers are more than "
                               "the target's 8; lower --num-draft-layers or drop the flag"]
    rc, err = check("--init-drafter", str(tmp_path / "typo"))
    assert rc == 2 and err == [f"dflash-train: error: --init-drafter {tmp_path / 'typo'} is neither an export dir "
                               "(config.json + model.safetensors) nor a checkpoints/step-N dir; pass one of those"]
    first = tmp_path / "first"  # a checkpoint of another drafter shape: its config alone says so
    assert subprocess.run(train_cmd(tiny, first, "--max-steps", "1"), capture_output=True, timeout=240).returncode == 0
    rc, err = check("--block-size", "8", "--init-drafter", find_latest(str(first)))
    assert rc == 2 and len(err) == 1 and "is another drafter (block_size 4 there, 8 here)" in err[0]
    assert not (tmp_path / "out").exists()


def _renamed_layers_target(tiny, path):
    """The tiny target with its decoder layers' tensors under other names: nothing for the drafter to copy."""
    shutil.copytree(tiny["target"], path)
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            tensors = load_file(os.path.join(path, name))
            save_file({k.replace(".layers.", ".blocks."): v for k, v in tensors.items()}, os.path.join(path, name),
                      metadata={"format": "pt"})
    return str(path)


def test_a_target_sharing_no_tensor_is_refused_by_the_check_from_the_headers_alone(tiny, tmp_path, monkeypatch,
                                                                                     capsys):
    """`shares no tensor` comes from the safetensors headers (plan_layers_from_target), so dflash-train --check
    refuses it before a restart stops the live run, without reading a tensor."""
    import safetensors
    target = _renamed_layers_target(tiny, tmp_path / "renamed")
    argv = train_cmd(tiny, tmp_path / "out", "--init-layers-from-target", "--num-draft-layers", "3")
    argv[argv.index("--target-model") + 1] = target
    assert check_here(capsys, argv) == (2, [
        f"dflash-train: error: --init-layers-from-target: the layers of {target} share no tensor of the same name "
        "and shape with the drafter's; drop the flag"])
    real = safetensors.safe_open

    class HeadersOnly:
        def __init__(self, *args, **kwargs):
            self.f = real(*args, **kwargs)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_slice(self, key):
            return self.f.get_slice(key)

        def get_tensor(self, key):
            raise AssertionError(f"read {key}")

    monkeypatch.setattr(safetensors, "safe_open", HeadersOnly)
    from dflash_trainer.cli import config_from_args
    from dflash_trainer.loop.train import drafter_config_for
    cfg = config_from_args(train_cmd(tiny, tmp_path / "o", *STILL, "--mask-token-id", "7")[3:])
    drafter_cfg = drafter_config_for(cfg)[2]
    plan = plan_layers_from_target(tiny["target"], drafter_cfg)
    assert {name for _, _, name in plan} >= {"layers.0.mlp.up_proj.weight", "norm.weight"}
    with pytest.raises(ValueError, match="share no tensor"):
        plan_layers_from_target(target, drafter_cfg)
