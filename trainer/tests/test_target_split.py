"""A target rank's layer split (target_split.py), the choice of its size, and the drafters' DDP/FSDP choice."""

import pytest
import torch

from dflash_trainer.config import StartupError, TrainConfig
from dflash_trainer.distributed.world import plan_layout
from dflash_trainer.distributed.drafter_parallel import choose_sharding, pad_micro_batches
from dflash_trainer.model.target import FrozenTarget
from dflash_trainer.model.target_split import (activation_bytes, gpus_per_target_rank, layer_devices, layer_ranges,
                                         measured_gpus_per_rank, safetensors_numel, target_groups)

GB = 10**9
H200_FREE = 141 * GB
# Qwen3.6-27B-shaped: 64 layers, hidden 5120, intermediate 17408; one seed micro-batch of 49,152 tokens in bf16
SEED_ACTIVATIONS = activation_bytes(64, 5120, 17408, 49152, 2)


def test_activation_estimate_of_the_seed_batch():
    retained, transient = SEED_ACTIVATIONS
    assert retained == 65 * 49152 * 5120 * 2 and round(retained / GB, 1) == 32.7
    assert round(transient / GB, 2) == 5.13


@pytest.mark.parametrize("weights_gb,per_rank", [(54, 1), (90, 2), (140, 2), (300, 3), (500, 5)])
def test_gpus_per_target_rank_by_size(weights_gb, per_rank):
    """A 27B target in bf16 (54 GB) fits an H200 beside its activations: a replica; 140 GB needs groups of 2."""
    assert gpus_per_target_rank(weights_gb * GB, *SEED_ACTIVATIONS, H200_FREE, num_gpus=5) == per_rank


def test_a_target_too_large_for_all_gpus_is_refused_with_the_numbers():
    with pytest.raises(ValueError) as refused:
        gpus_per_target_rank(1000 * GB, *SEED_ACTIVATIONS, H200_FREE, num_gpus=5)
    message = str(refused.value)
    assert "1000.0 GB of weights" in message and "5 GPU(s) with 141.0 GB free" in message
    assert "add --target-gpus or lower --token-budget" in message


def test_groups_of_the_target_gpus_leave_the_rest_idle():
    assert target_groups([0, 1, 2, 3, 4], 2) == ([[0, 1], [2, 3]], [4])
    assert target_groups([0, 1, 2, 3, 4], 1) == ([[0], [1], [2], [3], [4]], [])
    with pytest.raises(ValueError, match="--target-gpus-per-rank 6 does not fit"):
        target_groups([0, 1, 2, 3, 4], 6)


def test_layers_go_in_contiguous_ranges():
    assert layer_devices(8, ["a", "b", "c"]) == ["a"] * 3 + ["b"] * 3 + ["c"] * 2
    assert layer_devices(64, ["a", "b"]) == ["a"] * 32 + ["b"] * 32
    with pytest.raises(ValueError, match="cannot split 2 layers over 3 devices"):
        layer_devices(2, ["a", "b", "c"])
    # equal devices (the CPU) still read as the ranges they are
    cpus = [torch.device("cpu"), torch.device("cpu")]
    assert layer_ranges(layer_devices(5, cpus)) == "layers 0-2 on cpu, 3-4 on cpu"


def test_safetensors_size_is_read_from_the_headers(tiny):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny["target"])
    stored = {id(p): p.numel() for p in model.state_dict(keep_vars=True).values()}  # a tied table once
    assert safetensors_numel(tiny["target"]) == sum(stored.values())


def test_measured_size_of_a_real_target_directory(tiny):
    """The tiny target (hidden 64, 8 layers): bf16 weights from its headers + one 1024-token batch's activations,
    against the free memory given (on a GPU machine NVML reads it)."""
    # 723,584 bytes of bf16 weights + 1,179,648 kept (9 x 1024 x 64 x 2) + 786,432 transient (3 x 1024 x 128 x 2)
    assert safetensors_numel(tiny["target"]) * 2 == 723584
    assert activation_bytes(8, 64, 128, 1024, 2) == (1179648, 786432)
    assert measured_gpus_per_rank(tiny["target"], [0, 1, 2], 1024, free=(3_000_000, "free"))[0] == 1
    # 90% of 1.7 MB: not the 1.74 MB of halves, but the 1.42 MB of thirds
    per_rank, why = measured_gpus_per_rank(tiny["target"], [0, 1, 2], 1024, free=(1_700_000, "free"))
    assert per_rank == 3 and why.endswith("vs 0.0 GB free (less 10%)")
    with pytest.raises(ValueError, match="more than 3 GPU"):
        measured_gpus_per_rank(tiny["target"], [0, 1, 2], 1024, free=(1_000_000, "free"))


