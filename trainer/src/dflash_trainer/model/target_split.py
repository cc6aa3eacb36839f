"""How many GPUs one target rank needs, and its decoder layers placed across them.

A target rank holds a full replica of the frozen target when it fits one GPU, or a layer split across a group
of GPUs when it does not: the embedding and layers 0..a-1 on the group's first GPU, the next contiguous range on
the second, ..., the final norm and lm_head on the last. Activations move to each layer's device in a forward
pre-hook (the small function below; transformers' device_map would do the same but needs accelerate, which the
trainer does not depend on). --target-gpus is cut into groups of that size, one target rank per group; GPUs left
over stay idle (the log says so).

The size decision is a pure function of byte counts (`gpus_per_target_rank`), so it is tested with the real
numbers: a 27B target in bf16 (~54 GB) on 141 GB H200s -> replicas; a 140 GB target -> groups of 2.
"""

from __future__ import annotations

import glob
import json
import math
import os

import torch

# the safetensors dtypes counted as weights
_WEIGHT_DTYPES = frozenset({"F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16", "F8_E4M3", "F8_E5M2",
                            "I8", "U8", "BOOL"})
# Of a GPU's free memory, this much is never planned for (allocator fragmentation, CUDA context, NCCL buffers).
MARGIN = 0.10


def safetensors_numel(model_dir: str) -> int:
    """Elements of every tensor in the *.safetensors files, from their headers only (no weights read)."""
    from safetensors import safe_open

    total = 0
    paths = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not paths:
        raise ValueError(f"--target-model {model_dir} has no *.safetensors; its size cannot be measured: pass "
                         "--target-gpus-per-rank to choose the split by hand")
    for path in paths:
        with safe_open(path, "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                if piece.get_dtype() in _WEIGHT_DTYPES:
                    total += math.prod(piece.get_shape())
    return total


def activation_bytes(num_layers: int, hidden: int, intermediate: int, tokens: int, dtype_bytes: int) -> tuple[int, int]:
    """(retained, transient) bytes of one no-grad target forward of `tokens` tokens: every layer's output is kept
    (output_hidden_states), and one layer's MLP holds about three tokens x intermediate tensors at a time."""
    return (num_layers + 1) * tokens * hidden * dtype_bytes, 3 * tokens * intermediate * dtype_bytes


def gpus_per_target_rank(weight_bytes: int, retained_bytes: int, transient_bytes: int, free_bytes: int,
                         num_gpus: int) -> int:
    """The fewest GPUs over which the target's weights and kept activations, split evenly, plus one layer's
    transient memory fit each GPU's free memory less MARGIN; ValueError when even all `num_gpus` are too few."""
    usable = free_bytes * (1 - MARGIN)
    for g in range(1, num_gpus + 1):
        if (weight_bytes + retained_bytes) / g + transient_bytes <= usable:
            return g
    gb = 1e9
    raise ValueError(f"the target needs {weight_bytes / gb:.1f} GB of weights + {retained_bytes / gb:.1f} GB of kept "
                     f"activations + {transient_bytes / gb:.1f} GB per GPU, more than {num_gpus} GPU(s) with "
                     f"{free_bytes / gb:.1f} GB free each give; add --target-gpus or lower --token-budget")


def target_groups(gpus: list, per_rank: int) -> tuple[list[list], list]:
    """(groups of `per_rank` consecutive entries of `gpus`, the entries left idle)."""
    if per_rank < 1 or per_rank > len(gpus):
        raise ValueError(f"--target-gpus-per-rank {per_rank} does not fit --target-gpus {gpus}; pass a number from "
                         f"1 to {len(gpus)} (or 0: by measured size)")
    num = len(gpus) // per_rank
    return [gpus[i * per_rank:(i + 1) * per_rank] for i in range(num)], gpus[num * per_rank:]


def layer_devices(num_layers: int, devices: list) -> list:
    """The device of each decoder layer: contiguous ranges, as even as possible, the first ranges one longer."""
    n = len(devices)
    if not 1 <= n <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers over {n} devices; pass --target-gpus-per-rank "
                         f"from 1 to {num_layers}")
    base, extra = divmod(num_layers, n)
    out = []
    for i, device in enumerate(devices):
        out += [device] * (base + (1 if i < extra else 0))
    return out


def layer_ranges(per_layer: list) -> str:
    """'layers 0-3 on cuda:0, 4-7 on cuda:1' from each layer's device (a device may repeat: CPU tests)."""
    parts, start = [], 0
    for i in range(1, len(per_layer) + 1):
        if i == len(per_layer) or per_layer[i] is not per_layer[start]:
            parts.append(f"{start}-{i - 1} on {per_layer[start]}")
            start = i
    return "layers " + ", ".join(parts)


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _inputs_to(device):
    def hook(module, args, kwargs):
        return _to(args, device), _to(kwargs, device)
    return hook


def place_layers(causal_lm: torch.nn.Module, devices: list[torch.device]) -> list[torch.device]:
    """Spread a HF causal LM (`.model` with embed_tokens, rotary_emb, layers, norm; lm_head) over `devices` and make
    each layer and the final norm take its inputs to its own device. Returns each layer's device."""
    inner = causal_lm.model
    per_layer = layer_devices(len(inner.layers), devices)
    inner.embed_tokens.to(devices[0])
    if getattr(inner, "rotary_emb", None) is not None:
        inner.rotary_emb.to(devices[0])
    for layer, device in zip(inner.layers, per_layer):
        layer.to(device)
        layer.register_forward_pre_hook(_inputs_to(device), with_kwargs=True)
    for tail in (inner.norm, causal_lm.get_output_embeddings()):
        tail.to(devices[-1])
        tail.register_forward_pre_hook(_inputs_to(devices[-1]), with_kwargs=True)
    return per_layer


def measured_gpus_per_rank(model_dir: str, gpu_ids: list[int], token_budget: int,
                           free: tuple[int, str] | None = None) -> tuple[int, str]:
    """(GPUs per target rank, the numbers it was chosen by): bf16 weights from the safetensors headers, activations
    of one --token-budget micro-batch, and the least free memory of the target GPUs (`free`, else read by NVML,
    which creates no CUDA context; the total memory where NVML is missing)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    text = config.get("text_config", config)
    weights = safetensors_numel(model_dir) * 2
    retained, transient = activation_bytes(int(text["num_hidden_layers"]), int(text["hidden_size"]),
                                           int(text.get("intermediate_size", 4 * int(text["hidden_size"]))),
                                           token_budget, 2)
    free, how = free or gpu_free_bytes(gpu_ids)
    per_rank = gpus_per_target_rank(weights, retained, transient, free, len(gpu_ids))
    return per_rank, (f"weights {weights / 1e9:.1f} GB + kept activations {retained / 1e9:.1f} GB + "
                      f"{transient / 1e9:.1f} GB per GPU vs {free / 1e9:.1f} GB {how} (less {MARGIN:.0%})")


def gpu_free_bytes(gpu_ids: list[int]) -> tuple[int, str]:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return min(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
                       for i in gpu_ids), "free (NVML)"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (not installed, no driver): fall back to the total
        return min(torch.cuda.get_device_properties(i).total_memory for i in gpu_ids), "total (no NVML)"
