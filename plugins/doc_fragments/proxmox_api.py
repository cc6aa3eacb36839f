# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment(object):
    # The Proxmox API connection: proxmox_api_argument_spec() in module_utils/_dflash/proxmox/api.py.
    DOCUMENTATION = r"""
options:
  api_host:
    description:
      - Host name or address of a Proxmox VE node's API (C(https://<api_host>:<api_port>/api2/json)).
      - From the environment variable E(PROXMOX_HOST) when not set.
    type: str
    required: true
  api_port:
    description: Port of the API.
    type: int
    default: 8006
  api_user:
    description:
      - User to log in as with O(api_password), V(root@pam) when neither this nor a token gives one.
      - With O(api_token_id) of the form C(TOKENID) (no C(!)), the token's user.
      - From E(PROXMOX_USER) when not set.
    type: str
  api_password:
    description:
      - Password of O(api_user) (a ticket is requested with it). Never logged.
      - From E(PROXMOX_PASSWORD) when not set. One of O(api_password) and O(api_token_id) is needed; the token is used
        when both are set.
    type: str
  api_token_id:
    description:
      - API token id, C(USER@REALM!TOKENID) (or C(TOKENID) with O(api_user)). From E(PROXMOX_TOKEN_ID) when not set.
      - A token's caller is C(USER@REALM!TOKENID), never C(root@pam) itself, so a token cannot set C(devN) or bind
        mounts (PVE allows those only to C(root@pam)).
    type: str
  api_token_secret:
    description: Secret (UUID) of O(api_token_id). Never logged. From E(PROXMOX_TOKEN_SECRET) when not set.
    type: str
  validate_certs:
    description: Verify the API's TLS certificate (against O(ca_path) when set, else the system's CAs).
    type: bool
    default: true
  ca_path:
    description:
      - CA bundle (PEM) that signed the API's certificate, e.g. a copy of the cluster's C(/etc/pve/pve-root-ca.pem).
      - From E(PROXMOX_CA_PATH) when not set.
    type: path
  api_timeout:
    description: Seconds each API request may take.
    type: int
    default: 30
requirements:
  - proxmoxer >= 2.0 and requests, where the module runs (the controller when delegated there)
"""
