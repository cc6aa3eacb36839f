"""The trainer's speed benchmarks, run from `trainer/` as modules of this package, e.g.

    python -m benchmarks.train_step --preset tiny-cpu
    python -m benchmarks.target_forward --preset qwen3-8b --out $OUT/target-forward.json

(the trainer importable: installed, as `scripts/setup` does, or `trainer/src` on PYTHONPATH). Their recorded
results are in `trainer/results/` (its README indexes them)."""
