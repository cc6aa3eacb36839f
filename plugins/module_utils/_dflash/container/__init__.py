# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Code that runs INSIDE the training container: stdlib only, shipped as one package per transport call.

controller/lifecycle_shipping.py sends these files' sources on stdin and imports them there as a real
package, so the relative imports between them work the same in a container as on the controller.
"""
