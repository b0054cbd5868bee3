"""A client's error reply in one line. Flower turns an exception in a ClientApp, or in the Ray
worker under it, into an error reply whose reason is the exception's whole text: Ray's
OutOfMemoryError is kilobytes (the node's memory, its object store, its top ten processes).
``error_reason`` shortens every error reply the server reads; a reply that failed for want of
a resource (memory, a Ray worker that died) is named by that resource, and ``log_refused``
says in one line per exchange which clients it hit and which setting to change.
``quiet_flower_errors`` keeps Flower's own copy of such an error (its message and traceback)
off the console."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from logging import WARNING

from flwr.app import Error
from flwr.supercore import log

MAX_REASON = 240  # characters of an error reply's text kept in a rejection
FEWER_AT_ONCE = ("run fewer clients at once (a larger simulation.client_cpus), or a smaller "
                 "batch_size or model")


@dataclass(frozen=True)
class Resource:
    """What a client ran out of, as a rejection names it, and what to change."""

    name: str
    pattern: re.Pattern
    change: str


RESOURCES = (
    Resource("out of memory", re.compile(
        r"OutOfMemoryError|running low on memory|CUDA out of memory|\bMemoryError"),
        FEWER_AT_ONCE + "; under device=cuda, a larger simulation.client_gpus"),
    # Ray's text for a dead worker lists the OOM killer among the possible causes
    Resource("a dead Ray worker", re.compile(
        r"ActorDiedError|RayActorError|ActorUnavailableError|WorkerCrashedError|NodeDiedError|"
        r"RaySystemError|LocalRayletDiedError|actor died|worker died|worker process has died"),
        "out of memory, or a crash: " + FEWER_AT_ONCE),
)
# Flower's reason: "<class 'module.Name'>:<'text'>"; a ClientApp's exception inside it
FLOWER_REASON = re.compile(r"<class '([\w.()]+)'>:<'(.*)'>\Z", re.DOTALL)
CLIENT_APP_MESSAGE = re.compile(r"Exception ClientAppException occurred\. Message: ")


def resource_of(text: str) -> Resource | None:
    """The resource an error's text (or a rejection made of it) says a client lacked."""
    return next((r for r in RESOURCES if r.pattern.search(text)), None)


def error_reason(error: Error) -> str:
    """Why an error reply cannot be used, in one line: the resource it lacked and the error's
    class (out of memory, a dead Ray worker), else the last line of its text, shortened."""
    reason = str(error.reason or "")
    found = FLOWER_REASON.match(reason.strip())
    kind, text = (found.group(1).rsplit(".", 1)[-1], found.group(2)) if found else ("", reason)
    kind = re.sub(r"^\w+\((\w+)\)$", r"\1", kind)  # RayTaskError(ClientAppException)
    if resource := resource_of(reason):
        return f"error reply: {resource.name} ({kind or 'Ray'})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = CLIENT_APP_MESSAGE.sub("", lines[-1] if lines else kind or f"code {error.code}")
    if len(last) > MAX_REASON:
        last = last[:MAX_REASON - 3] + "..."
    return f"error reply: {last}"


def refusal_lines(what: str, refused: list[tuple[str, str]]) -> list[str]:
    """The lines that say why ``what`` replies were not used, from (who, reason) pairs: one per
    reply, but one per resource for those that failed for want of it, naming the clients and
    the setting to change."""
    lines, short = [], {}
    for who, reason in refused:
        resource = resource_of(reason)
        if resource is None:
            lines.append(f"{what} reply from {who} rejected: {reason}")
        else:
            short.setdefault(resource, []).append(who.split(" (node")[0])
    for resource, whom in short.items():
        lines.append(f"{what} replies of {len(whom)} client(s) ({', '.join(whom)}) failed: "
                     f"{resource.name}; {resource.change}")
    return lines


def log_refused(what: str, refused: list[tuple[str, str]]) -> None:
    """Log ``refusal_lines`` as warnings."""
    for line in refusal_lines(what, refused):
        log(WARNING, "%s", line)


def change_for(rejection: str) -> str:
    """What to change for a run whose replies were rejected so ("" if not for a resource)."""
    resource = resource_of(rejection)
    return f"the clients' error: {resource.name}; {resource.change}" if resource else ""


def _resource_record(record: logging.LogRecord) -> bool:
    """Flower's log of a client error that ``error_reason`` names in one line: the header of
    the Ray backend's report, and the exception or its traceback when a resource failed."""
    if record.msg == "An exception was raised when processing a message by %s":
        return True
    return record.levelno >= logging.ERROR and resource_of(str(record.msg)) is not None


def quiet_flower_errors(record: logging.LogRecord) -> bool:
    """A filter for Flower's logger: False for the records ``_resource_record`` finds."""
    return not _resource_record(record)
