"""The input rows of dflash-prepare-data: local files and folders read through the `datasets` library.

--input names files (.json, .jsonl, .parquet, .arrow) or folders (a dataset repository's checkout: its shards,
split by file name as `datasets` splits them, e.g. data/train-00000-of-00002.parquet; or a folder written by
`Dataset.save_to_disk`). --split picks the split,
--shuffle shuffles with --seed, --num-rows keeps the first N rows (after the shuffle). A JSON file `datasets`
cannot parse (a broken line) is read line by line instead, each broken line counted as bad_json.
"""

from __future__ import annotations

import hashlib
import json
import os
import random

from .formats import BadRow

BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}
DEFAULT_SPLIT = "train"  # what datasets names the split of files that name none


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def data_files(inputs: list[str]) -> list[str]:
    """Every data file under the inputs, sorted per folder; a clear error for a missing or empty input."""
    files = []
    for path in inputs:
        if os.path.isdir(path):
            found = sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                           if os.path.splitext(n)[1] in BUILDERS and not n.startswith("."))
            if not found:
                raise ValueError(f"--input {path} holds no {', '.join(BUILDERS)} files; pass a folder of shards")
            files += found
        elif os.path.isfile(path):
            if os.path.splitext(path)[1] not in BUILDERS:
                raise ValueError(f"--input {path}: unknown file type; pass {', '.join(BUILDERS)} files or a folder")
            files.append(path)
        else:
            raise ValueError(f"--input {path} does not exist; pass data files ({', '.join(BUILDERS)}) or a folder")
    return files


def fingerprint_of(inputs: list[str]) -> dict:
    """The inputs as prepare's fingerprint records them: edited files must not resume old shards."""
    files = data_files(inputs)
    return {"inputs": [os.path.abspath(p) for p in files], "input_sha256": [file_sha256(p) for p in files]}


def _json_lines(files: list[str]) -> list:
    """Rows of JSON-lines files read one line at a time: a parsed object, or BadRow("bad_json")."""
    rows = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        rows.append(BadRow("bad_json"))
    return rows


class Rows:
    """The selected rows: len(), columns and rows(start, end) -> dicts (or BadRow) in order."""

    def __init__(self, data, columns: list[str]):
        self.data, self.columns = data, columns

    def __len__(self) -> int:
        return len(self.data)

    def rows(self, start: int, end: int) -> list:
        if isinstance(self.data, list):
            return self.data[start:end]
        return list(self.data.select(range(start, end)))


def _load_datasets(inputs: list[str], files: list[str], split: str, cache_dir: str | None):
    try:
        import datasets
    except ImportError:
        raise ValueError("dflash-prepare-data reads its input with the datasets library; pip install "
                         "'dflash_trainer[data]' (or datasets)") from None
    datasets.disable_progress_bars()
    folder = inputs[0] if len(inputs) == 1 and os.path.isdir(inputs[0]) else None
    if folder and any(os.path.isfile(os.path.join(folder, n)) for n in ("state.json", "dataset_dict.json")):
        saved = datasets.load_from_disk(folder)  # written by save_to_disk: a Dataset or a DatasetDict of splits
        if isinstance(saved, datasets.DatasetDict):
            if split not in saved:
                raise ValueError(f"--split {split}: {folder} holds the splits {', '.join(saved)}")
            return saved[split]
        return saved
    builders = {BUILDERS[os.path.splitext(f)[1]] for f in files}
    if folder is None and len(builders) > 1:
        raise ValueError(f"--input mixes {' and '.join(sorted(builders))} files; prepare each kind separately")
    builder = BUILDERS[os.path.splitext(files[0])[1]]
    try:
        if folder:  # a dataset folder: its splits by file name (or its README's configs), as datasets splits them
            return datasets.load_dataset(folder, split=split, cache_dir=cache_dir)
        return datasets.load_dataset(builder, data_files={split: files}, split=split, cache_dir=cache_dir)
    except ValueError as e:
        if "split" in str(e).lower():
            raise ValueError(f"--split {split}: {' '.join(str(e).split())}") from None
        if builder != "json":
            raise
    except Exception as e:  # noqa: BLE001 - datasets wraps parse errors of any builder
        if builder != "json":
            raise ValueError(f"datasets could not read {', '.join(files)}: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
    print(f"dflash-prepare-data: datasets could not parse the JSON input; reading it line by line "
          "(broken lines are counted as bad_json)", flush=True)
    return None


def load_rows(inputs: list[str], split: str = DEFAULT_SPLIT, num_rows: int | None = None, shuffle: bool = False,
              seed: int = 0, cache_dir: str | None = None) -> Rows:
    files = data_files(inputs)
    ds = _load_datasets(inputs, files, split, cache_dir)
    if ds is None:
        data = _json_lines(files)
        if shuffle:
            random.Random(seed).shuffle(data)
        good = [r for r in data[:1000] if isinstance(r, dict)]
        columns = sorted({k for r in good for k in r})
        return Rows(data[:num_rows] if num_rows is not None else data, columns)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_rows is not None and num_rows < len(ds):
        ds = ds.select(range(num_rows))
    return Rows(ds, list(ds.column_names))
