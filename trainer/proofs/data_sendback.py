"""What `device_proof.sh` sends back of a proof's regenerated data: at every `watch`, the files that are settled and
were neither carried in nor sent before, as one numbered tar in 15 MiB pieces (data-NN.tar.part-*). A lease lost
in the middle of the regeneration (three in a row were, 2026-12-05) then still leaves the next session what the
earlier calls of the lease made: prepare-data resumes from the carried shards (its progress.json) instead of
starting over.

Settled: a preparation's shards that its progress.json counts, that progress.json (the bytes read, sent only once
every shard it counts is on the other side) and its stats.json (likewise), and any other regular file (written
atomically: the synthesized prompts and their record). Links (the data/with-* folders) and hidden folders (the
datasets library's cache, 5 MB of the first batch on a GPU) are left out: the proof remakes them. The script runs it
by path on the lent machine: the standard library and the trainer's atomic write (no torch).

    data_sendback.py mark --proof DIR --stash DIR                   (launch: what was carried in counts as sent)
    data_sendback.py send --proof DIR --stash DIR --out DIR --places N   (watch: at most N pieces this call)
    data_sendback.py join FILES_AT... --to DIR                      (here: the pieces of each batch -> data-NN.tar)
"""
import argparse
import glob
import io
import json
import os
import re
import sys
import tarfile

from dflash_trainer.telemetry.heartbeat import write_json_atomic

PIECE = 15 * 2**20  # a returned file may hold 16 MiB
MANIFEST = "data-sent.json"
RECORDS = ("progress.json", "stats.json")
SHARD = re.compile(r"shard-(\d+)\.parquet$")
BATCH = re.compile(r"data-(\d+)\.tar")


def _key(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns]


def settled(proof: str) -> tuple[dict, dict]:
    """({rel path under `proof`: ([size, mtime_ns], the bytes read for a record, else None)},
    {preparation folder: the shards its progress.json counts})."""
    files, counted = {}, {}
    for folder, dirs, names in os.walk(os.path.join(proof, "data")):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # caches (datasets' .datasets-cache): remade
        rel_folder = os.path.relpath(folder, proof)
        records = {}
        for name in RECORDS:  # read before listing the shards: a shard it counts is already under its name
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    records[name] = (_key(os.fstat(f.fileno())), f.read())
            except FileNotFoundError:
                continue
        num_shards = json.loads(records["progress.json"][1])["num_shards"] if "progress.json" in records else None
        counted[rel_folder] = [os.path.join(rel_folder, f"shard-{i:05d}.parquet") for i in range(num_shards or 0)]
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.endswith(".tmp") or os.path.islink(path) or name in RECORDS:
                continue
            shard = SHARD.match(name)
            if num_shards is not None and shard and int(shard.group(1)) >= num_shards:
                continue  # written after the progress that was read: the next call sends it
            files[os.path.join(rel_folder, name)] = (_key(os.stat(path)), None)
        for name, (key, body) in records.items():
            files[os.path.join(rel_folder, name)] = (key, body)
    return files, counted


