"""trainer_install's request: every input rule refuses in one line naming the fix, before any transport call; a valid
request carries the offline/online choice and the staging directory."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import trainer_install_backend as backend

WHEEL = "/var/tmp/dflash-ops/trainer/dflash_trainer-0.1.0-py3-none-any.whl"


def params(**extra):
    p = backend.argument_spec().defaults()
    p.update(transport="pct", vmid=200, wheel=WHEEL, wheel_sha256="a" * 64, source_hash="b" * 64, version="0.1.0",
             pins=["torch==2.13.0", "nvidia-ml-py==13.615.71"])
    p.update(extra)
    return p


def test_a_valid_request():
    req = backend.build_request(params(container_wheelhouse="/opt/dflash/wheels"))
    assert req["key"] == "b" * 16 and req["wheel_name"] == WHEEL.rsplit("/", 1)[1] and req["no_index"] is True
    assert req["find_links"] == ["/opt/dflash/venvs/.staging-" + "b" * 16, "/opt/dflash/wheels"]
    online = backend.build_request(params(index_url="https://download.pytorch.org/whl/cu128"))
    assert online["no_index"] is False and online["index_url"].endswith("/cu128")


@pytest.mark.parametrize("extra,message", [
    ({"pins": ["--index-url=http://evil/"]}, "pin '--index-url=http://evil/' is not a requirement"),
    ({"pins": ["-r /etc/passwd"]}, "is not a requirement such as torch==2.13.0 (pip options are not accepted)"),
    ({"pins": ["torch==2.13.0; rm -rf /"]}, "is not a requirement"),
    ({"pins": ["torch"]}, "is not a requirement"),
    ({"keep": 0}, "keep must be at least 1"),
    ({"link": "/opt/dflash/venvs/current"}, "must not contain one another: put them side by side"),
    ({"venvs_root": "/opt/dflash/venv/envs"}, "must not contain one another"),
    ({"link": "relative/venv"}, "link must be an absolute path"),
    ({"venvs_root": "/opt/x\0y"}, "venvs_root must be an absolute path"),
    ({"version": "9.9.9"}, "version '9.9.9' does not match the wheel"),
    ({"wheel_sha256": "xyz"}, "wheel_sha256 must be a sha256 hex digest"),
    ({"wheel_sha256": "a" * 32}, "wheel_sha256 must be 64 hex digits"),
    ({"source_hash": "../../etc"}, "source_hash must be a hex digest"),
    ({"wheel": "/tmp/not-a-wheel.tar.gz"}, "wheel must be a wheel file"),
    ({"wheel": "dflash_trainer-0.1.0-py3-none-any.whl"}, "wheel must be an absolute path"),
    ({"index_url": "ftp://mirror/simple"}, "index_url must start with https://, http:// or file:///"),
    ({"container_wheelhouse": "wheels"}, "container_wheelhouse must be an absolute path"),
])
def test_bad_input_is_refused_in_one_line(extra, message):
    with pytest.raises(ValueError) as exc:
        backend.build_request(params(**extra))
    assert message in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
