"""A checkpoint's integrity: an HMAC-SHA256 tag over the file's bytes, appended to them, whose
key lives outside every run directory: ``checkpoint.key`` in driftfl's home (DRIFTFL_HOME,
default ~/.driftfl), 32 random bytes made on the first save, readable by its owner only.

Whoever can write a run directory but not that key cannot make a checkpoint that resumes: a
changed model, metrics row or DP noise seed fails the tag, and so does a checkpoint written
under another key (another machine or user: copy that key to resume there)."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from driftfl.common import paths
from driftfl.common.untrusted import UnsafeFile, read_bytes

KEY_FILE = "checkpoint.key"
KEY_BYTES = 32
MARK = b"driftfl-hmac-sha256:"  # before the tag at the end of a checkpoint
OVERHEAD = len(MARK) + hashlib.sha256().digest_size


class Unsealed(ValueError):
    """The tag is missing or does not verify (the message says which, and what to do)."""


def key_path() -> Path:
    return paths.home() / KEY_FILE


def key(create: bool = False) -> bytes:
    """This machine's checkpoint key; made (0600) where ``create`` and there is none yet."""
    path = key_path()
    if create and not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another run made it meanwhile: use that one
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
    try:
        found = read_bytes(path, KEY_BYTES)
    except FileNotFoundError:
        raise Unsealed(f"cannot be verified: this machine has no checkpoint key ({path}); it "
                       "was written on another machine or by another user: copy that machine's "
                       "key to this path to resume it here") from None
    except (OSError, UnsafeFile) as err:
        raise Unsealed(f"cannot be verified: the checkpoint key {path} cannot be read "
                       f"({str(err).removeprefix(f'{path} ')})") from None
    if len(found) != KEY_BYTES:
        raise Unsealed(f"cannot be verified: the checkpoint key {path} is not the {KEY_BYTES} "
                       "bytes driftfl made (restore the key the run was written under)")
    return found


def tag(data: bytes, secret: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()


def seal(data: bytes) -> bytes:
    """``data`` with its tag (the key made on first use)."""
    return data + MARK + tag(data, key(create=True))


def has_tag(data: bytes) -> bool:
    return len(data) >= OVERHEAD and data[-OVERHEAD:-OVERHEAD + len(MARK)] == MARK


def unseal(data: bytes) -> bytes:
    """The bytes ``seal`` sealed; Unsealed where the tag is missing or does not verify."""
    if not has_tag(data):
        raise Unsealed("has no integrity tag: it is truncated, or was not written by this "
                       "driftfl (earlier releases wrote none)")
    body, given = data[:-OVERHEAD], data[-OVERHEAD + len(MARK):]
    if not hmac.compare_digest(tag(body, key()), given):
        raise Unsealed(f"does not verify with this machine's checkpoint key ({key_path()}): it "
                       "was changed after driftfl wrote it, or written under another machine's "
                       "key (copy that key to this path to resume it here)")
    return body