def tar_bytes(sizes: list[int]) -> int:
    """At most what a tar of files of these sizes takes: per member a header, room for a long name's pax header and
    the data in 512-byte blocks; the end blocks; the whole in 10,240-byte records."""
    blocks = sum(512 + 1024 + -(-size // 512) * 512 for size in sizes) + 1024
    return -(-blocks // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _load(stash: str) -> dict:
    path = os.path.join(stash, MANIFEST)
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return {"batch": 0, "files": {}}


def mark(proof: str, stash: str) -> dict:
    """Everything present now (the carried data) counts as sent; batches go on after the highest carried one."""
    files, _ = settled(proof)  # (none where nothing was carried: os.walk of a missing folder yields nothing)
    carried = [int(m.group(1)) for p in glob.glob(os.path.join(stash, "data-*.tar*"))
               if (m := BATCH.match(os.path.basename(p)))]
    manifest = {"batch": max(carried, default=0), "files": {rel: key for rel, (key, _) in files.items()}}
    write_json_atomic(os.path.join(stash, MANIFEST), manifest, indent=1)
    return manifest


def send(proof: str, stash: str, out: str, places: int) -> list[str]:
    """Writes the next batch's pieces into `out` (at most `places` of them); returns their paths."""
    if places < 1:
        return []
    manifest = _load(stash)
    files, counted = settled(proof)
    new = {rel: v for rel, v in files.items() if manifest["files"].get(rel) != v[0]}
    chosen = {}
    for rel, (key, body) in sorted(new.items(), key=lambda kv: (os.path.basename(kv[0]) in RECORDS, kv[0])):
        if os.path.basename(rel) in RECORDS:
            folder_shards = counted.get(os.path.dirname(rel), [])
            if any(s not in chosen and manifest["files"].get(s) != files.get(s, (None,))[0] for s in folder_shards):
                continue  # a shard it counts is not across yet
        if tar_bytes([k[0] for k, _ in chosen.values()] + [key[0]]) > places * PIECE:
            continue  # too much for this call: the next sends it
        chosen[rel] = (key, body)
    if not chosen:
        return []  # nothing new, or one file alone over what this call takes (not seen: shards are a few MB)
    batch = manifest["batch"] + 1
    name = f"data-{batch:02d}.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel, (key, body) in chosen.items():
            if body is None:
                tar.add(os.path.join(proof, rel), arcname=rel, recursive=False)
            else:
                info = tarfile.TarInfo(rel)
                info.size, info.mtime = len(body), key[1] // 10**9
                tar.addfile(info, io.BytesIO(body))
    data = buffer.getvalue()
    os.makedirs(out, exist_ok=True)
    pieces = []
    for i in range(0, len(data), PIECE):
        pieces.append(os.path.join(out, f"{name}.part-{chr(97 + i // PIECE // 26)}{chr(97 + i // PIECE % 26)}"))
        with open(pieces[-1], "wb") as f:
            f.write(data[i:i + PIECE])
    manifest["batch"] = batch
    manifest["files"].update({rel: key for rel, (key, _) in chosen.items()})
    write_json_atomic(os.path.join(stash, MANIFEST), manifest, indent=1)
    return pieces


def join(folders: list[str], to: str) -> list[str]:
    """The pieces found in `folders` (each call's files_at) -> `to`/data-NN.tar, one per batch."""
    batches: dict[str, list[str]] = {}
    for folder in folders:
        for piece in glob.glob(os.path.join(folder, "data-*.tar.part-*")):
            batches.setdefault(os.path.basename(piece).split(".part-")[0], []).append(piece)
    os.makedirs(to, exist_ok=True)
    joined = []
    for name, pieces in sorted(batches.items()):
        joined.append(os.path.join(to, name))
        with open(joined[-1], "wb") as f:
            for piece in sorted(pieces, key=os.path.basename):
                with open(piece, "rb") as p:
                    f.write(p.read())
    return joined


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("mark", "send"):
        s = sub.add_parser(name)
        s.add_argument("--proof", required=True, help="the proof's --out (holds data/)")
        s.add_argument("--stash", required=True, help="where the record of what was sent is kept")
        if name == "send":
            s.add_argument("--out", required=True, help="the folder whose files come back")
            s.add_argument("--places", type=int, required=True, help="how many files this call may add there")
    j = sub.add_parser("join")
    j.add_argument("folders", nargs="+", help="the folders the pieces came back in")
    j.add_argument("--to", required=True, help="where the joined data-NN.tar go (a folder that stash carries)")
    args = p.parse_args(argv)
    if args.command == "mark":
        m = mark(args.proof, args.stash)
        print(f"data carried in: {len(m['files'])} files, batches from {m['batch'] + 1}")
    elif args.command == "send":
        pieces = send(args.proof, args.stash, args.out, args.places)
        print("data sent: " + " ".join(os.path.basename(x) for x in pieces) if pieces
              else "no new settled data to send")
    else:
        for path in join(args.folders, args.to):
            print(f"joined {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
