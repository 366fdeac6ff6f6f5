"""caffemodel -> torch state_dict file (thin script over torchcaffe.converters).

python converters/caffemodel_to_state_dict.py NET.prototxt WEIGHTS.caffemodel OUT.pt
python converters/caffemodel_to_state_dict.py --reverse NET.prototxt IN.pt OUT.caffemodel
"""

import argparse

from torchcaffe.converters import caffemodel_to_state_dict, state_dict_to_caffemodel

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reverse", action="store_true", help="state_dict -> caffemodel")
    ap.add_argument("prototxt")
    ap.add_argument("source")
    ap.add_argument("target")
    a = ap.parse_args()
    convert = state_dict_to_caffemodel if a.reverse else caffemodel_to_state_dict
    convert(a.prototxt, a.source, a.target)
