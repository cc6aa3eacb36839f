"""dflash-train --plan (issue 31): the layout advisor. measure.py times, on one GPU, a few of the real target's
layers of each kind and one drafter micro-batch at the run's shapes; predict.py turns the seconds per sequence into
each target:drafter split's rate on the run's GPUs and the verdict on the configured one; plan.py prints it and
writes plan.json into the run dir, where training_status reads the verdict."""
