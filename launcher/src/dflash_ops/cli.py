"""python -m dflash_ops: the job templates of awx/ from a shell, through ansible-runner (launcher/README.md).

  python -m dflash_ops restart slammed5 [--force] [--profile-interval S] [--split-fc-layers 0|1] [--check] [-i INVENTORY]
  python -m dflash_ops stop slammed5 | status slammed5 | stage [--verify full] [--force] | provision | install-trainer
  python -m dflash_ops launch "Restart training" --answers '{"run": "slammed5", "force": "no"}'

Each command is the job template of the same name with the survey answers AWX would send (strings for text and
multiple choice, numbers for integer questions). Exit 0: the job succeeded; 1: it failed (message + log tail);
2: bad input, nothing was run (answers refused here, an input the playbook refused, or the trainer's check).
"""
import argparse
import json
import os
import sys

from dflash_ops import launch, project as projects
from dflash_ops.errors import InputError

YES_NO = {True: "yes", False: "no"}


def _answers_restart(a):
    answers = {"run": a.run, "force": YES_NO[a.force]}
    if a.profile_interval is not None:
        answers["profile_interval"] = a.profile_interval
    if a.split_fc_layers is not None:
        answers["split_fc_layers"] = a.split_fc_layers
    return answers


def _answers_stage(a):
    return {"force": YES_NO[a.force], **({"verify": a.verify} if a.verify else {})}


def _answers_json(a):
    try:
        answers = json.loads(a.answers)
    except ValueError as e:
        raise InputError("--answers is not JSON (%s): give an object, e.g. '{\"run\": \"slammed5\"}'" % e)
    if not isinstance(answers, dict):
        raise InputError("--answers must be a JSON object of survey variables, e.g. '{\"run\": \"slammed5\"}'")
    return answers


def parser():
    p = argparse.ArgumentParser(prog="python -m dflash_ops", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", help="inventory path (default: ansible.cfg's, inventories/local)")
    common.add_argument("--project", help="the dflash.ops checkout (default: see launcher/README.md)")
    common.add_argument("--artifacts", help="ansible-runner's private data directory (default: a new temporary one)")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, template, answers, help_text):
        c = sub.add_parser(name, parents=[common], help=help_text)
        c.set_defaults(template=template, answers_of=answers)
        return c

    c = command("restart", "Restart training", _answers_restart, "restart a run (idempotent; proves it is alive)")
    c.add_argument("run")
    c.add_argument("--force", action="store_true", help="restart even when the same configuration is alive")
    c.add_argument("--profile-interval", type=int, help="DFLASH_PROFILE_INTERVAL for this launch (seconds)")
    c.add_argument("--split-fc-layers", choices=["0", "1"], help="DFLASH_SPLIT_FC_LAYERS for this launch")
    c.add_argument("--check", dest="template", action="store_const", const="Preview restart",
                   help="preview: what the restart would stop and launch (job template Preview restart: check mode "
                        "with diff), after the trainer's check; changes nothing")
    command("stop", "Stop training", lambda a: {"run": a.run}, "stop a run").add_argument("run")
    command("status", "Training status", lambda a: {"run": a.run}, "report on a run").add_argument("run")
    c = command("stage", "Stage weights", _answers_stage, "stage the target's weights into /dev/shm")
    c.add_argument("--verify", choices=["size", "full"])
    c.add_argument("--force", action="store_true", help="stage even while a run uses the served copy")
    command("provision", "Provision", lambda a: {}, "provision the training container")
    command("install-trainer", "Install trainer", lambda a: {}, "install the bundled trainer")
    c = command("launch", None, _answers_json, "any job template by name, with the survey answers as JSON")
    c.add_argument("template_name", metavar="TEMPLATE")
    c.add_argument("--answers", default="{}", help="JSON object: the survey's answers exactly as AWX passes them")
    return p


def main(argv=None, out=None):
    out = out or sys.stdout
    args = parser().parse_args(argv)
    try:
        project = projects.find_project(args.project)
        template = projects.template(project, args.template or args.template_name)
        inventory = None
        if args.inventory:
            inventory = os.path.abspath(args.inventory)
            if not os.path.exists(inventory):
                raise InputError("inventory %s does not exist; give -i an inventory file or directory" % inventory)
        data_dir = launch.prepare(project, template, args.answers_of(args), data_dir=args.artifacts)
    except InputError as e:
        print("dflash_ops: %s" % e, file=sys.stderr)
        return 2
    out.write("%s: %s (%s)\n" % (template.name, template.playbook, project))
    outcome = launch.run(project, template, data_dir, inventory=inventory, out=out)
    out.write("artifacts: %s\n" % outcome.artifacts)
    if not outcome.ok:
        for line in launch.failure_report(outcome):
            print("dflash_ops: " + line if not line.startswith(" ") else line, file=sys.stderr)
        return 2 if launch.bad_input(outcome) else 1
    return 0
