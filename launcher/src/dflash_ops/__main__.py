import sys

from dflash_ops.cli import main

sys.exit(main())
