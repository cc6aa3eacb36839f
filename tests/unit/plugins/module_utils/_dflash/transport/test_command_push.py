"""Transport.push: one file into the container (`pct push <vmid> <file> <dest>`, every path one argv element;
locally a plain copy), relative or option-like paths refused, pct's refusals mapped to one-line errors."""
import os
import stat

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport import command as t

HOSTILE_NAMES = ["plain.whl", "with space.whl", "$(id).whl", "`id`.whl", "a'b\"c.whl", "new\nline.whl", "-rf.whl",
                 "--perms.whl", "*.whl"]


def _recording_pct(tmp_path, body=None):
    """A pct stand-in that records its argv (NUL-separated) and, for push, copies <file> to <dest> like pct does."""
    log = tmp_path / "argv"
    path = tmp_path / "pct"
    path.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\" > " + str(log) + "\n" +
                    (body or '[ "$1" = push ] && cat "$3" > "$4"\n'))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), log


def _argv(log):
    return log.read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_pct_push_argv_is_exact_and_paths_travel_literally(tmp_path, name):
    pct, log = _recording_pct(tmp_path)
    src = tmp_path / name
    src.write_bytes(b"wheel \x00 bytes")
    dest = tmp_path / "in-ct" / name
    dest.parent.mkdir()
    tr = t.Transport("pct", vmid=200, pct_path=pct)
    assert tr.push_argv(str(src), str(dest)) == [pct, "push", "200", str(src), str(dest)]
    tr.push(str(src), str(dest))
    assert _argv(log) == ["push", "200", str(src), str(dest)]
    assert dest.read_bytes() == b"wheel \x00 bytes"
    assert not (tmp_path / "pwned").exists()


def test_local_push_copies_the_file(tmp_path):
    src = tmp_path / "a b.whl"
    src.write_bytes(os.urandom(4096))
    dest = tmp_path / "dest" / "$(id).whl"
    dest.parent.mkdir()
    t.Transport("local").push(str(src), str(dest))
    assert dest.read_bytes() == src.read_bytes()
    assert os.listdir(dest.parent) == [dest.name]  # no temporary file left


@pytest.mark.parametrize("src,dest,match", [
    ("rel.whl", "/opt/x.whl", "local path must be an absolute path"),
    ("-rf", "/opt/x.whl", "local path must be an absolute path"),
    ("/tmp/x.whl", "opt/x.whl", "destination must be an absolute path"),
    ("/tmp/x.whl", "--perms", "destination must be an absolute path"),
    ("/tmp/x.whl", "/opt/dir/", "full file path, not a directory"),
    ("/tmp/x\0.whl", "/opt/x.whl", "local path must be an absolute path"),
])
def test_bad_paths_are_refused_before_pct_runs(tmp_path, src, dest, match):
    pct, log = _recording_pct(tmp_path)
    with pytest.raises(ValueError, match=match):
        t.Transport("pct", vmid=200, pct_path=pct).push(src, dest)
    assert not log.exists()


def test_a_missing_source_file_is_named(tmp_path):
    pct, log = _recording_pct(tmp_path)
    with pytest.raises(t.TransportError, match="no such file on the managed host"):
        t.Transport("pct", vmid=200, pct_path=pct).push(str(tmp_path / "nope.whl"), "/opt/x.whl")
    assert not log.exists()


@pytest.mark.parametrize("stderr,error,match", [
    ("can only push files to a running CT", t.ContainerNotRunning, "container 200 is not running: start it"),
    ("Configuration file 'nodes/pve/lxc/200.conf' does not exist", t.ContainerMissing, "does not exist on this host"),
    ("CT is locked (backup)", t.TransportError, r"pct push .* failed \(exit 255\): CT is locked \(backup\)"),
])
def test_pct_push_refusals_are_one_line_errors(tmp_path, stderr, error, match):
    pct, _ = _recording_pct(tmp_path, "echo \"%s\" >&2; exit 255\n" % stderr)
    src = tmp_path / "x.whl"
    src.write_text("x")
    with pytest.raises(error, match=match):
        t.Transport("pct", vmid=200, pct_path=pct).push(str(src), "/opt/x.whl")
