"""Issue 29, "one rule, asked of its owner": the collection holds no copy of a trainer rule. Where it needs one (the
torchrun world layout of a process count, where checkpoints go and how many are kept, the run directory) it asks the
installed trainer (`dflash-train --check`, container/trainer_check.py). A second implementation would have to name
the trainer's flags to read them out of trainer_args or argv: so no Python source of the collection's plugins may
hold a string that is a trainer flag's name (target_gpus, --keep-checkpoints, output-dir, ...), and no constant
may restate a trainer default. The trainer's flags are read from its own declarations (config.TrainConfig), so a
flag added there is covered here."""
import ast
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER_SRC = os.path.join(ROOT, "trainer", "src")  # the trainer ships as source beside the plugins
PLUGINS = os.path.join(ROOT, "plugins")
# Strings that are a trainer flag's name but hold no rule of it, each with its reason.
ALLOWED_EVERYWHERE = {
    "--check",   # the check itself (not a training setting: test_the_check_flag_is_not_a_trainer_setting)
    "run_dir",   # training_run's own option and the lifecycle's request key (the trainer's is --run-dir, checked)
}
ALLOWED_IN = {
    # the reader of the trainer's answer: the keys of its report (settings, layout rows)
    "trainer_check.py": {"device"},
    "run_space.py": {"keep_checkpoints"},
    # which staged copy a live run reads: the value its launch.json argv gives, no default or rule of the flag
    "weights_guards.py": {"--target-model"},
}


def trainer_flag_names():
    # The trainer's declarations, from its source (stdlib only): also where only the collection is installed.
    sys.path.insert(0, TRAINER_SRC)
    try:
        from dflash_trainer.config.train_config import flag_fields
        fields = flag_fields()
    finally:
        sys.path.remove(TRAINER_SRC)
    names = set()
    for f in fields:
        dashed = f.name.replace("_", "-")
        names.update([f.name, dashed, "--" + dashed])
    return names, fields


def strings_of(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_plugin_source_names_a_trainer_flag():
    names, _fields = trainer_flag_names()
    found = []
    for top, _dirs, files in os.walk(PLUGINS):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(top, name)
                for line, text in strings_of(path):
                    flag = text.split("=", 1)[0] if text.startswith("--") else text
                    allowed = ALLOWED_EVERYWHERE | ALLOWED_IN.get(name, set())
                    if flag in names and flag not in allowed:
                        found.append("%s:%d %r" % (os.path.relpath(path, ROOT), line, text))
    assert not found, "a trainer rule re-implemented in the collection (ask the trainer's --check): %s" % found


def test_the_check_flag_is_not_a_trainer_setting():
    names, _fields = trainer_flag_names()
    assert "--check" not in names and "check" not in names


def test_the_layout_and_keep_rules_live_only_in_the_trainer():
    """The names the two copies had (controller/run_config.world_layout, container/run_space.DEFAULT_KEEP)."""
    functions, constants = [], []
    for top, _dirs, files in os.walk(PLUGINS):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(top, name)
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                functions += [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
                constants += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                              if isinstance(t, ast.Name) and t.id.isupper()]
    # collection_layout only converts the trainer's answer into launch.json's rows
    assert [f for f in functions if "layout" in f and f != "collection_layout"] == []
    assert [c for c in constants if "KEEP" in c or "LAYOUT" in c] == []


def test_the_trainer_declares_the_rules_the_collection_asks_for():
    _names, fields = trainer_flag_names()
    by_name = dict((f.name, f) for f in fields)
    assert by_name["keep_checkpoints"].default is not dataclasses.MISSING
    for name in ("target_gpus", "drafter_gpus", "target_gpus_per_rank", "target_ranks", "run_dir", "output_dir"):
        assert name in by_name
