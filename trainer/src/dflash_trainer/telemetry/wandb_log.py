"""Weights & Biases logging of the run's metrics, profile and NVML figures, when configured.

On when --wandb-project is given or WANDB_PROJECT is set; off otherwise, and then `wandb` is never imported (it is
the optional extra dflash_trainer[wandb]). One process of a job logs (the single process, or the first drafter rank
under torchrun, which holds the metrics and reads every rank's profile from the job's store). The run goes under
<run-dir>/wandb; WANDB_MODE=offline keeps it there with no network (`wandb sync` uploads it later). The API key is
wandb's own business: it reads WANDB_API_KEY from the environment; the trainer never passes or logs it (it reads
it only to mask it out of the one line it logs from a wandb error).
An online run that W&B refuses or cannot reach (no network, a revoked key) falls back to an offline run in the
same place, with one log line: the run's weights are loaded by then, and a run the restart playbook saw alive must
not die minutes later for its metrics' sake (`wandb sync` uploads the offline run later).
One W&B run per training run: its id is kept in <run-dir>/wandb_run_id (RUN_ID_FILE) and every restart resumes it
(resume="allow"), so a run restarted ten times is one chart, continued at the step it resumed from; the run's name
(its directory's) is the W&B group. The offline fallback keeps the same id, so `wandb sync` joins the two.
"""

from __future__ import annotations

import numbers
import os
import secrets
import string

from dflash_trainer.config import StartupError, TrainConfig
from dflash_trainer.telemetry.heartbeat import write_text_atomic

RUN_ID_FILE = "wandb_run_id"


def wandb_project(cfg: TrainConfig) -> str | None:
    return cfg.wandb_project or os.environ.get("WANDB_PROJECT") or None


def check_available(cfg: TrainConfig) -> None:
    """At start: configured but not installed is a refusal (StartupError), before weights load."""
    if wandb_project(cfg) is None:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise StartupError("Weights & Biases is configured (--wandb-project or WANDB_PROJECT) but the wandb package "
                           "is not installed; pip install 'dflash_trainer[wandb]' or leave both unset") from None


def _numbers(prefix: str, row: dict) -> dict:
    """The numeric fields of a row (lists of numbers as one key per entry), under prefix/."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or key in ("time", "step", "rank", "gpu", "data_crc"):
            continue
        if isinstance(value, numbers.Number):
            out[f"{prefix}/{key}"] = value
        elif isinstance(value, dict):
            out.update(_numbers(f"{prefix}/{key}", value))
        elif isinstance(value, list) and all(isinstance(v, numbers.Number) for v in value):
            out.update({f"{prefix}/{key}/{i}": v for i, v in enumerate(value)})
    return out


def run_id(run_dir: str) -> str:
    """The W&B run id of this training run: the one kept in the run directory, or a new one kept there now."""
    path = os.path.join(run_dir, RUN_ID_FILE)
    try:
        with open(path) as f:
            kept = f.read().strip()
        if kept:
            return kept
    except FileNotFoundError:
        pass
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's id alphabet
    write_text_atomic(path, new + "\n")
    return new


def why(exc: Exception) -> str:
    """The first line of wandb's error, without the API key should it ever quote it."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    key = os.environ.get("WANDB_API_KEY")
    return line.replace(key, "***") if key else line


class WandbLog:
    """One wandb run; every log call is keyed by the optimizer step (wandb drops steps that go back, so a
    late row is logged at the newest step seen)."""

    def __init__(self, run):
        self.run = run
        self._step = 0

    @classmethod
    def open(cls, cfg: TrainConfig, say, layout=None) -> "WandbLog | None":
        """The run, or None when W&B is not configured; `say` writes a line to the run's log."""
        project = wandb_project(cfg)
        if project is None:
            return None
        import wandb
        # the trainer owns its W&B service: one inherited from a parent (WANDB_SERVICE, set by any process that used
        # wandb) is not stopped by teardown, so it kept the refused online run's id and refused the offline fallback
        # ("run ID … is in use")
        os.environ.pop(wandb.env.SERVICE, None)
        os.makedirs(cfg.run_dir, exist_ok=True)
        name = os.path.basename(os.path.normpath(cfg.run_dir))
        init = dict(project=project, dir=cfg.run_dir, name=name, group=name, id=run_id(cfg.run_dir), resume="allow",
                    config={**cfg.to_dict(), **({"world": layout} if layout else {})},
                    # train.log already holds stdout: no second copy, no wrapped streams in the trainer
                    settings=wandb.Settings(console="off"))
        try:
            return cls(wandb.init(**init))
        # CommError: unreachable (after its init_timeout) or refused; other errors of the service too (its answer to
        # the kept id's resume query came as a ServerResponseError, not a wandb.errors.Error, in one run)
        except Exception as exc:  # noqa: BLE001 - any online failure falls back; the run must not die for it
            say(f"W&B: online run refused or unreachable ({why(exc)}); logging offline under "
                f"{os.path.join(cfg.run_dir, 'wandb')} instead (`wandb sync` uploads it later)")
            wandb.teardown()  # the refused run's service and settings go, so the offline run starts clean
            return cls(wandb.init(**init, mode="offline"))

    def log(self, step: int, values: dict) -> None:
        if not values:
            return
        self._step = max(self._step, int(step))
        self.run.log(values, step=self._step)

    def metrics(self, row: dict) -> None:
        self.log(row["step"], _numbers("train", row))

    def profile(self, row: dict, step: int | None = None) -> None:
        prefix = f"profile/rank{row['rank']}" if "rank" in row else "profile"
        self.log(row.get("step", 0) if step is None else step, _numbers(prefix, row))

    def gpus(self, step: int, latest: dict) -> None:
        self.log(step, {k: v for gpu, row in sorted(latest.items()) for k, v in _numbers(f"gpu/{gpu}", row).items()})

    def event(self, step: int, name: str, reason: str) -> None:
        """A restart (or other event) at `step`: events/<name> = 1 and its reason as text in the run."""
        self.log(step, {f"events/{name}": 1, f"events/{name}_reason": reason})

    def close(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def log_export_artifact(run_dir: str, export_dir: str, checkpoint: str, say) -> str:
    """dflash-export --wandb-artifact RUN_DIR: the export dir as a `model` artifact of the training run's one W&B run
    (its id kept in RUN_DIR, resumed; WANDB_PROJECT names the project, WANDB_MODE=offline keeps it local). Returns
    the artifact's name. Best after training ends: an online run takes one writer at a time."""
    project = os.environ.get("WANDB_PROJECT")
    if not project:
        raise ValueError("--wandb-artifact needs WANDB_PROJECT (the project the training run logs to); set it")
    if not os.path.isfile(os.path.join(run_dir, RUN_ID_FILE)):
        raise ValueError(f"{run_dir} has no {RUN_ID_FILE}: it is not the run directory of a run logged to W&B; "
                         "pass the run's --run-dir")
    import wandb
    name = os.path.basename(os.path.normpath(run_dir))
    run = wandb.init(project=project, dir=run_dir, name=name, group=name, id=run_id(run_dir), resume="allow",
                     settings=wandb.Settings(console="off"))
    try:
        artifact = wandb.Artifact(f"{name}-drafter", type="model", metadata={"checkpoint": checkpoint})
        artifact.add_dir(export_dir)
        run.log_artifact(artifact)
    finally:
        run.finish()
    say(f"W&B: logged {export_dir} as artifact {name}-drafter of run {run_id(run_dir)}")
    return f"{name}-drafter"