def test_split_target_taps_equal_the_unsplit_ones(tiny):
    """On the CPU the split runs too (every device 'cpu'): the same states bit for bit."""
    whole = FrozenTarget(tiny["target"], torch.device("cpu"), [1, 3, 5], need_last_hidden=True)
    split = FrozenTarget(tiny["target"], torch.device("cpu"), [1, 3, 5], need_last_hidden=True,
                         split_over=[torch.device("cpu")] * 3)
    assert whole.layer_devices is None and len(split.layer_devices) == 8
    assert all(layer._forward_pre_hooks for layer in split.model.model.layers)
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    (taps_a, last_a), (taps_b, last_b) = whole(ids), split(ids)
    assert len(taps_a) == len(taps_b) == 3
    assert all(torch.equal(a, b) for a, b in zip(taps_a, taps_b)) and torch.equal(last_a, last_b)


def _cfg(**kw):
    return TrainConfig(target_model="t", data_dir="d", output_dir="o", **kw)


def test_layout_with_target_groups():
    """--target-gpus 0..4 in groups of 2 and 3 drafter GPUs: 2 target ranks + 3 drafter ranks, GPU 4 idle."""
    cfg = _cfg(target_gpus=[0, 1, 2, 3, 4], drafter_gpus=[5, 6, 7])
    T, D, layout = plan_layout(cfg, 5, cuda=True, per_rank=2)
    assert (T, D) == (2, 3)
    assert [row.get("devices", [row["device"]]) for row in layout] == \
        [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"], ["cuda:5"], ["cuda:6"], ["cuda:7"]]
    assert layout[0]["idle_gpus"] == [4]
    with pytest.raises(StartupError, match=r"make 2 \+ 3 ranks per node but torchrun started 8 \(WORLD_SIZE 8\); pass --nproc-per-node 5"):
        plan_layout(cfg, 8, cuda=True, per_rank=2)
    # on the CPU the split goes over 'cpu' devices; the ranks are --target-ranks
    T, D, layout = plan_layout(_cfg(target_gpus_per_rank=2), 2, cuda=False, per_rank=2)
    assert (T, D) == (1, 1) and layout[0]["devices"] == ["cpu", "cpu"] and "devices" not in layout[1]


@pytest.mark.parametrize("mode,numel,free,expected", [
    ("auto", 1_800_000_000, 141 * GB, "ddp"),   # the 27B-shaped drafter: 28.8 GB + 5 GB frozen fit half an H200
    ("auto", 5_000_000_000, 141 * GB, "fsdp"),  # 80 GB of training state does not
    ("auto", 5_000_000_000, None, "ddp"),       # the CPU
    ("fsdp", 1_000, None, "fsdp"),
    ("ddp", 5_000_000_000, 141 * GB, "ddp"),
])
def test_drafter_sharding_choice(mode, numel, free, expected):
    frozen = 2 * 248320 * 5120 * 2  # embedding + lm_head, bf16
    assert choose_sharding(mode, numel, frozen, free, num_drafters=3)[0] == expected
    # one drafter rank has nobody to shard with: auto keeps DDP (forced FSDP stays)
    assert choose_sharding(mode, numel, frozen, free, num_drafters=1)[0] == ("fsdp" if mode == "fsdp" else "ddp")


def test_fsdp_pads_a_short_last_step_to_the_first_ranks_count():
    # 2 drafters, a last step of 3 micro-batches dealt g % 2: rank 0 has 2, rank 1 has 1 -> one zero-weighted extra
    assert [pad_micro_batches(n, 3, 2, sharded=True) for n in (2, 1)] == [0, 1]
    assert pad_micro_batches(0, 1, 2, sharded=True) == 1  # a rank with none at all repeats its last one
    assert pad_micro_batches(1, 3, 2, sharded=False) == 0
