"""Caffe's image list files: one ``name label`` per line, split at the LAST space."""

from __future__ import annotations

import os

from ..errors import DataError


def read_text(path: str, what: str) -> str:
    """A list or window file's text, as Caffe opens it: relative to the working directory
    (which the error names), bytes that are not UTF-8 kept as they are."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError as err:
        raise DataError(
            f"cannot open the {what} ({err.strerror})",
            path=path,
            hint=f"it is opened relative to the working directory {os.getcwd()}",
        ) from None


def read_list(
    path: str, *, what: str = "image list", keep_empty: bool = False, allow_empty: bool = False
) -> list[tuple[str, int]]:
    """(name, label) pairs, as image_data_layer.cpp / convert_imageset read them: the label
    is ``atoi`` of what follows the last space; a line without one is all name, and its label
    ``atoi`` of the whole line (C's pointer arithmetic on ``npos + 1``). ``keep_empty``: an
    empty line is an entry ("", 0), as convert_imageset's getline loop makes it (its image
    then fails to load, but it takes a line number, which the database keys carry).
    ``allow_empty``: a list with no names is no error (convert_imageset writes an empty
    database from it; the image layers CHECK "File is empty")."""
    lines = read_text(path, what).splitlines()
    out = []
    for line in lines:
        if not line and not keep_empty:
            continue
        name, sep, label = line.rpartition(" ")
        if not sep:
            name, label = line, line
        out.append((name, _atoi(label)))
    if not allow_empty and not any(name for name, _ in out):
        raise DataError(f"the {what} is empty", path=path, expected="'name label' lines")
    return out


def _atoi(text: str) -> int:
    """C's atoi: optional sign and leading digits; anything else gives 0."""
    text = text.lstrip()
    n = 0
    for i, ch in enumerate(text):
        if ch.isdigit() and ch.isascii():
            continue
        if i == 0 and ch in "+-":
            continue
        n = i
        break
    else:
        n = len(text)
    try:
        return int(text[:n])
    except ValueError:
        return 0
