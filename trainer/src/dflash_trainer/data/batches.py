"""Tokenized completions on disk -> token-budget micro-batches, in a resumable deterministic order.

On-disk format (trainer/README.md): a directory of `*.parquet` shards, each with the columns
`input_ids: list<int32>` and `loss_mask: list<int8>` (1 on assistant tokens), same length per row.
Shards are read in sorted filename order; row i of the dataset is the i-th row across them. --shard-weights gives
the rows of some shards (by file-name prefix) another count of appearances an epoch.

Legend: B = sequences in a micro-batch, T = padded length.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from dflash_trainer.config.paths import shard_weight_list


def as_numpy(arr) -> np.ndarray:
    """A pyarrow array of integers without nulls as numpy, zero-copy. Array.to_numpy and pyarrow.dataset import
    pandas (pyarrow checks for its pandas shim): ~0.4 s of CPU in every training process, for nothing here."""
    if pa.types.is_integer(arr.type) and arr.null_count == 0:
        dtype = np.dtype(str(arr.type))
        return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)  # bool masks (bit-packed) and anything else: pyarrow's own


class TokenizedDataset:
    """All sequences in memory as flat numpy arrays + offsets: 5 bytes per token and no per-row Python
    objects, so a few billion tokens still load (a list of lists would need ~30x the memory)."""

    def __init__(self, data_dir: str, max_seq_len: int, shard_weights: str | None = None):
        shards = sorted(glob.glob(os.path.join(data_dir, "*.parquet")))
        if not shards:
            raise ValueError(f"no *.parquet shards in {data_dir}; see trainer/README.md for the format")
        weights = shard_weight_list(shards, shard_weights, data_dir)
        ids_parts, mask_parts, starts, lengths, repeats = [], [], [], [], []
        base = 0
        for shard, weight in zip(shards, weights):
            # ParquetFile, not read_table: read_table goes through pyarrow.dataset, which imports pandas
            table = pq.ParquetFile(shard).read(columns=["input_ids", "loss_mask"])
            ids_col = table.column("input_ids").combine_chunks()
            mask_col = table.column("loss_mask").combine_chunks()
            id_off = as_numpy(ids_col.offsets).astype(np.int64)
            mask_off = as_numpy(mask_col.offsets).astype(np.int64)
            n_ids, n_mask = np.diff(id_off), np.diff(mask_off)
            if not np.array_equal(n_ids, n_mask):
                row = int(np.nonzero(n_ids != n_mask)[0][0])
                raise ValueError(f"{shard}: row {row} has {n_ids[row]} input_ids but {n_mask[row]} loss_mask "
                                 "entries; regenerate the shard with one mask entry per token")
            # Offsets may not start at 0 (sliced arrays): index the values relative to the first offset.
            ids_parts.append(as_numpy(ids_col.values)[id_off[0]:id_off[-1]].astype(np.int32))
            mask_parts.append(as_numpy(mask_col.values)[mask_off[0]:mask_off[-1]] != 0)
            keep = n_ids >= 2  # no anchor possible in a shorter sequence
            starts.append(base + (id_off[:-1] - id_off[0])[keep])
            lengths.append(np.minimum(n_ids[keep], max_seq_len))
            repeats.append(np.full(int(keep.sum()), weight, dtype=np.int64))
            base += int(id_off[-1] - id_off[0])
        self.ids_flat = np.concatenate(ids_parts)
        self.mask_flat = np.concatenate(mask_parts)
        self.starts = np.concatenate(starts).astype(np.int64)
        self.lengths = np.concatenate(lengths).astype(np.int64)
        if len(self.lengths) == 0:
            raise ValueError(f"{data_dir} holds no sequence of 2 or more tokens; check the data")
        # appearances of each row an epoch: None (each once) without --shard-weights, so the plan stays the one of
        # a run without them, draw for draw
        self.shard_weights = shard_weights
        self.repeats = np.concatenate(repeats) if shard_weights is not None else None
        if self.repeats is not None and not self.repeats.any():
            raise ValueError(f"--shard-weights {shard_weights} leaves out every sequence of {data_dir}; "
                             "give some shards a weight of 1 or more")

    @property
    def rows_per_epoch(self) -> int:
        """Sequences an epoch: the rows, each counted as often as --shard-weights has it appear."""
        return len(self.lengths) if self.repeats is None else int(self.repeats.sum())

    def describe(self, batches_per_epoch: int) -> str:
        """The log's data line (one process and torchrun's rank 0 alike)."""
        return (f"{len(self)} sequences, {int(self.lengths.sum())} tokens ({self.num_supervised_tokens} supervised); "
                f"{batches_per_epoch} micro-batches/epoch"
                + (f" ({self.rows_per_epoch} sequences an epoch by --shard-weights {self.shard_weights})"
                   if self.shard_weights is not None else ""))

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, n = self.starts[i], self.lengths[i]
        return self.ids_flat[s:s + n], self.mask_flat[s:s + n]

    @property
    def num_supervised_tokens(self) -> int:
        return int(sum(int(self.row(i)[1].sum()) for i in range(len(self))))


def plan_epoch(lengths: np.ndarray, seed: int, epoch: int, token_budget: int, max_batch_size: int,
               repeats: np.ndarray | None = None) -> list[list[int]]:
    """The micro-batches of one epoch, a pure function of (seed, epoch) so a resumed run sees the same order.

    Shuffle (each row `repeats[i]` times where given), then sort by length inside windows of 64 batches' worth of
    sequences (less padding), pack greedily under the budget (count x longest <= token_budget, count <=
    max_batch_size), shuffle batches.
    """
    rng = np.random.default_rng([seed, epoch])
    if repeats is None:
        order = rng.permutation(len(lengths))
    else:
        order = rng.permutation(np.repeat(np.arange(len(lengths)), repeats))
    window = 64 * max_batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batch: list[int] = []
        longest = 0
        for idx in chunk.tolist():
            new_longest = max(longest, int(lengths[idx]))
            if batch and ((len(batch) + 1) * new_longest > token_budget or len(batch) >= max_batch_size):
                batches.append(batch)
                batch, new_longest = [], int(lengths[idx])
            batch.append(idx)
            longest = new_longest
        if batch:
            batches.append(batch)
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]


@dataclass
class Batch:
    input_ids: torch.Tensor   # [B, T] int64, padded with 0
    loss_mask: torch.Tensor   # [B, T] bool, False on padding
    lengths: torch.Tensor     # [B] int64
    indices: list[int]        # dataset rows, for the data-order fingerprint

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device, non_blocking=True), self.loss_mask.to(device, non_blocking=True),
                     self.lengths.to(device), self.indices)


def collate(dataset: TokenizedDataset, indices: list[int]) -> Batch:
    lengths = dataset.lengths[indices]
    max_len = int(lengths.max())
    ids = np.zeros((len(indices), max_len), dtype=np.int64)
    mask = np.zeros((len(indices), max_len), dtype=np.bool_)
    for row, idx in enumerate(indices):
        n = int(lengths[row])
        ids[row, :n], mask[row, :n] = dataset.row(idx)
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(lengths.copy()), list(indices))


class BatchLoader:
    """Iterates micro-batches epoch after epoch; state_dict() is the position of the next batch."""

    def __init__(self, dataset: TokenizedDataset, seed: int, token_budget: int, max_batch_size: int):
        self.dataset = dataset
        self.seed = seed
        self.token_budget = token_budget
        self.max_batch_size = max_batch_size
        self.epoch = 0
        self.batch_index = 0  # next batch to yield within self.epoch
        self._plan: list[list[int]] | None = None
        self._plan_epoch = -1

    def batches_in_epoch(self, epoch: int | None = None) -> int:
        return len(self._get_plan(self.epoch if epoch is None else epoch))

    def _get_plan(self, epoch: int) -> list[list[int]]:
        if self._plan_epoch != epoch:
            self._plan = plan_epoch(self.dataset.lengths, self.seed, epoch, self.token_budget, self.max_batch_size,
                                    self.dataset.repeats)
            self._plan_epoch = epoch
        return self._plan

    def next_batch(self) -> Batch:
        return collate(self.dataset, self._next_indices())

    def skip_batch(self) -> None:
        """Moves past the next batch without building it (another data-parallel rank's share)."""
        self._next_indices()

    def _next_indices(self) -> list[int]:
        plan = self._get_plan(self.epoch)
        if self.batch_index >= len(plan):
            self.epoch += 1
            self.batch_index = 0
            plan = self._get_plan(self.epoch)
        self.batch_index += 1
        return plan[self.batch_index - 1]

    def shape_spanning_batches(self, n: int) -> list[list[int]]:
        """Up to n micro-batches (dataset rows) of the current epoch's plan that span its shapes: the most tokens,
        the fewest and most sequences, the shortest and longest, the fewest tokens, then the plan's next batches.
        For the compile warm-up: torch.compile specializes on what the first batches show (a size of 1, a batch
        count seen so far, a size threshold of inductor's), and every shape it has not seen recompiles inside the
        training clock (PROOF.md run 7). Reads the plan only; the position does not move."""
        plan = self._get_plan(self.epoch)
        count = [len(b) for b in plan]
        longest = [int(self.dataset.lengths[b].max()) for b in plan]
        tokens = [c * t for c, t in zip(count, longest)]
        order = range(len(plan))
        picks = [max(order, key=tokens.__getitem__), min(order, key=count.__getitem__),
                 max(order, key=count.__getitem__), min(order, key=longest.__getitem__),
                 max(order, key=longest.__getitem__), min(order, key=tokens.__getitem__)]
        picks += [(self.batch_index + k) % len(plan) for k in range(len(plan))]
        chosen = list(dict.fromkeys(picks))[:n]
        return [plan[i] for i in chosen]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_index": self.batch_index, "seed": self.seed,
                "token_budget": self.token_budget, "max_batch_size": self.max_batch_size,
                "num_sequences": len(self.dataset)}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["num_sequences"] != len(self.dataset):
            # A different seed or dataset would silently replay other data; say so instead.
            print(f"warning: checkpoint data position was for seed {state['seed']} / {state['num_sequences']} "
                  f"sequences, now {self.seed} / {len(self.dataset)}; the order after resume differs", flush=True)
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch_index"])
