"""Two containers as two nodes of one torchrun job: a network the test makes for itself, and a shared directory.

The network: a network namespace of its own (`unshare --net`, held by one `sleep` the test started and kills by
pid), its loopback up; both containers join it (lxc.namespace.share.net = the holder's pid) instead of getting one
each. Node 0 is 127.0.0.1 and node 1 127.0.0.2 (both on that namespace's loopback, so no address is added
anywhere); the host's own namespace is never used, and nothing in it changes. A shared directory (checkpoints
every rank reads at resume) is a host directory the test made, bind-mounted at /workspace/shared in both.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import lxc

SHARED_CT = "/workspace/shared"


class PrivateNetwork:
    """A network namespace for the test's containers; stop() kills its holder (by pid) and it is gone."""

    def __init__(self):
        self.holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec sleep 86400"],
                                       stdin=subprocess.DEVNULL)
        self.pid = self.holder.pid

    def ready(self) -> bool:
        """The holder runs in a namespace other than ours, its loopback up."""
        if self.holder.poll() is not None:
            raise RuntimeError(f"the network namespace holder exited ({self.holder.returncode})")
        ours = Path("/proc/self/ns/net").resolve()
        theirs = Path(f"/proc/{self.pid}/ns/net").resolve()
        if ours == theirs:
            return False
        p = subprocess.run(["nsenter", "-t", str(self.pid), "-n", "ip", "-o", "link", "show", "lo"],
                           capture_output=True, text=True)
        return p.returncode == 0 and "UP" in p.stdout.split(">")[0]

    def stop(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(timeout=10)


def join(name: str, network: PrivateNetwork, shared: Path) -> None:
    """Make the (stopped) clone `name` join `network` and mount `shared` at /workspace/shared. Its own
    `lxc.net.0.type = empty` line goes (it would give it a namespace of its own); never `none`."""
    conf = lxc.LXC_PATH / name / "config"
    text = re.sub(r"(?m)^lxc\.net\.0\.type\s*=.*\n?", "", conf.read_text())
    assert "lxc.net.0.type = none" not in text
    text += (f"\n# dflash harness: a node of a job over nodes\nlxc.namespace.share.net = {network.pid}\n"
             f"lxc.mount.entry = {shared} {SHARED_CT.lstrip('/')} none bind,create=dir 0 0\n")
    conf.write_text(text)
