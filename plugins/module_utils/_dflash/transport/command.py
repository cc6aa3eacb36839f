# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The one place that knows how a command reaches the inside of the training container.

Modes:
  pct    we run on the Proxmox host: ``pct exec <vmid> -- env -i K=V … argv…``
  local  no container: the same ``env -i …`` vector runs on the managed host itself

No shell string is ever assembled from caller input: every value travels as its own argv element
(or on stdin). The caller's environment is never passed through: ``env -i`` starts from nothing,
then only the explicit ``env`` mapping (plus a default PATH) is set.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "$" would let a trailing newline in
# Runs argv[1:] as a login shell would, without interpolating any of it into the script.
LOGIN_SHELL_SCRIPT = 'exec "$@"'
MODES = ("pct", "local")


class TransportError(Exception):
    """A command could not be run where it was meant to run (not: the command itself failed)."""


class PctNotFound(TransportError):
    pass


class ContainerNotRunning(TransportError):
    pass


class ContainerMissing(TransportError):
    pass


class CommandTimeout(TransportError):
    pass


def validate_env(env):
    """Reject names a shell or env(1) would misread; values may hold anything but NUL."""
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise ValueError(
                "invalid environment variable name %r: use letters, digits and _ and do not start with a digit" % (name,)
            )
        if "\0" in str(value):
            raise ValueError("environment variable %s contains a NUL byte, which no process can receive" % name)


