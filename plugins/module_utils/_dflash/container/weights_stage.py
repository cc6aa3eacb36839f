# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Stage a model directory into /dev/shm, atomically: JSON request in, one JSON result line out. INSIDE the
container (controller/weights_backend.py ships it); stdlib only.

Layout in dest's parent (say /dev/shm, dest /dev/shm/M)::

    M -> .M.v<stamp>             the symlink readers open; replaced atomically (rename of a new symlink)
    .M.v<stamp>/                 a complete version: files + .dflash-manifest.json (written last)
    .M.tmp-<pid>-<stamp>/        a version being built (removed on failure, or by the next run if we died)
    .M.lock                      one stager per dest (flock)

A new version hard-links the files that did not change from the current one (same tmpfs: no copy, no memory)
and copies the others, hashing while copying. Until the symlink is replaced, readers see the previous version
untouched, so a failed or killed staging loses nothing. A real directory at dest (a stage made by hand) is
adopted: its files are linked and checked against the source by content, then it is swapped for the symlink.
"""

import functools
import os
import re
import shutil
import time

from .entry import answer
from .file_lock import FileLock
from .weights_copy import copy_hashing, run_parallel
from .weights_progress import progress_for
from .weights_guards import RefusedError, check_room, check_users
from .weights_manifest import (FORMAT, MANIFEST_NAME, hash_algorithm, hash_file, incomplete,
                               read_manifest, scan_source, write_manifest)


STAMP = r"\d{8}T\d{6}-\d+"


def _sibling_re(dest):
    """Names of the siblings that belong to dest (and to no other dest: .M.v2.v… is not one of .M's)."""
    name = re.escape(os.path.basename(dest))
    return re.compile(r"\.%s\.(?:(?P<version>v%s)|tmp-\d+-%s|adopted-%s|link-\d+)" % (name, STAMP, STAMP, STAMP))


def _sibling(dest, tag):
    parent, name = os.path.split(dest)
    return os.path.join(parent, ".%s.%s" % (name, tag))


def stage_lock(dest, timeout_s):
    """One stager per dest at a time."""
    return FileLock(_sibling(dest, "lock"), timeout_s, lambda path, t: RefusedError(
        "another staging of %s held %s for %ss; wait for it to finish (or raise lock_timeout)"
        % (os.path.basename(dest), path, t)), poll_s=0.2)


def current_state(dest):
    """('missing'|'version'|'adopt', directory or None, manifest or None)."""
    if os.path.islink(dest):
        target = os.path.join(os.path.dirname(dest), os.readlink(dest))
        match = _sibling_re(dest).fullmatch(os.path.basename(target))
        if os.path.dirname(os.path.normpath(target)) != os.path.dirname(dest) or not (match and match["version"]):
            raise RefusedError("%s is a symlink to %s, which model_weights did not make; remove it or choose another "
                               "dest" % (dest, os.readlink(dest)))
        if not os.path.isdir(target):
            return "missing", None, None  # dangling: its version was removed by hand
        return "version", target, read_manifest(target)
    if os.path.isdir(dest):
        return "adopt", dest, None
    if os.path.lexists(dest):
        raise RefusedError("%s exists and is not a directory; remove it or choose another dest" % dest)
    return "missing", None, None


def recover(dest):
    """Under the lock: put back a hand-made stage moved aside by a stager that died, and remove what dead stagers
    and replaced versions left. Returns the paths removed."""
    parent, name = os.path.split(dest)
    mine = _sibling_re(dest)
    entries = sorted(e for e in os.listdir(parent) if mine.fullmatch(e))
    aside = [e for e in entries if e.startswith(".%s.adopted-" % name)]
    if aside and not os.path.lexists(dest):
        os.rename(os.path.join(parent, aside[-1]), dest)
    keep = os.path.realpath(dest)
    removed = []
    for e in entries:
        path = os.path.join(parent, e)
        if os.path.realpath(path) != keep and os.path.lexists(path):
            _remove(path)
            removed.append(path)
    return removed


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def plan(req, source_files, state, algorithm):
    """{rel: action} with action link (hash known), rehash (link, hash the linked file), confirm (link, then
    compare its content with the source's), copy; plus removed names and whether anything changes."""
    kind, base, manifest = state
    old = (manifest or {}).get("files", {})
    same_source = manifest is not None and manifest.get("source") == req["source"]
    actions = {}
    for rel, src in source_files.items():
        base_size = _size(os.path.join(base, rel)) if base else None
        entry = old.get(rel)
        if kind == "version" and same_source and entry and entry["size"] == src["size"] == base_size \
                and entry["mtime_ns"] == src["mtime_ns"]:
            known, full = manifest.get("hash") == algorithm, req["verify"] == "full"
            # rehash: known → compare with the manifest; unknown algorithm → record the new hash (stat says same)
            actions[rel] = "link" if known and not full else "confirm" if full and not known else "rehash"
        elif base_size is not None and base_size == src["size"]:
            actions[rel] = "confirm"  # adopted or re-pointed files: same size, content unknown
        else:
            actions[rel] = "copy"
    removed = sorted(set(old if kind == "version" else _listing(base) if base else {}) - set(source_files))
    untouched = kind == "version" and incomplete(base, manifest) is None and not removed and \
        all(a in ("link", "rehash") for a in actions.values())
    return actions, removed, untouched


def _size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _listing(d):
    try:
        return scan_files(d)
    except OSError:
        return {}


def scan_files(d):
    """{rel: size} of a staged directory's files (the manifest left out)."""
    out = {}
    for top, dirs, names in os.walk(d):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(top, name), d)
            if rel != MANIFEST_NAME:
                out[rel] = os.stat(os.path.join(top, name)).st_size
    return out


