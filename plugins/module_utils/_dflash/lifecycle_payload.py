# -*- coding: utf-8 -*-
# Copyright: dflash.ops contributors
# Apache License 2.0
"""Ship the lifecycle code into the container and run it: one transport call, JSON in and out.

argv is a constant (``python3 -c BOOTSTRAP``); the lifecycle sources and the request (secrets included)
travel on stdin, so nothing the user typed and no secret is ever in an argument vector.
"""

from __future__ import annotations

import inspect
import json

from ansible_collections.dflash.ops.plugins.module_utils._dflash import gpu_release, procfs, run_lifecycle
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport import TransportError

# Executes the shipped sources in one namespace, in order, then calls main(request).
BOOTSTRAP = (
    "import json,sys\n"
    "d=json.load(sys.stdin)\n"
    "g={'__name__':'dflash_lifecycle','__builtins__':__builtins__}\n"
    "for n,s in d['sources']:exec(compile(s,n,'exec'),g)\n"
    "g['main'](d['request'])\n"
)

_SOURCES = None


def sources():
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = [(m.__name__.rsplit(".", 1)[-1] + ".py", inspect.getsource(m))
                    for m in (procfs, gpu_release, run_lifecycle)]
    return _SOURCES


def run_lifecycle_remote(transport, request, python="python3", timeout=None):
    """Run the lifecycle at the transport's target; return its result dict."""
    stdin = json.dumps({"sources": sources(), "request": request})
    rc, out, err = transport.run([python, "-c", BOOTSTRAP], stdin_data=stdin, timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        detail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        if rc in (126, 127):
            raise TransportError("%s not found in %s: install python3 there (or set python=)"
                                 % (python, transport.describe()))
        raise TransportError("the lifecycle script failed in %s (exit %s): %s" % (transport.describe(), rc, detail))
    return json.loads(lines[-1])
