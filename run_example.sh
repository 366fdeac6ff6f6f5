#!/usr/bin/env bash
# The README's main job on a fresh clone: make .venv, install the pinned CPU torch and
# torchcaffe with its examples extra, then build LMDBs from scikit-learn's digits, train from
# solver.prototxt, fine-tune with AdamW, save and reload a .caffemodel.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[examples]"
python examples/digits/digits.py "$@"