def _env_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class Transport(object):
    """Builds and runs argument vectors for one target (a container, or the host itself)."""

    def __init__(self, mode="local", vmid=None, pct_path="pct"):
        if mode not in MODES:
            raise ValueError("transport must be one of %s, got %r" % (", ".join(MODES), mode))
        if mode == "pct":
            if vmid is None or not str(vmid).isdigit() or not 100 <= int(vmid) <= 999999999:
                raise ValueError("vmid must be an integer from 100 to 999999999 for transport=pct, got %r" % (vmid,))
            vmid = int(vmid)
        self.mode = mode
        self.vmid = vmid
        self.pct_path = pct_path

    @classmethod
    def from_params(cls, params):
        """The transport of a module whose spec includes transport_argument_spec()."""
        return cls(params["transport"], vmid=params.get("vmid"), pct_path=params["pct_path"])

    def describe(self):
        return "CT %s" % self.vmid if self.mode == "pct" else "the local host"

    def build_argv(self, argv, env=None, login_shell=False, cwd=None):
        """Return the full vector that runs ``argv`` at the target with exactly ``env``."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("command must be a non-empty list of strings, got %r" % (argv,))
        if any("\0" in a for a in argv):
            raise ValueError("command contains a NUL byte, which no process can receive")
        env = dict(env or {})
        validate_env(env)
        env.setdefault("PATH", DEFAULT_PATH)
        if "=" in argv[0]:
            # env(1) would take it for an assignment instead of the program to run.
            raise ValueError("the program to run may not contain '=': %r" % argv[0])
        inner = ["env", "-i"]
        if cwd:
            inner += ["-C", str(cwd)]
        inner += ["--"] + ["%s=%s" % (k, _env_value(v)) for k, v in sorted(env.items())]
        if login_shell:
            # bash -l reads the profile (PATH, conda, …); "$@" keeps every argument literal.
            inner += ["bash", "-lc", LOGIN_SHELL_SCRIPT, "bash"]
        inner += list(argv)
        if self.mode == "pct":
            return [self._pct_binary(), "exec", str(self.vmid), "--"] + inner
        return inner

    def _pct_binary(self):
        found = shutil.which(self.pct_path) if os.sep not in self.pct_path else self.pct_path
        if not found or not os.access(found, os.X_OK):
            raise PctNotFound(
                "pct not found (looked for %r on PATH): run this against the Proxmox host, "
                "or set transport=local to run without a container" % self.pct_path
            )
        return found

    def run(self, argv, env=None, login_shell=False, cwd=None, stdin_data=None, timeout=None):
        """Run at the target; return (rc, stdout, stderr). Raises TransportError subclasses."""
        full = self.build_argv(argv, env=env, login_shell=login_shell, cwd=cwd)
        try:
            proc = subprocess.Popen(
                full,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Own session: no controlling terminal inside, and a timeout can kill the whole group.
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError as exc:
            if self.mode == "pct":
                raise PctNotFound("pct could not be executed (%s): is this the Proxmox host?" % exc)
            raise TransportError("could not execute %s: %s" % (full[0], exc))
        try:
            out, err = proc.communicate(stdin_data.encode() if isinstance(stdin_data, str) else stdin_data,
                                        timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise CommandTimeout("command did not finish within %ss in %s: %s" % (timeout, self.describe(), argv[0]))
        out = out.decode("utf-8", "replace")
        err = err.decode("utf-8", "replace")
        if self.mode == "pct" and proc.returncode != 0:
            self._raise_for_pct(proc.returncode, err)
        return proc.returncode, out, err

    def push(self, local_path, dest_path, timeout=None):
        """Copy one file of the managed host to dest_path at the target (``pct push``; locally a plain copy).

        Both paths must be absolute (so neither can be read as an option); dest's directory must exist.
        """
        for what, path in (("local path", local_path), ("destination", dest_path)):
            if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
                raise ValueError("%s must be an absolute path, got %r" % (what, path))
        if dest_path.endswith("/"):
            raise ValueError("destination must be a full file path, not a directory: %r" % dest_path)
        if not os.path.isfile(local_path):
            raise TransportError("cannot push %s: no such file on the managed host" % local_path)
        if self.mode == "local":
            tmp = "%s.push.%d" % (dest_path, os.getpid())
            try:
                shutil.copyfile(local_path, tmp)
                os.replace(tmp, dest_path)
            except OSError as exc:
                raise TransportError("could not copy %s to %s: %s" % (local_path, dest_path, exc))
            return
        argv = self.push_argv(local_path, dest_path)
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True, close_fds=True, timeout=timeout, check=False)
        except FileNotFoundError as exc:
            raise PctNotFound("pct could not be executed (%s): is this the Proxmox host?" % exc)
        except subprocess.TimeoutExpired:
            raise CommandTimeout("pct push of %s did not finish within %ss" % (local_path, timeout))
        err = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            self._raise_for_pct(proc.returncode, err)
            if "can only push files to a running CT" in err:
                raise ContainerNotRunning("container %s is not running: start it with `pct start %s`, then run "
                                          "this again" % (self.vmid, self.vmid))
            detail = (err.strip().splitlines() or ["no output"])[-1]
            raise TransportError("pct push %s to %s in %s failed (exit %s): %s"
                                 % (local_path, dest_path, self.describe(), proc.returncode, detail))

    def push_argv(self, local_path, dest_path):
        """``pct push <vmid> <file> <dest>``: every value its own argv element (pct mode only)."""
        if self.mode != "pct":
            raise ValueError("push_argv is for transport=pct")
        return [self._pct_binary(), "push", str(self.vmid), local_path, dest_path]

    def _raise_for_pct(self, rc, err):
        """pct's own refusals come before the command runs; map them to one-line errors."""
        vmid = self.vmid
        if "container '%s' not running!" % vmid in err:
            raise ContainerNotRunning(
                "container %s is not running: start it with `pct start %s`, then run this again" % (vmid, vmid)
            )
        if re.search(r"Configuration file '[^']*/%s\.conf' does not exist" % vmid, err):
            raise ContainerMissing(
                "container %s does not exist on this host: check vmid (pct list shows the containers)" % vmid
            )
        if "please run as root" in err:
            raise TransportError("pct refused: please run as root (set become: true for this play)")


def transport_argument_spec():
    """The options that say where a command runs; documented once in doc_fragments/transport.py."""
    return ArgumentSpec(
        argument_spec=dict(
            transport=dict(type="str", default="pct", choices=list(MODES)),
            vmid=dict(type="int"),
            pct_path=dict(type="str", default="pct"),
        ),
        required_if=[("transport", "pct", ("vmid",))],
    )


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
