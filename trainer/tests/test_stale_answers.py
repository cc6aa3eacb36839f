"""proofs/stale_answers.py: a carried preparation of other prompts (another synthesis, another --extra-prompts file)
set aside, kept and hidden from data_sendback, so the real dflash-prepare-data answers the new prompts instead of
refusing the folder after the synthesis has run."""
import os

import pytest

from dflash_trainer.prep.prepare_data import prepare
from dflash_trainer.prep.sources import file_sha256
from dflash_trainer.prep.tiny_tokenizer import synthetic_chats
from proofs import data_sendback
from proofs.stale_answers import set_aside_other_prompts
from test_prepare_data import read_rows, write_jsonl


def test_answers_to_other_prompts_are_moved_aside_whole_and_the_same_prompts_stay(chat_target, tmp_path):
    proof = tmp_path / "proof"
    synth = proof / "data" / "synth"
    prompts = tmp_path / "synth-prompts.jsonl"
    write_jsonl(prompts, synthetic_chats(6, seed=2))
    sha_a = file_sha256(prompts)
    prepare(chat_target, [str(prompts)], str(synth), rows_per_shard=3, progress=False)
    rows_a = read_rows(synth)
    lines = []
    assert set_aside_other_prompts(str(synth), str(prompts), log=lines.append) is None  # the same prompts: kept
    assert synth.is_dir() and not lines

    write_jsonl(prompts, synthetic_chats(9, seed=3))  # a new synthesis rewrote the file at the same path
    with pytest.raises(ValueError, match="other settings"):  # what the proof hit without this
        prepare(chat_target, [str(prompts)], str(synth), rows_per_shard=3, progress=False)
    aside = set_aside_other_prompts(str(synth), str(prompts), log=lines.append)
    assert aside == str(proof / "data" / ".superseded" / f"synth-{sha_a[:12]}") and not synth.exists()
    assert read_rows(aside) == rows_a  # moved whole, nothing lost
    assert len(lines) == 1 and "moved to" in lines[0] and sha_a[:12] in lines[0]
    stats = prepare(chat_target, [str(prompts)], str(synth), rows_per_shard=3, progress=False)
    assert stats["complete"] and stats["num_input_rows"] == 9
    files, _ = data_sendback.settled(str(proof))
    assert files and not [p for p in files if ".superseded" in p]  # the set-aside answers are not sent back

    # the first prompts again, then the second again: a name taken already gets a number, both kept
    write_jsonl(prompts, synthetic_chats(6, seed=2))
    set_aside_other_prompts(str(synth), str(prompts), log=lines.append)
    prepare(chat_target, [str(prompts)], str(synth), rows_per_shard=3, progress=False)
    write_jsonl(prompts, synthetic_chats(9, seed=3))
    again = set_aside_other_prompts(str(synth), str(prompts), log=lines.append)
    assert again == str(proof / "data" / ".superseded" / f"synth-{sha_a[:12]}-2")
    assert read_rows(again) == rows_a == read_rows(aside)


def test_a_folder_without_a_preparation_is_left_alone(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", synthetic_chats(2, seed=1))
    assert set_aside_other_prompts(str(tmp_path / "absent"), prompts) is None
    (tmp_path / "started").mkdir()
    assert set_aside_other_prompts(str(tmp_path / "started"), prompts) is None
    assert sorted(os.listdir(tmp_path)) == ["p.jsonl", "started"]  # nothing moved, no .superseded made
