"""A tree of plain values and arrays in one file that reads back without running anything.

The file is a NumPy ``.npz`` archive, read with ``allow_pickle=False``: one JSON document (the
tree) and the arrays it names. JSON holds None, booleans, numbers, strings and lists as they
are; every JSON object is a tag, so that what JSON lacks comes back exactly:

    {"dict": [[key, value], ...]}    any dict (int keys, tuple keys, insertion order)
    {"tuple": [...]}, {"set": [...]}, {"frozenset": [...]}, {"deque": [maxlen, [...]]}
    {"ndarray": "a3"}                a NumPy array of the archive (dtype and shape kept)
    {"scalar": "a4"}                 a NumPy scalar (np.float32(...), ...)
    {"tensor": "a5"}                 a torch tensor (on the CPU)
    {"arrayrecord": {"dict": ...}}   a Flower ArrayRecord (FedAvgM keeps one)

Reading refuses anything else (a pickled object, an object array, an unknown tag, a compressed
member, arrays that declare more bytes than the reader allows) with UnreadableTree; sizes are
checked from the archive's directory and the arrays' headers before anything is inflated.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from driftfl.common.untrusted import UnsafeFile, npz_arrays, read_bytes, replaced

TREE = "tree"  # the archive member that holds the JSON document
PICKLE = 0x80  # the first byte of a pickle (protocol 2 and later)
NEVER_UNPICKLED = "pickle, which is never loaded (loading one can run any code)"
LIMIT = 2**30  # bytes all arrays of a tree may declare, unless the reader knows better
SLACK = 2**20  # the archive's own bytes (headers, the directory, a tag) beyond its arrays'


class UnreadableTree(ValueError):
    """The file is not a tree this module wrote (the message says why, in a few words)."""


def dumps(tree: Any) -> bytes:
    """``tree`` as the bytes of its file."""
    arrays: dict[str, np.ndarray] = {}
    document = json.dumps(_encode(tree, arrays)).encode()
    buffer = io.BytesIO()
    np.savez(buffer, **{TREE: np.frombuffer(document, np.uint8)}, **arrays)
    return buffer.getvalue()


def write(path: Path, tree: Any, seal: Callable[[bytes], bytes] = bytes) -> None:
    """``tree`` to ``path`` (its bytes through ``seal``), atomically: a kill mid-write keeps
    the file that was there, and a link at ``path`` is replaced, never written through."""
    data = seal(dumps(tree))
    with replaced(Path(path), "wb") as f:
        f.write(data)


def read(path: Path, limit: int = LIMIT) -> Any:
    """The tree ``write`` wrote to ``path`` (a tag after it is ignored: checkpoint.py checks
    it); UnreadableTree when it is not one, or declares more than ``limit`` bytes."""
    try:
        data = read_bytes(Path(path), limit + SLACK)
    except UnsafeFile as err:
        raise UnreadableTree(str(err).removeprefix(f"{path} ")) from None
    return loads(data, limit)


def sniff(data: bytes) -> None:
    """UnreadableTree for what is never read at all: nothing, a pickle, PyTorch's zip."""
    if not data:
        raise UnreadableTree("is empty")
    if data[0] == PICKLE:
        raise UnreadableTree(f"is a {NEVER_UNPICKLED}")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:  # the central directory only
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return  # loads says why
    if f"{TREE}.npy" not in names and any(n.endswith(".pkl") for n in names):
        raise UnreadableTree("is in PyTorch's format (as earlier driftfl wrote it), a "
                             f"zipped {NEVER_UNPICKLED}")


def loads(data: bytes, limit: int = LIMIT) -> Any:
    """The tree of a file's bytes; every member's declared size is checked (against
    ``limit``, together) before any is inflated."""
    sniff(data)
    try:
        npz_arrays(io.BytesIO(data), limit, compressed=False)
    except UnsafeFile as err:
        raise UnreadableTree(str(err)) from None
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise UnreadableTree("is a single array, not an archive")
        with loaded as archive:
            document = _array(archive, TREE)
            if document.dtype != np.uint8 or document.ndim != 1:
                raise UnreadableTree("has a tree that is not a JSON document")
            return _decode(json.loads(document.tobytes()), archive)
    except UnreadableTree:
        raise
    except Exception as err:  # truncated, not JSON, ...: say what NumPy or JSON said
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise UnreadableTree(f"cannot be read ({reason}): truncated, or not written by "
                             "driftfl") from None


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    def stored(array: np.ndarray) -> str:
        if array.dtype.hasobject:
            raise TypeError("an array of Python objects cannot be saved")
        name = f"a{len(arrays)}"
        arrays[name] = array
        return name

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, dict):
        return {"dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, deque):
        return {"deque": [value.maxlen, [_encode(v, arrays) for v in value]]}
    for kind in (tuple, frozenset, set):  # frozenset before set: neither is the other
        if isinstance(value, kind):
            return {kind.__name__: [_encode(v, arrays) for v in value]}
    if isinstance(value, np.ndarray):
        return {"ndarray": stored(value)}
    if isinstance(value, np.generic):
        return {"scalar": stored(np.asarray(value))}
    if isinstance(value, torch.Tensor):
        return {"tensor": stored(value.detach().cpu().numpy())}
    if isinstance(value, ArrayRecord):
        return {"arrayrecord": _encode({k: v.numpy() for k, v in value.items()}, arrays)}
    raise TypeError(f"a {type(value).__name__} cannot be saved in a tree file")


def _array(archive, name: Any) -> np.ndarray:
    """The archive's array ``name`` (a member that is not an .npy array is bytes: refused)."""
    array = archive[name] if isinstance(name, str) and name in archive.files else None
    if not isinstance(array, np.ndarray):
        raise UnreadableTree(f"lacks the array {name!r}")
    return array


def _decode(node: Any, archive) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, archive) for v in node]
    if not (isinstance(node, dict) and len(node) == 1):
        raise UnreadableTree("has a tree holding an object that is not a known tag")
    (tag, body), = node.items()
    if tag in ("ndarray", "scalar", "tensor"):
        array = _array(archive, body)
        if tag == "scalar":
            if array.ndim:
                raise UnreadableTree("has a tree naming a scalar that is an array")
            return array[()]
        return torch.from_numpy(array) if tag == "tensor" else array
    if tag == "arrayrecord":
        arrays = _decode(body, archive)
        if not (isinstance(arrays, dict)
                and all(isinstance(v, np.ndarray) for v in arrays.values())):
            raise UnreadableTree("has a tree holding an ArrayRecord of something but arrays")
        # np.require, not np.ascontiguousarray: that makes 0-d arrays 1-d
        return ArrayRecord({k: Array(np.require(v, requirements="C"))
                            for k, v in arrays.items()})
    if not isinstance(body, list):
        raise UnreadableTree(f"has a tree holding a malformed '{tag}'")
    if tag == "dict":
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in body):
            raise UnreadableTree("has a tree holding a dict that is not a list of pairs")
        return {_decode(k, archive): _decode(v, archive) for k, v in body}
    if tag == "deque":
        if not (len(body) == 2 and (body[0] is None or isinstance(body[0], int))
                and isinstance(body[1], list)):
            raise UnreadableTree("has a tree holding a malformed deque")
        return deque(_decode(body[1], archive), maxlen=body[0])
    kinds = {"tuple": tuple, "set": set, "frozenset": frozenset}
    if tag not in kinds:
        raise UnreadableTree(f"has a tree holding an unknown tag '{tag}'")
    return kinds[tag](_decode(v, archive) for v in body)
