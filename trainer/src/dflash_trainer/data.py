"""Tokenized completions on disk -> token-budget micro-batches, in a resumable deterministic order.

On-disk format (trainer/README.md): a directory of `*.parquet` shards, each with the columns
`input_ids: list<int32>` and `loss_mask: list<int8>` (1 on assistant tokens), same length per row.
Shards are read in sorted filename order; row i of the dataset is the i-th row across them.

Legend: B = sequences in a micro-batch, T = padded length.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import torch


class TokenizedDataset:
    """All sequences in memory as numpy arrays (tokenized text is small next to the hidden states)."""

    def __init__(self, data_dir: str, max_seq_len: int):
        shards = sorted(glob.glob(os.path.join(data_dir, "*.parquet")))
        if not shards:
            raise ValueError(f"no *.parquet shards in {data_dir}; see trainer/README.md for the format")
        self.input_ids: list[np.ndarray] = []
        self.loss_mask: list[np.ndarray] = []
        for shard in shards:
            table = pq.read_table(shard, columns=["input_ids", "loss_mask"])
            ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
            for ids, mask in zip(ids_col.to_pylist(), mask_col.to_pylist()):
                if len(ids) != len(mask):
                    raise ValueError(f"{shard}: a row has {len(ids)} input_ids but {len(mask)} loss_mask entries; "
                                     "regenerate the shard with one mask entry per token")
                if len(ids) < 2:
                    continue  # no anchor possible
                self.input_ids.append(np.asarray(ids[:max_seq_len], dtype=np.int64))
                self.loss_mask.append(np.asarray(mask[:max_seq_len], dtype=np.bool_))
        if not self.input_ids:
            raise ValueError(f"{data_dir} holds no sequence of 2 or more tokens; check the data")
        self.lengths = np.array([len(x) for x in self.input_ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_supervised_tokens(self) -> int:
        return int(sum(int(m.sum()) for m in self.loss_mask))


def plan_epoch(lengths: np.ndarray, seed: int, epoch: int, token_budget: int, max_batch_size: int) -> list[list[int]]:
    """The micro-batches of one epoch, a pure function of (seed, epoch) so a resumed run sees the same order.

    Shuffle, then sort by length inside windows of 64 batches' worth of sequences (less padding), pack
    greedily under the budget (count x longest <= token_budget, count <= max_batch_size), shuffle batches.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
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
        ids[row, :n] = dataset.input_ids[idx]
        mask[row, :n] = dataset.loss_mask[idx]
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
            self._plan = plan_epoch(self.dataset.lengths, self.seed, epoch, self.token_budget, self.max_batch_size)
            self._plan_epoch = epoch
        return self._plan

    def next_batch(self) -> Batch:
        plan = self._get_plan(self.epoch)
        if self.batch_index >= len(plan):
            self.epoch += 1
            self.batch_index = 0
            plan = self._get_plan(self.epoch)
        batch = collate(self.dataset, plan[self.batch_index])
        self.batch_index += 1
        return batch

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
