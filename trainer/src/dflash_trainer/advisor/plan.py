"""dflash-train --plan ARGS...: with the run's own flags, measure on one device of this host (measure.py) and print,
for the run's GPU set, each stage's seconds per sequence, the predicted rate of the configured target:drafter split
and of the best one, which stage bounds each (predict.py), and the deepest hidden-state queue the host's memory
holds; plan.json in the run dir keeps it, and training_status shows its warning (predict.verdict) when the
configured split is predicted >= 15 % below the best. Runs nothing else: no run dir state but plan.json changes.
Exit 0, or 2 with one line when the flags or inputs are refused."""

from __future__ import annotations

import json
import os
import sys
import time

PLAN_NAME = "plan.json"


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str]) -> int:
    from dflash_trainer import cli
    from dflash_trainer.config import StartupError, validate_paths
    try:
        cfg = cli.config_from_args(argv)
        validate_paths(cfg)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except ValueError as e:  # StartupError, a bad flag: one line
        print(f"{cli.PROG}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    try:
        plan = make_plan(cfg)
    except StartupError as e:
        print(f"{cli.PROG}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    report(plan)
    os.makedirs(cfg.run_dir, exist_ok=True)
    from dflash_trainer.telemetry.heartbeat import write_json_atomic
    write_json_atomic(os.path.join(cfg.run_dir, PLAN_NAME), plan, indent=2)
    log(f"plan: written to {os.path.join(cfg.run_dir, PLAN_NAME)}")
    return 0


def make_plan(cfg) -> dict:
    import torch
    from dflash_trainer.advisor import measure, predict
    from dflash_trainer.distributed.hs_queue import batch_tap_bytes, mem_available
    from dflash_trainer.loop.train import drafter_config_for, target_kernels_line
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    gpus = sorted(set(cfg.target_gpus + cfg.drafter_gpus)) if cuda else []
    device = torch.device(f"cuda:{gpus[0]}" if gpus else ("cuda" if cuda else "cpu"))
    target_config, layer_ids, drafter_cfg = drafter_config_for(cfg)
    kernels = target_kernels_line(cfg, target_config, device)
    log(f"plan: measuring on {device} ({torch.cuda.get_device_name(device) if cuda else 'CPU'}); target kernels: "
        f"{kernels}")
    t0 = time.time()
    with torch.random.fork_rng(devices=[]):
        target_s, target = measure.target_seconds(cfg, device, log)
    drafter_s = measure.drafter_seconds(cfg, drafter_cfg, len(layer_ids), target, device, log)
    del target
    per_rank = gpus_per_target_rank(cfg, cuda)
    s_t, s_d = target_s["s_per_seq"], drafter_s["s_per_seq"]
    shared = bool(set(cfg.target_gpus) & set(cfg.drafter_gpus))
    n_t, n_d = len(cfg.target_gpus), len(cfg.drafter_gpus)
    if not gpus:  # the CPU: one process runs both stages in turn
        configured = predict.shared_rate(1, s_t, s_d)
    elif shared:
        configured = predict.shared_rate(len(set(cfg.target_gpus)), s_t, s_d)
    else:
        configured = predict.split_rate(n_t, n_d, s_t, s_d, per_rank)
    options = predict.splits(len(gpus), s_t, s_d, per_rank) if len(gpus) > 1 else []
    if len(gpus) <= 1:
        options = [predict.shared_rate(1, s_t, s_d)]
    best = max(options + [configured], key=lambda o: o["seq_per_s"])
    hidden = drafter_cfg.hidden_size
    batch_bytes = batch_tap_bytes(cfg.token_budget, cfg.num_target_taps, hidden, cfg.use_soft_labels, cuda)
    available = mem_available()
    return {"created_at": time.time(), "measured_s": round(time.time() - t0, 1), "device": str(device),
            "target_kernels": kernels, "seq_len": cfg.max_seq_len, "gpus": gpus, "gpus_per_target_rank": per_rank,
            "target": target_s, "drafter": drafter_s, "configured": configured, "best": best, "splits": options,
            "warning": predict.verdict(configured, best),
            "queue": {"batch_bytes": batch_bytes, "available_bytes": available, "configured_depth":
                      cfg.hs_queue_depth, "deepest": predict.deepest_queue(available, batch_bytes, n_d)}}


def gpus_per_target_rank(cfg, cuda: bool) -> int:
    """The ranks' own rule (distributed/world.py: --target-gpus-per-rank, else measured from the free memory)."""
    if cfg.target_gpus_per_rank:
        return cfg.target_gpus_per_rank
    if not cuda:
        return 1
    from dflash_trainer.distributed import world
    return world.gpus_per_target_rank(cfg, cuda)[0]


def report(plan: dict) -> None:
    t, d = plan["target"], plan["drafter"]
    kinds = ", ".join(f"{n} {kind} x {t['per_kind'][kind]['ms_per_layer']:.2f} ms"
                      for kind, n in t["layers_per_kind"].items())
    log(f"target stage: {t['s_per_seq']:.3f} s per sequence of {plan['seq_len']} tokens ({kinds}, + "
        f"{t['rest_ms']:.1f} ms; {t['compiled']}; the device busy: forward {t['forward_ms_busy']:.1f} ms against "
        f"{t['forward_ms_alone']:.1f} alone)")
    log(f"drafter stage: {d['s_per_seq']:.3f} s per sequence ({d['sequences_per_micro_batch']} per micro-batch: "
        f"{d['micro_batch_s']:.3f} s busy, {d['micro_batch_s_alone']:.3f} alone, + optimizer {d['optimizer_s']:.3f} "
        f"s per step)")
    log("| target GPUs | drafter GPUs | target seq/s | drafter seq/s | predicted seq/s | bound by |")
    for o in plan["splits"] + ([plan["configured"]] if plan["configured"] not in plan["splits"] else []):
        mark = " (configured)" if o == plan["configured"] else ""
        mark += " (best)" if o == plan["best"] else ""
        log(f"| {o['target_gpus']}{' shared' if o.get('shared') else ''} | {o['drafter_gpus']} | "
            f"{o['target_seq_per_s']:.2f} | {o['drafter_seq_per_s']:.2f} | {o['seq_per_s']:.2f}{mark} | "
            f"{o['bound_by']} |")
    q = plan["queue"]
    log(f"hidden-state queue: {q['batch_bytes'] / 1e9:.2f} GB per micro-batch; {q['available_bytes'] / 1e9:.0f} GB "
        f"available holds depth {q['deepest']} per drafter rank (configured {q['configured_depth']})")
    log(f"verdict: {plan['warning'] or 'the configured split is within 15 % of the best'}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else 2)
