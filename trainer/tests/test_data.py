"""Token-budget batching, truncation, deterministic order and a resumable position."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dflash_trainer.data.batches import BatchLoader, TokenizedDataset, plan_epoch


def _write(tmp_path, lengths):
    rows = [list(range(n)) for n in lengths]
    table = pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())),
                      "loss_mask": pa.array([[1] * n for n in lengths], pa.list_(pa.int8()))})
    pq.write_table(table, tmp_path / "a.parquet")


def test_budget_batch_size_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    _write(tmp_path, rng.integers(2, 300, 200).tolist())
    ds = TokenizedDataset(str(tmp_path), max_seq_len=128)
    assert ds.lengths.max() == 128
    plan = plan_epoch(ds.lengths, seed=0, epoch=0, token_budget=512, max_batch_size=6)
    assert sorted(i for b in plan for i in b) == list(range(len(ds)))   # every sequence once
    for b in plan:
        assert len(b) <= 6 and len(b) * ds.lengths[b].max() <= 512


def test_order_deterministic_per_epoch_and_resumable(tmp_path):
    _write(tmp_path, list(range(5, 105)))
    ds = TokenizedDataset(str(tmp_path), max_seq_len=256)
    a = BatchLoader(ds, seed=3, token_budget=256, max_batch_size=8)
    seen = [a.next_batch().indices for _ in range(7)]
    state = a.state_dict()
    rest = [a.next_batch().indices for _ in range(40)]      # crosses into epoch 1 and beyond
    b = BatchLoader(ds, seed=3, token_budget=256, max_batch_size=8)
    b.load_state_dict(state)
    assert [b.next_batch().indices for _ in range(40)] == rest
    c = BatchLoader(ds, seed=3, token_budget=256, max_batch_size=8)
    assert [c.next_batch().indices for _ in range(7)] == seen
    assert plan_epoch(ds.lengths, 3, 0, 256, 8) != plan_epoch(ds.lengths, 3, 1, 256, 8)


def test_skip_batch_walks_the_same_plan(tmp_path):
    _write(tmp_path, list(range(5, 105)))
    ds = TokenizedDataset(str(tmp_path), max_seq_len=256)
    full = BatchLoader(ds, seed=3, token_budget=256, max_batch_size=8)
    every = [full.next_batch().indices for _ in range(60)]  # crosses into later epochs
    rank1 = BatchLoader(ds, seed=3, token_budget=256, max_batch_size=8)
    mine = []
    for _ in range(30):
        rank1.skip_batch()
        mine.append(rank1.next_batch().indices)
    assert mine == every[1::2] and rank1.epoch == full.epoch


def test_collate_pads_and_masks(tmp_path):
    _write(tmp_path, [3, 5])
    ds = TokenizedDataset(str(tmp_path), max_seq_len=16)
    batch = BatchLoader(ds, 0, 64, 4).next_batch()
    assert batch.input_ids.shape == (2, 5)
    assert sorted(batch.lengths.tolist()) == [3, 5]
    row = batch.lengths.tolist().index(3)
    assert batch.loss_mask[row].tolist() == [True, True, True, False, False]


def test_multiple_row_groups_and_length_mismatch(tmp_path):
    rows = [list(range(100 + i, 100 + i + n)) for i, n in enumerate([4, 1, 6, 3, 5])]
    table = pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())),
                      "loss_mask": pa.array([[i % 2 for i in range(len(r))] for r in rows], pa.list_(pa.int8()))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    ds = TokenizedDataset(str(tmp_path), max_seq_len=4)
    assert len(ds) == 4                                     # the 1-token row is skipped
    ids, mask = ds.row(1)
    assert ids.tolist() == [102, 103, 104, 105] and mask.tolist() == [False, True, False, True]
    bad = pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32())),
                    "loss_mask": pa.array([[1, 1]], pa.list_(pa.int8()))})
    pq.write_table(bad, tmp_path / "b.parquet")
    import pytest
    with pytest.raises(ValueError, match="loss_mask"):
        TokenizedDataset(str(tmp_path), max_seq_len=8)


def test_shape_spanning_batches_cover_the_plans_extremes_without_moving(tmp_path):
    """The compile warm-up's batches: the plan's extremes of sequence count, length and tokens first, then the
    next batches; the loader's position stays where it was."""
    rng = np.random.default_rng(1)
    _write(tmp_path, rng.integers(2, 300, 300).tolist())
    ds = TokenizedDataset(str(tmp_path), max_seq_len=256)
    loader = BatchLoader(ds, seed=0, token_budget=1024, max_batch_size=16)
    loader.next_batch()
    state = loader.state_dict()
    plan = loader._get_plan(0)
    picked = loader.shape_spanning_batches(8)
    assert loader.state_dict() == state and len(picked) == 8 and len({tuple(b) for b in picked}) == 8
    counts, longest = [len(b) for b in picked[:6]], [int(ds.lengths[b].max()) for b in picked[:6]]
    assert min(counts) == min(len(b) for b in plan) and max(counts) == max(len(b) for b in plan)
    assert min(longest) == min(int(ds.lengths[b].max()) for b in plan)
    assert max(longest) == max(int(ds.lengths[b].max()) for b in plan)
    assert loader.shape_spanning_batches(2) == picked[:2]


