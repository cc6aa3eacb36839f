"""The trainer role (its defaults against trainer_install's argument spec: test_role_defaults.py): the trainer's
pins are chosen in one place (trainer/requirements.txt) and the test environment and the harness follow them; the
training role expects the version trainer/pyproject.toml declares."""
import os
import re
import sys

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load(*parts):
    with open(os.path.join(*parts)) as f:
        return yaml.safe_load(f)


def _requirement_lines(path):
    with open(path) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def test_the_trainer_pins_are_chosen_once_and_followed():
    pins = _requirement_lines(os.path.join(REPO, "trainer", "requirements.txt"))
    assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+]+", pin) for pin in pins), pins
    dev = set(_requirement_lines(os.path.join(REPO, "tests", "requirements.txt")))
    assert set(pins) <= dev, "tests/requirements.txt must pin the trainer's dependencies as trainer/requirements.txt"
    sys.path.insert(0, os.path.join(REPO, "tests"))
    try:
        from harness import golden
    finally:
        sys.path.pop(0)
    assert golden.HEAVY_REQUIREMENTS == pins, "the harness golden venv must hold the trainer's pins"


def test_the_training_role_expects_the_bundled_trainer_version():
    with open(os.path.join(REPO, "trainer", "pyproject.toml")) as f:
        version = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    training = load(REPO, "roles", "training", "defaults", "main.yml")
    spec = load(REPO, "roles", "training", "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert training["training_expect_trainer_version"] == version
    assert spec["training_expect_trainer_version"]["default"] == version
