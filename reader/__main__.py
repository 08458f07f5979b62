"""``python -m reader`` is ``fsdp-readings``."""

import sys

from reader.cli import main

sys.exit(main())
