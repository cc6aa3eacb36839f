# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Which node of a job over nodes this is, and which node is behind: for messages and the status (stdlib only)."""


def node_label(req):
    job = req.get("job") or req.get("nodes_view") or {}
    nodes, node = job.get("nodes") or [], job.get("node")
    return "node %s (%s)" % (node, nodes[node]["address"]) if nodes and node is not None else "this node"


def node_status(out, world):
    """A job over nodes in the status: this node's label, and the node of the slowest rank (from rank 0's heartbeat,
    so on node 0) - {node, address, rank, steps_behind}."""
    if not (world or {}).get("nodes"):
        return out
    out["node"] = "node %s (%s)" % (world["node"], world["nodes"][world["node"]]["address"])
    slow = out.get("slowest_rank")
    owner = dict((row["rank"], row.get("node")) for row in world.get("layout") or [])
    if slow and owner.get(slow["rank"]) is not None:
        node = owner[slow["rank"]]
        out["slowest_node"] = {"node": node, "address": world["nodes"][node]["address"], "rank": slow["rank"],
                               "steps_behind": slow["steps_behind"]}
    return out
