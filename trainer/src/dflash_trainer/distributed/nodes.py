"""Which node each rank of a torchrun job runs on: the node sizes, and global rank -> (node, local rank).

torchrun numbers the ranks node after node: node g (its GROUP_RANK) holds ranks sum(sizes[:g]) ..
sum(sizes[:g+1]) - 1, as LOCAL_RANK 0 .. LOCAL_WORLD_SIZE - 1. The sizes come from, in this order:
- DFLASH_NODE_RANKS (each node's rank count, node order, e.g. "2,1"): the collection sets it for the check and the
  ranks of a job over nodes, where nodes may run different counts (torchrun tells a rank only its own node's);
- torchrun's GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE when they make WORLD_SIZE (the same --nproc-per-node everywhere);
- LOCAL_WORLD_SIZE alone (a check run by hand) when it divides WORLD_SIZE; else one node of WORLD_SIZE ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dflash_trainer.config import StartupError

NODE_RANKS_ENV = "DFLASH_NODE_RANKS"


@dataclass(frozen=True)
class Nodes:
    sizes: tuple[int, ...]  # ranks on each node, node order

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def uniform(self) -> bool:
        return len(set(self.sizes)) == 1

    def place(self, rank: int) -> tuple[int, int]:
        """(node, local rank) of global `rank`."""
        first = 0
        for node, size in enumerate(self.sizes):
            if rank < first + size:
                return node, rank - first
            first += size
        raise IndexError(f"rank {rank} is past the job's {first} ranks")

    def describe(self) -> str:
        return f"{self.count} node(s) of {','.join(map(str, self.sizes))} rank(s)"


def _int(environ, name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise StartupError(f"{name}={value!r} is not a whole number; unset it or set the number torchrun gives") \
            from None


def job_nodes(world_size: int, environ=os.environ) -> Nodes:
    """The job's node sizes (module docstring), or StartupError naming the variable to fix."""
    listed = environ.get(NODE_RANKS_ENV, "").strip()
    if listed:
        parts = [p.strip() for p in listed.split(",")]
        if not all(p.isdigit() and int(p) >= 1 for p in parts) or sum(map(int, parts)) != world_size:
            raise StartupError(f"{NODE_RANKS_ENV}={listed!r} must list each node's rank count (whole numbers >= 1, "
                               f"node order) adding up to WORLD_SIZE {world_size}; fix it or unset it")
        return Nodes(tuple(int(p) for p in parts))
    groups, local = _int(environ, "GROUP_WORLD_SIZE"), _int(environ, "LOCAL_WORLD_SIZE")
    if groups is not None and local is not None and groups > 1:
        if groups * local != world_size:
            raise StartupError(f"the {groups} nodes run different rank counts (this one {local} of WORLD_SIZE "
                               f"{world_size}); run the same --nproc-per-node on every node or set "
                               f"{NODE_RANKS_ENV} to each node's count in node order, e.g. 2,1")
        return Nodes((local,) * groups)
    if local and local < world_size and world_size % local == 0:
        return Nodes((local,) * (world_size // local))
    return Nodes((world_size,))


def check_placement(nodes: Nodes, rank: int, environ=os.environ) -> None:
    """This rank's own torchrun variables against the node sizes: a wrong DFLASH_NODE_RANKS (or node order) would
    give it another rank's role and device."""
    node, local = nodes.place(rank)
    group, local_rank = _int(environ, "GROUP_RANK"), _int(environ, "LOCAL_RANK")
    if (group is not None and group != node) or (local_rank is not None and local_rank != local):
        raise StartupError(f"torchrun started rank {rank} as local rank {local_rank} of node {group}, but the job's "
                           f"{nodes.describe()} place it as local rank {local} of node {node}; fix "
                           f"{NODE_RANKS_ENV} (or each node's --nproc-per-node) to match the nodes' order")
