"""The training loop, one for one process (train.run) and for torchrun's drafter ranks (dist_ranks.run_drafter):
drafter_loop.py (the loop), plan.py (which rows each step trains on), sources.py (where micro-batches come
from), reducers.py (how gradients and host values are reduced and agreed), train_state.py (what a checkpoint
saves and a resume restores), bookkeeping.py (metrics, checkpoints, snapshots), progress.py (profile, progress)."""
