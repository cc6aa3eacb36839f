"""proofs/data_sendback.py: a proof's regenerated data sent back as it is made, call by call, and resumed from on
another machine by the real dflash-prepare-data."""
import io
import json
import os
import subprocess
import sys
import tarfile

from dflash_trainer.prep.prepare_data import prepare
from dflash_trainer.prep.tiny_tokenizer import synthetic_chats
from proofs import data_sendback
from test_prepare_data import read_rows, write_jsonl

SCRIPT = data_sendback.__file__


def names_in(pieces):
    """The member names of one batch's tar, from its pieces in order."""
    joined = b"".join(open(p, "rb").read() for p in sorted(pieces))
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        return sorted(tar.getnames())


def preparation(folder, num_shards, counted, extra=()):
    """A preparation folder: `num_shards` shard files, a progress.json that counts `counted` of them."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(num_shards):
        (folder / f"shard-{i:05d}.parquet").write_bytes(b"rows %d" % i)
    (folder / "progress.json").write_text(json.dumps({"num_shards": counted, "next_row": counted * 3}))
    for name in extra:
        (folder / name).write_bytes(b"x")


def two_big_shards(tmp_path):
    """A proof whose one preparation counts two 12 KiB shards of noise; returns (proof, stash)."""
    proof, stash = tmp_path / "proof", tmp_path / "stash"
    stash.mkdir()
    preparation(proof / "data", 2, 2)
    for shard in (proof / "data").glob("shard-*"):
        shard.write_bytes(os.urandom(12 * 1024))
    return proof, stash


def test_each_call_sends_only_what_is_settled_and_new(tmp_path):
    proof, stash, data = tmp_path / "proof", tmp_path / "stash", tmp_path / "proof" / "data"
    stash.mkdir()
    # shard 2 is written but not yet counted; a half-written shard; the links and the cache the proof remakes
    preparation(data, 3, 2, extra=("shard-00003.parquet.tmp",))
    (data / "synth-prompts.jsonl").write_text("{}\n")
    (data / "with-synth").mkdir()
    os.symlink("../shard-00000.parquet", data / "with-synth" / "shard-00000.parquet")
    (data / ".datasets-cache" / "json").mkdir(parents=True)  # the datasets library's cache of the prompts
    (data / ".datasets-cache" / "json" / "json-train.arrow").write_bytes(b"cache")
    first = data_sendback.send(str(proof), str(stash), str(tmp_path / "out1"), places=7)
    assert [os.path.basename(p) for p in first] == ["data-01.tar.part-aa"]
    assert names_in(first) == ["data/progress.json", "data/shard-00000.parquet", "data/shard-00001.parquet",
                               "data/synth-prompts.jsonl"]
    assert data_sendback.send(str(proof), str(stash), str(tmp_path / "out2"), places=7) == []  # nothing new
    (data / "progress.json").write_text(json.dumps({"num_shards": 3, "next_row": 9}))  # shard 2 now counted
    third = data_sendback.send(str(proof), str(stash), str(tmp_path / "out3"), places=7)
    assert [os.path.basename(p) for p in third] == ["data-02.tar.part-aa"]
    assert names_in(third) == ["data/progress.json", "data/shard-00002.parquet"]
    # the progress that went across is the one that counts what went with it
    with tarfile.open(fileobj=io.BytesIO(open(third[0], "rb").read())) as tar:
        assert json.load(tar.extractfile("data/progress.json"))["num_shards"] == 3


def test_a_progress_record_waits_until_every_shard_it_counts_is_across(tmp_path, monkeypatch):
    monkeypatch.setattr(data_sendback, "PIECE", 2 * 10240)  # one 12 KiB shard fits a call's one place, two do not
    proof, stash = two_big_shards(tmp_path)
    first = data_sendback.send(str(proof), str(stash), str(tmp_path / "out1"), places=1)
    assert names_in(first) == ["data/shard-00000.parquet"]  # no progress.json: shard 1 is not across
    second = data_sendback.send(str(proof), str(stash), str(tmp_path / "out2"), places=1)
    assert names_in(second) == ["data/progress.json", "data/shard-00001.parquet"]
    assert all(os.path.getsize(p) <= data_sendback.PIECE for p in first + second)
    assert data_sendback.send(str(proof), str(stash), str(tmp_path / "out3"), places=1) == []
    (proof / "data" / "synth-prompts.jsonl").write_text("{}\n")
    assert data_sendback.send(str(proof), str(stash), str(tmp_path / "out4"), places=0) == []  # no place left


def test_a_batch_larger_than_a_piece_comes_back_in_pieces_that_join(tmp_path, monkeypatch):
    monkeypatch.setattr(data_sendback, "PIECE", 10240)
    proof, stash = two_big_shards(tmp_path)
    pieces = data_sendback.send(str(proof), str(stash), str(tmp_path / "out"), places=4)
    assert [os.path.basename(p) for p in pieces] == [f"data-01.tar.part-a{c}" for c in "abc"]
    [joined] = data_sendback.join([str(tmp_path / "out")], str(tmp_path / "carry"))
    with tarfile.open(joined) as tar:
        sent = tar.extractfile("data/shard-00001.parquet").read()
    assert sent == (proof / "data" / "shard-00001.parquet").read_bytes()


def test_carried_data_is_not_sent_back_and_batches_go_on_after_the_carried_ones(tmp_path):
    proof, stash = tmp_path / "proof", tmp_path / "stash"
    stash.mkdir()
    (stash / "data-03.tar").write_bytes(b"")  # an earlier session's last batch, carried in
    preparation(proof / "data" / "synth", 2, 2)
    r = subprocess.run([sys.executable, SCRIPT, "mark", "--proof", str(proof), "--stash", str(stash)],
                       capture_output=True, text=True, check=True)
    assert "data carried in: 3 files, batches from 4" in r.stdout
    r = subprocess.run([sys.executable, SCRIPT, "send", "--proof", str(proof), "--stash", str(stash), "--out",
                        str(tmp_path / "out"), "--places", "7"], capture_output=True, text=True, check=True)
    assert "no new settled data to send" in r.stdout and not (tmp_path / "out").exists()
    (proof / "data" / "synth" / "shard-00002.parquet").write_bytes(b"new rows")
    (proof / "data" / "synth" / "progress.json").write_text(json.dumps({"num_shards": 3}))
    pieces = data_sendback.send(str(proof), str(stash), str(tmp_path / "out"), places=7)
    assert [os.path.basename(p) for p in pieces] == ["data-04.tar.part-aa"]
    assert names_in(pieces) == ["data/synth/progress.json", "data/synth/shard-00002.parquet"]


def test_a_preparation_cut_off_mid_way_resumes_elsewhere_from_what_came_back(chat_target, tmp_path):
    """The lease lost after two of three chunks: the pieces of two calls, joined here and unpacked on a fresh
    machine, let the real prepare-data resume at row 6 and end with the rows the first machine would have made."""
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_chats(9, seed=2))
    kw = dict(regenerate=True, temperature=0.7, max_new_tokens=12, batch_size=4, rows_per_shard=3,
              engine="transformers", device="cpu", max_seq_len=128, progress=False)
    lost, stash = tmp_path / "lost", tmp_path / "stash"
    stash.mkdir()
    prepare(chat_target, [src], str(lost / "data"), num_rows=3, **kw)  # call 1 of the lease
    data_sendback.send(str(lost), str(stash), str(tmp_path / "call1"), places=7)
    prepare(chat_target, [src], str(lost / "data"), num_rows=6, **kw)  # call 2
    data_sendback.send(str(lost), str(stash), str(tmp_path / "call2"), places=7)
    r = subprocess.run([sys.executable, SCRIPT, "join", str(tmp_path / "call1"), str(tmp_path / "call2"),
                        "--to", str(tmp_path / "carry")], capture_output=True, text=True, check=True)
    assert r.stdout.count("joined") == 2
    fresh = tmp_path / "fresh"
    for tar_path in sorted((tmp_path / "carry").iterdir()):  # as launch unpacks data*.tar*, in order
        with tarfile.open(tar_path) as tar:
            tar.extractall(fresh, filter="data")
    resumed = prepare(chat_target, [src], str(fresh / "data"), **kw)
    assert resumed["next_row"] == 9 and resumed["complete"]
    reference = prepare(chat_target, [src], str(lost / "data"), **kw)  # the lost machine, had it gone on
    assert read_rows(fresh / "data") == read_rows(lost / "data") and resumed == reference
