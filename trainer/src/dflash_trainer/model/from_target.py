"""--init-layers-from-target: a new drafter's layers start as copies of evenly spaced layers of the target (the first
and the last included), and its final norm as the target's, so the drafter starts from the target's own language
knowledge instead of noise (the layer-skipping drafts of self-speculative decoding are such a subset of the target's
layers). fc and hidden_norm (the taps' projection) have no counterpart and keep their random start.

A tensor is copied when the target's layer has one of the same name and shape (Llama/Qwen2/Qwen3 layers: all of
them; the seed's Gated DeltaNet layers: the MLP and the norms only; its full-attention layers' gated q_proj is twice
the drafter's and stays random). Norms are converted to the drafter's convention (x̂ · w): a target whose norms
compute x̂ · (1 + w) (Gemma, Qwen3.5/3.6) hands over 1 + w; which one a target uses is measured on its own norm
module, not looked up by name. Reads the target's config and *.safetensors only (the drafter ranks never load it).
"""

from __future__ import annotations

import copy
import glob
import os
import re

import torch

from dflash_trainer.config import spaced_layer_ids

# model.layers.N.rest, or model.language_model.layers.N.rest in a vision-language checkpoint (Qwen3.5/3.6)
_LAYER_KEY = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.(.+)$")
_FINAL_NORM_KEY = re.compile(r"^model\.(?:language_model\.)?norm\.weight$")


def norm_convention(module) -> str | None:
    """'plain' (x̂ · w), 'offset' (x̂ · (1 + w)) or None (neither): measured on a copy of the target's norm module
    with its weight zeroed, applied to a row that is already normalized (±1: mean 0, root mean square 1)."""
    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    weight = getattr(probe, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    with torch.no_grad():
        weight.zero_()
        x = torch.ones(1, weight.numel())
        x[:, 1::2] = -1
        try:
            y = probe(x)
        except Exception:  # a norm that needs more than one input (a gated norm) is not a plain norm
            return None
    if torch.allclose(y, torch.zeros_like(x), atol=1e-3):
        return "plain"
    if torch.allclose(y, x, atol=1e-3):
        return "offset"
    return None


def _target_modules(model_dir: str):
    """The target's decoder layers and final norm, built on the meta device (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    decoder = model.get_decoder()
    return decoder.layers, getattr(decoder, "norm", None)


def _drafter_shapes(drafter_cfg) -> dict[str, torch.Size]:
    from dflash_trainer.model.drafter import DFlashDrafter
    with torch.device("meta"):
        drafter = DFlashDrafter(drafter_cfg)
    return {k: v.shape for k, v in drafter.trainable_state_dict().items()}


def plan_layers_from_target(model_dir: str, drafter_cfg) -> list[tuple[str, str, str]]:
    """(safetensors file, target key, drafter name) of every tensor --init-layers-from-target copies, from the
    files' headers only (no tensor read): what `dflash-train --check` refuses by, before a live run is stopped.
    ValueError when the target shares no tensor with the drafter's layers."""
    from safetensors import safe_open
    ids = spaced_layer_ids(drafter_cfg.num_target_layers, drafter_cfg.num_hidden_layers)
    source = {i: j for j, i in enumerate(ids)}  # target layer -> drafter layer
    shapes = _drafter_shapes(drafter_cfg)
    plan = []
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for key in f.keys():
                layer = _LAYER_KEY.match(key)
                if layer and int(layer.group(1)) in source:
                    name = f"layers.{source[int(layer.group(1))]}.{layer.group(2)}"
                elif _FINAL_NORM_KEY.match(key):
                    name = "norm.weight"
                else:
                    continue
                if name in shapes and tuple(f.get_slice(key).get_shape()) == tuple(shapes[name]):
                    plan.append((path, key, name))
    if not any(name.startswith("layers.") for _, _, name in plan):
        raise _shares_nothing(model_dir)
    return plan


def _shares_nothing(model_dir: str) -> ValueError:
    return ValueError(f"--init-layers-from-target: the layers of {model_dir} share no tensor of the same name and "
                      "shape with the drafter's; drop the flag")


def layers_from_target(model_dir: str, drafter_cfg) -> tuple[dict[str, torch.Tensor], str]:
    """(the drafter tensors copied from the target, float32; the words of the log line): plan_layers_from_target's
    tensors, norms converted to the drafter's convention (a norm of neither convention stays random)."""
    from safetensors import safe_open
    ids = spaced_layer_ids(drafter_cfg.num_target_layers, drafter_cfg.num_hidden_layers)
    plan = plan_layers_from_target(model_dir, drafter_cfg)
    shapes = _drafter_shapes(drafter_cfg)
    layers, final_norm = _target_modules(model_dir)
    conventions = {}

    def norm_module(key: str):
        layer = _LAYER_KEY.match(key)
        return final_norm if layer is None else layers[int(layer.group(1))].get_submodule(
            layer.group(2).rsplit(".", 1)[0])

    state: dict[str, torch.Tensor] = {}
    for path in dict.fromkeys(path for path, _, _ in plan):
        with safe_open(path, "pt") as f:
            for key, name in [(key, name) for p, key, name in plan if p == path]:
                tensor = f.get_tensor(key).float()
                if name.endswith("norm.weight"):
                    module = norm_module(key)
                    kind = None if module is None else conventions.setdefault(type(module), norm_convention(module))
                    tensor = {"plain": tensor, "offset": 1 + tensor}.get(kind)
                if tensor is not None:
                    state[name] = tensor.contiguous()
    in_layers = [k for k in shapes if k.startswith("layers.")]
    copied = [k for k in in_layers if k in state]
    if not copied:  # every shared tensor was a norm of neither convention
        raise _shares_nothing(model_dir)
    final = ", and the final norm" if "norm.weight" in state else ""
    left = f", {len(in_layers) - len(copied)} in the layers" if len(copied) < len(in_layers) else ""
    return state, (f"drafter layers from target layers {ids}: {len(copied)} of their {len(in_layers)} tensors "
                   f"copied{final}; the rest (fc, hidden_norm{left}) random")
