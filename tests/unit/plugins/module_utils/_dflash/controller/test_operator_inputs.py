"""The operator's inputs, checked where they enter (action dflash.ops.training_inputs): one line naming the variable
as written, what is wrong and a valid example (issue 30)."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.operator_inputs import (
    InputError, check, gpu_list)

RUNS = {"demo": {}, "slammed5": {"trainer_args": {"lr": 3e-4}}}


def refused(**variables):
    base = {"run": "demo", "dflash_runs": RUNS}
    base.update(variables)
    with pytest.raises(InputError) as exc:
        check(base)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("value,gpus", [([0, 1], [0, 1]), ("0,1,2", [0, 1, 2]), ("", []), (None, []), (3, [3]),
                                        (["4", 5], [4, 5]), (" 0, 1 ", [0, 1])])
def test_gpu_lists_as_operators_write_them(value, gpus):
    assert gpu_list(value) == gpus


@pytest.mark.parametrize("value,shown", [("0,x", '"0,x": "x"'), ([0, "x"], '[0, "x"]: "x"'), ([0, 1.5], "1.5"),
                                         ([True], "true"), ({"a": 1}, '{"a": 1}, not a GPU list')])
def test_a_bad_gpu_list_names_the_variable_the_value_and_an_example(value, shown):
    msg = refused(dflash_target_gpus=value)
    assert msg.startswith("dflash_target_gpus is ") and shown in msg, msg
    assert msg.endswith("e.g. dflash_target_gpus=0,1,2 or dflash_target_gpus: [0, 1, 2]"), msg


def test_a_gpu_listed_twice_and_a_negative_index():
    assert "a GPU is listed twice" in refused(dflash_drafter_gpus="5,5")
    assert refused(dflash_drafter_gpus=[-1]).startswith("dflash_drafter_gpus is [-1]: GPU indexes start at 0")


@pytest.mark.parametrize("name", ["dflash_stop_timeout", "dflash_gpu_release_timeout", "dflash_heartbeat_timeout",
                                  "dflash_phase_timeout"])
@pytest.mark.parametrize("value", ["soon", -1, True, [60]])
def test_timeouts_are_seconds(name, value):
    msg = refused(**{name: value})
    assert msg.startswith(name + " is ") and msg.endswith("give seconds, e.g. -e %s=600" % name), msg


def test_valid_inputs_pass_and_name_the_run():
    assert check({"run": "slammed5", "dflash_runs": RUNS, "force": "yes", "dflash_target_gpus": "0,1",
                  "dflash_drafter_gpus": [2], "dflash_stop_timeout": "600", "dflash_keep_records": 20,
                  "dflash_run_defaults": {"trainer_args": {"block_size": 16, "snapshot_minutes": [2, 5]},
                                          "env": {"DFLASH_PROFILE_INTERVAL": "60"}}}) == "slammed5"


def test_booleans():
    assert refused(force="maybe") == 'force is "maybe"; give true or false, e.g. -e force=true'


@pytest.mark.parametrize("run,msg", [
    ("", "no run given: add -e run=NAME (declared runs: demo, slammed5)"),
    ("a b", 'invalid run name "a b" (run): use 1-64 letters, digits, . _ or -, e.g. -e run=slammed5'),
    ("nosuch", "undeclared run nosuch: declared runs are demo, slammed5 (dflash_runs); fix the name, or add the run "
               "to dflash_runs in the inventory"),
])
def test_the_run_name(run, msg):
    assert refused(run=run) == msg


@pytest.mark.parametrize("runs,msg", [
    ({"demo": {"trainer_args": {"lr": {"x": 1}}}},
     'dflash_runs.demo.trainer_args.lr is {"x": 1}; a trainer flag takes a string, number, true/false or a list of '
     "those, e.g. lr: 16"),
    ({"demo": {"trainer_args": {"snapshot_minutes": [{"a": 2}]}}}, "dflash_runs.demo.trainer_args.snapshot_minutes"),
    ({"demo": {"trainer_args": ["lr=1"]}}, 'dflash_runs.demo.trainer_args is ["lr=1"]; give a mapping'),
    ({"demo": {"trainer_args": {"bad flag": 1}}}, 'dflash_runs.demo.trainer_args has the key "bad flag"'),
    ({"demo": {"env": {"X": [1]}}}, 'dflash_runs.demo.env.X is [1]; give the variable\'s text'),
    ({"demo": {"gpus": "0,y"}}, 'dflash_runs.demo.gpus is "0,y": "y" is not a GPU index'),
    ({"demo": {"nproc_per_node": 0}}, "dflash_runs.demo.nproc_per_node is 0; it must be 1 or more"),
    ({"demo": "fast"}, 'dflash_runs.demo is "fast"; give a mapping'),
])
def test_a_run_configuration_of_a_wrong_type_names_its_path(runs, msg):
    assert refused(dflash_runs=runs).startswith(msg)


def test_the_role_used_directly_names_its_own_variables():
    with pytest.raises(InputError, match="^undeclared run x: declared runs are a \\(training_runs\\)"):
        check({"training_run_name": "x", "training_runs": {"a": {}}})


def test_a_templated_run_name_is_refused_as_a_template_before_templating():
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.operator_inputs import (
        InputError, refuse_templated_run)
    refuse_templated_run("slammed5")  # a plain name passes, and no name at all (check() says so)
    refuse_templated_run(None)
    with pytest.raises(InputError) as e:
        refuse_templated_run("{{ lookup('pipe', 'id') }}")
    assert str(e.value).startswith("run \"{{ lookup('pipe', 'id') }}\" is a template: Ansible templates -e "
                                   "values")
    assert "python -m dflash_ops restart NAME" in str(e.value)
