"""Reading the history of W&B offline runs back from their files (trainer/tests/test_telemetry.py, the W&B resume
test of tests/integration/test_watch_run_local.py).

wandb has no public reader of its .wandb files, so this reads the format they are in: wandb's 7-byte header
(":W&B", magic, version), then LevelDB's log format (32 KiB blocks of chunks, each with a 7-byte header: crc32,
length, type FULL/FIRST/MIDDLE/LAST), each record a wandb_internal_pb2.Record."""

import glob
import json
import os
import struct


def offline_runs(run_dir):
    """The .wandb files of every offline run under <run_dir>/wandb, oldest first (their directories are dated)."""
    return sorted(glob.glob(os.path.join(str(run_dir), "wandb", "offline-run-*", "run-*.wandb")))


def run_id_of(path):
    """The W&B run id a .wandb file belongs to (run-<id>.wandb)."""
    return os.path.basename(path)[len("run-"):-len(".wandb")]


def file_history(path):
    """{step: {key: value}} of one .wandb file."""
    history = {}
    for record in _records(path):
        if record.HasField("history"):
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(row["_step"], {}).update(row)
    return history

def _records(path):
    """Every wandb_internal_pb2.Record of one .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def artifacts(path):
    """[(name, type)] of the artifacts logged in one .wandb file."""
    return [(r.artifact.name, r.artifact.type) for r in _records(path) if r.HasField("artifact")]
