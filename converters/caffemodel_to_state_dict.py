"""caffemodel -> torch state_dict file (thin script over torchcaffe.converters).

python converters/caffemodel_to_state_dict.py [--readable] NET.prototxt WEIGHTS.caffemodel OUT.pt
python converters/caffemodel_to_state_dict.py --reverse NET.prototxt IN.pt OUT.caffemodel
"""

import argparse

from torchcaffe.converters import caffemodel_to_state_dict, state_dict_to_caffemodel

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reverse", action="store_true", help="state_dict -> caffemodel")
    ap.add_argument("--readable", action="store_true", help="keys conv1.weight, bn1.running_mean")
    ap.add_argument("prototxt")
    ap.add_argument("source")
    ap.add_argument("target")
    a = ap.parse_args()
    if a.reverse:  # either key style is accepted
        state_dict_to_caffemodel(a.prototxt, a.source, a.target)
    else:
        caffemodel_to_state_dict(a.prototxt, a.source, a.target, readable=a.readable)
