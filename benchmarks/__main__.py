"""``python -m benchmarks``: the same as ``python benchmarks/run.py``."""

from benchmarks.run import main

main()