def test_shards_of_other_integer_widths_bool_masks_and_sliced_arrays_read_the_same(tmp_path):
    from dflash_trainer.data.batches import as_numpy
    assert as_numpy(pa.array([5, 6, 7, 8], pa.int64()).slice(1)).tolist() == [6, 7, 8]   # an offset into the buffer
    # bit-packed booleans: pyarrow's own path
    assert as_numpy(pa.array([True, False, True], pa.bool_())).tolist() == [True, False, True]
    rows = [[3, 1, 4], [1, 5], [9, 2, 6, 5]]
    pq.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64())),
                             "loss_mask": pa.array([[False, True, True], [True, True], [False] * 4],
                                                   pa.list_(pa.bool_()))}), tmp_path / "a.parquet")
    ds = TokenizedDataset(str(tmp_path), max_seq_len=8)
    assert ds.ids_flat.tolist() == [3, 1, 4, 1, 5, 9, 2, 6, 5] and ds.ids_flat.dtype == np.int32
    assert ds.mask_flat.tolist() == [False, True, True, True, True, False, False, False, False]
    assert ds.starts.tolist() == [0, 3, 5] and ds.lengths.tolist() == [3, 2, 4]


def test_reading_the_shards_leaves_pandas_unimported(tmp_path):
    """pyarrow's read_table and Array.to_numpy import pandas: ~0.4 s of CPU in every training process."""
    import subprocess
    import sys
    _write(tmp_path, [4, 9, 2])
    code = ("import sys; from dflash_trainer.data.batches import TokenizedDataset; "
            f"d = TokenizedDataset({str(tmp_path)!r}, 16); print(len(d), 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "False"]


def _write_named(tmp_path, name, lengths):
    table = pa.table({"input_ids": pa.array([list(range(n)) for n in lengths], pa.list_(pa.int32())),
                      "loss_mask": pa.array([[1] * n for n in lengths], pa.list_(pa.int8()))})
    pq.write_table(table, tmp_path / name)


def test_shard_weights_repeat_rows_per_epoch_by_file_name_prefix(tmp_path):
    """--shard-weights: the rows of a shard come N times an epoch (longest prefix wins, 0 leaves them out), the
    plan stays a pure function of (seed, epoch) and resumes; without the flag the plan is the unweighted one."""
    _write_named(tmp_path, "shard-00000.parquet", [10, 11, 12, 1])  # the 1-token row is dropped: 3 rows
    _write_named(tmp_path, "synth-shard-00000.parquet", [20, 21])
    _write_named(tmp_path, "synth-x-shard-00000.parquet", [30])
    plain = TokenizedDataset(str(tmp_path), max_seq_len=64)
    assert plain.repeats is None and plain.rows_per_epoch == len(plain) == 6
    ds = TokenizedDataset(str(tmp_path), max_seq_len=64, shard_weights="synth-=3,synth-x-=0")
    assert ds.repeats.tolist() == [1, 1, 1, 3, 3, 0] and ds.rows_per_epoch == 9
    for epoch in (0, 1):
        plan = plan_epoch(ds.lengths, 5, epoch, 256, 4, ds.repeats)
        assert sorted(i for b in plan for i in b) == [0, 1, 2, 3, 3, 3, 4, 4, 4]
        assert plan == plan_epoch(ds.lengths, 5, epoch, 256, 4, ds.repeats)
    a = BatchLoader(ds, seed=5, token_budget=256, max_batch_size=4)
    seen = [a.next_batch().indices for _ in range(3)]
    b = BatchLoader(ds, seed=5, token_budget=256, max_batch_size=4)
    b.load_state_dict(a.state_dict())
    assert [b.next_batch().indices for _ in range(5)] == [a.next_batch().indices for _ in range(5)]
    assert seen and a.batches_in_epoch(0) == len(plan_epoch(ds.lengths, 5, 0, 256, 4, ds.repeats))
    # the unweighted loader draws the plan of a run without the flag, draw for draw
    assert BatchLoader(plain, 5, 256, 4).next_batch().indices == plan_epoch(plain.lengths, 5, 0, 256, 4)[0]


def test_shard_weights_refusals_name_the_problem(tmp_path):
    import pytest
    from dflash_trainer.config.parsing import shard_weights_of
    _write_named(tmp_path, "shard-00000.parquet", [10, 11])
    with pytest.raises(ValueError, match=r"--shard-weights extra-: no shard of .* \(its shards: shard-00000\.parquet\)"):
        TokenizedDataset(str(tmp_path), 64, shard_weights="extra-=2")
    with pytest.raises(ValueError, match="leaves out every sequence"):
        TokenizedDataset(str(tmp_path), 64, shard_weights="shard-=0")
    assert shard_weights_of("synth-=2, extra-=0") == [("synth-", 2), ("extra-", 0)]
    for bad in ("synth-", "synth-=x", "=2", "synth-=101", "synth-=-1", "a=1,a=2"):
        with pytest.raises(ValueError, match="--shard-weights"):
            shard_weights_of(bad)