def verify_in_place(base, manifest, actions, threads):
    """verify=full on an otherwise unchanged version: re-hash its files; mismatches become copies."""
    algo = manifest["hash"]
    jobs = [(rel, functools.partial(hash_file, os.path.join(base, rel), algo))
            for rel, a in actions.items() if a == "rehash"]
    hashes = run_parallel(jobs, threads)
    bad = sorted(rel for rel, h in hashes.items() if h != manifest["files"][rel]["hash"])
    for rel in bad:
        actions[rel] = "copy"
    return sorted(hashes), bad


def build(req, source_files, state, actions, algorithm, result):
    """Make the new version in a temp sibling; return its final path. Removes the temp dir on any error."""
    dest, source, threads = req["dest"], req["source"], req["threads"]
    base, manifest = state[1], state[2]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-%d" % time.time_ns()  # unique per staging
    tmp = _sibling(dest, "tmp-%d-%s" % (os.getpid(), stamp))
    os.mkdir(tmp, 0o755)
    try:
        hashes = {}
        for rel, action in sorted(actions.items()):
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            if action != "copy":
                os.link(os.path.join(base, rel), os.path.join(tmp, rel))
                if action == "link":
                    hashes[rel] = manifest["files"][rel]["hash"]

        def hashing(path):
            return lambda abort: hash_file(path, algorithm, abort)
        jobs = []
        for rel, action in actions.items():
            if action in ("rehash", "confirm"):
                jobs.append(((rel, "dest"), hashing(os.path.join(tmp, rel))))
            if action == "confirm":
                jobs.append(((rel, "source"), hashing(os.path.join(source, rel))))
        checked = run_parallel(jobs, threads)
        for (rel, side), digest in checked.items():
            if side != "dest":
                continue
            if actions[rel] == "rehash":  # compared with the manifest when it has this algorithm's hash
                ok = manifest.get("hash") != algorithm or digest == manifest["files"][rel]["hash"]
            else:
                ok = digest == checked[(rel, "source")]
            if ok:
                hashes[rel] = digest
            else:
                os.unlink(os.path.join(tmp, rel))
                actions[rel] = "copy"
                result["mismatched"].append(rel)
        late = sum(source_files[rel]["size"] for rel in result["mismatched"])
        if late:
            check_room(late, os.path.dirname(dest))

        to_copy = sorted((rel for rel, a in actions.items() if a == "copy"), key=lambda r: -source_files[r]["size"])
        progress = req["progress"]

        def copying(rel):
            return lambda abort: copy_hashing(os.path.join(source, rel), os.path.join(tmp, rel), algorithm,
                                              source_files[rel], abort, progress)
        progress.set_phase("copying", sum(source_files[rel]["size"] for rel in to_copy))
        t0 = time.monotonic()
        hashes.update(run_parallel([(rel, copying(rel)) for rel in to_copy], threads))
        result["copy_seconds"] = time.monotonic() - t0
        progress.set_phase("copied")
        for rel, src in source_files.items():
            size = _size(os.path.join(tmp, rel))
            if size != src["size"]:
                raise RuntimeError("staged %s has %s bytes, the source %d; nothing was replaced"
                                   % (rel, size, src["size"]))
        files = dict((rel, dict(source_files[rel], hash=hashes[rel])) for rel in source_files)
        write_manifest(tmp, {"format": FORMAT, "complete": True, "source": source, "hash": algorithm,
                             "staged_at": time.time(), "files": files,
                             "total_bytes": sum(f["size"] for f in files.values())})
        final = _sibling(dest, "v" + stamp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def swap(dest, final, adopted):
    """Point dest at final in one rename. A hand-made directory at dest is moved aside first (recover() puts it
    back if we die in between); returns what to remove afterwards."""
    old = os.path.realpath(dest) if os.path.islink(dest) else None
    link = _sibling(dest, "link-%d" % os.getpid())
    os.symlink(os.path.basename(final), link)
    if adopted:
        old = _sibling(dest, "adopted-" + os.path.basename(final)[len(os.path.basename(dest)) + 3:])
        os.rename(dest, old)
    os.replace(link, dest)
    return old


def _file_list(files):
    return "".join("%s %d\n" % (rel, size) for rel, size in sorted(files.items()))


def stage(req):
    t0 = time.monotonic()
    dest, check = req["dest"], req["check_mode"]
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise RefusedError("%s does not exist in the container; create it or choose another dest" % parent)
    if os.path.ismount(dest):
        raise RefusedError("%s is a mount point; stage into a directory inside it (e.g. %s/<model name>)"
                           % (dest, dest))
    source_files = scan_source(req["source"])
    algorithm = hash_algorithm()
    result = {"staged": dest, "source": req["source"], "hash_algorithm": algorithm, "copied": [], "linked": [],
              "removed": [], "mismatched": [], "verified": [], "cleaned": [], "bytes_copied": 0,
              "files_total": len(source_files), "bytes_total": sum(f["size"] for f in source_files.values()),
              "manifest": os.path.join(dest, MANIFEST_NAME)}
    req["progress"] = progress_for(req)  # the role follows it while this runs (async)
    req["progress"].set_phase("waiting for the lock")
    lock = stage_lock(dest, req["lock_timeout"]) if not check else None
    if lock:
        lock.__enter__()
    try:
        req["progress"].set_phase("planning")
        if not check:
            result["cleaned"] = recover(dest)
        state = current_state(dest)
        actions, removed, untouched = plan(req, source_files, state, algorithm)
        if untouched and req["verify"] == "full":
            result["verified"], result["mismatched"] = verify_in_place(state[1], state[2], actions, req["threads"])
            untouched = not result["mismatched"]
        before = scan_files(state[1]) if state[1] else {}
        after = dict((rel, f["size"]) for rel, f in source_files.items())
        result["changed"] = not untouched
        if req["diff"]:
            result["diff"] = {"before_header": dest, "after_header": dest, "before": _file_list(before),
                              "after": _file_list(after)}
        if not untouched:
            result["room"] = check_room(sum(source_files[r]["size"] for r, a in actions.items() if a == "copy"),
                                        parent)
            result["live_runs"] = check_users(dest, req["runs_root"], req["force"])
        if untouched or check:
            result["linked"] = sorted(r for r, a in actions.items() if a != "copy")
            result["copied"] = sorted(r for r, a in actions.items() if a == "copy")
            result["removed"] = removed
            result["version"] = state[1] if state[0] == "version" else None
            result["bytes_copied"] = sum(source_files[r]["size"] for r in result["copied"]) if check else 0
            if untouched:
                result["copied"], result["linked"] = [], []
            result["seconds"] = round(time.monotonic() - t0, 3)
            return result
        final = build(req, source_files, state, actions, algorithm, result)
        old = swap(dest, final, state[0] == "adopt")
        if old and old != final:
            _remove(old)
        result.update(version=final, removed=removed,
                      copied=sorted(r for r, a in actions.items() if a == "copy"),
                      linked=sorted(r for r, a in actions.items() if a != "copy"))
        result["bytes_copied"] = sum(source_files[r]["size"] for r in result["copied"])
        result["mb_per_s"] = round(result["bytes_copied"] / 1e6 / max(result.pop("copy_seconds"), 1e-6), 1)
        result["seconds"] = round(time.monotonic() - t0, 3)
        return result
    except BaseException:
        req["progress"].discard()
        raise
    finally:
        if lock:
            lock.__exit__()


def main(req):
    answer(stage, req, (RefusedError, ValueError), "weights staging error")
