"""A Proxmox VE API stand-in for tests: HTTPS on 127.0.0.1, docs/proxmox.md's subset, real LXC containers behind it.

    python -m harness.pve_api start <state_dir> [--node pve1] [--vm 150]… [--pve-version 8.2.4] [--gpus 8]
                                                [--next-id 300]      # (from tests/) background server
    python -m harness.pve_api stop <state_dir>     # stop it by pid, destroy every container it created

`start` writes `<state_dir>/pve_api.json`:
    {"url", "host", "port", "ca_cert", "node", "root_password", "token_id", "token_secret", "pve_dir", "dev_root",
     "pid"}
`pve_dir` is the stand-in's /etc/pve (`<pve_dir>/nodes/<node>/lxc/<vmid>.conf`, `<pve_dir>/lxc` links there);
`dev_root` holds the stand-in GPU character devices (`/dev/nvidia0` in a devN entry means `<dev_root>/nvidia0`).
See tests/harness/README.md.
"""
STATE_FILE = "pve_api.json"
