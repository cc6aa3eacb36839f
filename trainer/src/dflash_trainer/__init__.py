"""dflash_trainer: trains a DFlash block-diffusion drafter against a frozen target model.

This package's __init__ stays stdlib-only: the console-script entry (cli.py) must write the first
heartbeat before torch or transformers are imported, and importing the package runs this file first.
"""

__version__ = "0.1.0"
