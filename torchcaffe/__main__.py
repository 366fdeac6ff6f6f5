"""``python -m torchcaffe <action> ...``: the same command line as ``torchcaffe``."""

import sys

from .cli.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
