"""The live processes of local runs: every process the lifecycle starts carries its run directory in DFLASH_RUN_DIR
(inherited by every rank), which is how the local tests find a job's processes, and what their teardowns kill."""
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs


def job_processes(run_dirs):
    """pids of the live processes whose DFLASH_RUN_DIR is one of run_dirs."""
    return {pid for pid in procfs.all_pids()
            if (procfs.environ(pid) or {}).get("DFLASH_RUN_DIR") in run_dirs and procfs.is_alive(pid)}
