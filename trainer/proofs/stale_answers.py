"""A carried preparation of other prompts, set aside before the proof prepares its own there.

The proof answers its synthesized prompts in data/synth and the --extra-prompts file in data/extra. Data carried in
from an earlier lease holds those folders as that lease made them. When the prompts changed since (e.g.
--synthesize-prompts 90000 after 30,000: the synthesis writes a new file), dflash-prepare-data would refuse the
folder after the synthesis had already run ("holds a preparation with other settings"). The folder's answers belong
to another prompt file, so the proof moves it to data/.superseded/ (kept; hidden, so data_sendback does not send it
back) and the preparation starts afresh. A folder of the same prompt file stays, and prepare-data resumes it or
refuses it for its other settings as before."""

from __future__ import annotations

import json
import os

from dflash_trainer.prep.sources import fingerprint_of

SUPERSEDED = ".superseded"


def set_aside_other_prompts(prep_dir: str, prompt_file: str, log=print) -> str | None:
    """Move prep_dir aside when its progress.json records another prompt file's sha256 than prompt_file's; return
    where it went (None: nothing to move, or the same prompts)."""
    try:
        with open(os.path.join(prep_dir, "progress.json")) as f:
            recorded = json.load(f).get("settings", {}).get("input_sha256")
    except FileNotFoundError:
        return None
    current = fingerprint_of([prompt_file])["input_sha256"]  # as prepare-data records it
    if recorded == current:
        return None
    sha = current[0]
    old = (recorded or ["unrecorded"])[0][:12]
    parent = os.path.join(os.path.dirname(os.path.abspath(prep_dir)), SUPERSEDED)
    os.makedirs(parent, exist_ok=True)
    base = os.path.join(parent, f"{os.path.basename(os.path.normpath(prep_dir))}-{old}")
    aside, n = base, 1
    while os.path.exists(aside):  # an earlier set-aside of the same prompts: keep both
        n += 1
        aside = f"{base}-{n}"
    os.rename(prep_dir, aside)
    log(f"{prep_dir} held the answers to other prompts (sha256 {old}…, now {sha[:12]}…): moved to {aside}, kept; "
        "answering these prompts afresh")
    return aside
