"""Error replies that keep the node's paths on the node.

When a handler raises, Flower replies to the server with ``"<class '...'>:<'" + str(error) +
"'>"`` (flwr/supernode/runtime/run_clientapp.py). In deployment the ClientApp mod below logs
the full error to the node's own stderr and re-raises it with every local path replaced, so
the server learns what was wrong (``no images found in <data-dir>``) but not where files are
or which exist. In simulation nodes and server are one person's processes: nothing is hidden.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from driftfl.common.datasets import FMNIST_SYSTEM_DIR
from driftfl.common.errors import ConfigError
from driftfl.common.paths import cache_dir, data_dir, home

from . import node

# a path ('/x', '~/x', './x', '../x') not inside a word (so 'T-shirt/top', '0/2' and
# '<class>/<image>' stay), up to a space or a quote
_PATH = re.compile(r"(?<![\w>\].])(?:~|\.{1,2})?/[^\s'\"]+")
_TRAILING = re.compile(r"[.,:;)\]]+$")  # punctuation after a path belongs to the sentence


def _spellings(path: str) -> set[str]:
    """A path as it may appear in a message: as given, expanded, resolved."""
    expanded = os.path.expanduser(path)
    found = {path, expanded}
    try:
        found.add(str(Path(expanded).resolve()))
    except (OSError, RuntimeError):
        pass
    return {p.rstrip("/") or p for p in found if p}


def named_places(node_config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path, placeholder) for the places this node reads from, longest path first."""
    places = {f"<{key}>": str(node_config[key]) for key in ("data-dir", "dataset-root")
              if node_config.get(key)}
    places.update({"<default data place>": str(data_dir()), "<driftfl cache>": str(cache_dir()),
                   "<driftfl home>": str(home()), "<fmnist package>": str(FMNIST_SYSTEM_DIR),
                   "~": str(Path.home())})
    pairs = [(spelling, name) for name, path in places.items() for spelling in _spellings(path)]
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def redact(text: str, node_config: Mapping[str, Any]) -> str:
    """``text`` without local paths: the node's named places become their names
    (``<data-dir>``), any other path ``<local path>``."""
    for path, name in named_places(node_config):
        if len(path) > 1:  # never '/' alone
            text = re.sub(r"(?<![\w.~-])" + re.escape(path) + r"(?=$|[/\s'\".,:;)\]])", name,
                          text)

    def anonymous(found: re.Match) -> str:
        tail = _TRAILING.search(found.group())
        return "<local path>" + (tail.group() if tail else "")

    return _PATH.sub(anonymous, text)


def redacted_error(error: Exception, node_config: Mapping[str, Any]) -> Exception:
    """The same complaint without paths: a ConfigError stays one; anything else becomes a
    RuntimeError that names the original type."""
    text = redact(str(error), node_config)
    if isinstance(error, ConfigError):
        return ConfigError(text)
    return RuntimeError(f"{type(error).__name__}: {text}")


def keep_paths_local(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """ClientApp mod: in deployment, a failing handler's error is logged in full here and
    reaches the server without local paths."""
    try:
        return call_next(msg, context)
    except Exception as error:
        if node.in_simulation():
            raise
        print(f"driftfl node: {msg.metadata.message_type} failed: {error}", file=sys.stderr,
              flush=True)
        if not isinstance(error, ConfigError):  # a bug, not bad input: keep the traceback
            traceback.print_exc(file=sys.stderr)
        raise redacted_error(error, context.node_config) from None
