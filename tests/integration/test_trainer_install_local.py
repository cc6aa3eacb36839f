"""trainer_wheel and trainer_install through ansible-runner, local transport (the pct path: tests/containers):
the checkout's trainer/ built into a cache (check mode builds nothing), a tiny wheel installed four ways (check,
real, check re-run, real re-run), diff, refusals before anything changes, and the documented return keys."""
import os
import zipfile

import pytest
import yaml

from ansible_collections.dflash.ops.plugins.modules import trainer_install, trainer_wheel

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# warnings: the helper passes the module's args as one template (Ansible warns about that, not about the module)
IGNORED = {"changed", "invocation", "diff", "msg", "failed", "_ansible_no_log", "warnings"}


def tiny_wheel(directory, version="0.1.0"):
    """A dflash_trainer wheel without dependencies whose dflash-train --help prints a usage line."""
    info = "dflash_trainer-%s.dist-info" % version
    files = {"dflash_trainer/__init__.py": "",
             "dflash_trainer/cli.py": "def main():\n    print('usage: dflash-train')\n",
             info + "/METADATA": "Metadata-Version: 2.1\nName: dflash_trainer\nVersion: %s\n" % version,
             info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             info + "/entry_points.txt": "[console_scripts]\ndflash-train = dflash_trainer.cli:main\n"}
    path = os.path.join(str(directory), "dflash_trainer-%s-py3-none-any.whl" % version)
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
        z.writestr(info + "/RECORD", "".join("%s,,\n" % a for a in files) + info + "/RECORD,,\n")
    return path


def sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def install_args(tmp_path, wheel, **extra):
    return dict({"transport": "local", "wheel": wheel, "wheel_sha256": sha256(wheel), "source_hash": "ab" * 32,
                 "version": "0.1.0", "pins": [], "container_wheelhouse": str(tmp_path / "empty-wheelhouse"),
                 "venvs_root": str(tmp_path / "opt" / "venvs"), "link": str(tmp_path / "opt" / "venv")}, **extra)


def check_keys(module, results):
    doc = yaml.safe_load(module.RETURN)
    always = {k for k, v in doc.items() if v["returned"] == "always"}
    for res in results:
        keys = set(res) - IGNORED
        assert keys <= set(doc), "undocumented keys %s" % sorted(keys - set(doc))
        assert always <= keys, "missing keys documented as always returned: %s" % sorted(always - keys)


def test_trainer_wheel_check_build_and_cached(ansible, tmp_path):
    args = {"source": os.path.join(ROOT, "trainer"), "dest": str(tmp_path / "cache")}
    ok, planned = ansible.module("dflash.ops.trainer_wheel", args, check=True)
    assert ok and planned["changed"] and planned["wheel"] is None and not (tmp_path / "cache").exists(), planned
    ok, built = ansible.module("dflash.ops.trainer_wheel", args)
    assert ok and built["changed"] and os.path.isfile(built["wheel"]) and built["sha256"] == planned["sha256"]
    ok, again = ansible.module("dflash.ops.trainer_wheel", args)
    assert ok and not again["changed"] and again["wheel"] == built["wheel"]
    check_keys(trainer_wheel, [planned, built, again])


def test_trainer_install_four_ways_with_diff(ansible, tmp_path):
    (tmp_path / "empty-wheelhouse").mkdir()
    args = install_args(tmp_path, tiny_wheel(tmp_path))
    link = tmp_path / "opt" / "venv"
    ok, check = ansible.module("dflash.ops.trainer_install", args, check=True, diff=True)
    assert ok and check["changed"] and not check["installed"] and not os.path.lexists(str(link)), check
    assert check["diff"]["before"]["link"] is None and check["diff"]["after"]["link"] == check["venv"]
    ok, real = ansible.module("dflash.ops.trainer_install", args)
    assert ok and real["changed"] and real["installed"] and os.readlink(str(link)) == real["venv"], real
    assert os.path.exists(os.path.join(real["venv"], "dflash-install.json")) and real["pushed"] == 1
    ok, recheck = ansible.module("dflash.ops.trainer_install", args, check=True)
    assert ok and recheck["changed"] is False and recheck["up_to_date"], recheck
    ok, rerun = ansible.module("dflash.ops.trainer_install", args)
    assert ok and rerun["changed"] is False and rerun["up_to_date"], rerun
    check_keys(trainer_install, [check, real, recheck, rerun])


@pytest.mark.parametrize("extra,message", [  # every rule: tests/unit/.../controller/test_trainer_install_backend.py
    ({"pins": ["--index-url=http://evil/"]}, "is not a requirement such as torch==2.13.0"),
    ({"index_url": "https://mirror/simple"}, "mutually exclusive: index_url|container_wheelhouse"),
])
def test_bad_input_is_refused_in_one_line_before_anything_changes(ansible, tmp_path, extra, message):
    args = install_args(tmp_path, tiny_wheel(tmp_path))
    extra = dict((k, v.replace("VENVS", args["venvs_root"]) if isinstance(v, str) else v) for k, v in extra.items())
    args.update(extra)
    args = dict((k, v) for k, v in args.items() if v is not None)
    ok, res = ansible.module("dflash.ops.trainer_install", args)
    assert not ok and message in res["msg"] and "\n" not in res["msg"], res
    assert not (tmp_path / "opt").exists()
