"""The privacy ledger (``privacy_ledger.json`` in a DP run's directory): every release the run
charged, written before each round's messages go out and again when the round is recorded.

Why a file of its own: the checkpoint is written at the end of a round. A run stopped after its
clients replied (each with fresh noise) and before the checkpoint is resumed from the round
before, sends the round again, and its clients noise afresh: the round has been released twice.
The ledger holds the first sending's charge (at the round's worst, ``planned``, or what it
released where the release came before the stop), so the resumed run charges both. Anyone can
recompute the run's epsilon from it alone (docs/privacy.md).

Its entries carry an HMAC tag under the checkpoint's key (seal.py), checked on resume: a ledger
edited to drop a charge is refused, and so is a DP checkpoint without its ledger.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.common.untrusted import UnsafeFile, read_text, write_text

from . import seal

LEDGER = "privacy_ledger.json"
FORMAT = "driftfl privacy ledger"
ADVICE = "resume another run directory, or run without resume= to start afresh"


def _refused(run_dir: Path, problem: str) -> ConfigError:
    return ConfigError(f"cannot resume {run_dir}: its {LEDGER} {problem}; {ADVICE}")


def _body(delta: float, releases: list[dict]) -> bytes:
    return json.dumps({"delta": delta, "releases": releases}, sort_keys=True).encode()


def write(run_dir: Path, release) -> None:
    """The ledger of ``release`` as it stands (atomic; nothing without DP)."""
    releases = release.charged()
    if not releases:
        return
    delta = release.settings.delta
    tag = seal.tag(_body(delta, releases), seal.key(create=True)).hex()
    write_text(Path(run_dir) / LEDGER, json.dumps(
        {"format": FORMAT, "delta": delta, "releases": releases, "hmac": tag}, indent=1) + "\n")


def charge(run_dir: Path, release, server_round: int) -> None:
    """Charge round ``server_round`` and put the charge on disk before its messages go out."""
    release.charge(server_round)
    write(run_dir, release)


def record(run_dir: Path, release) -> None:
    """After a round, before its checkpoint: the round's release in place of its charge."""
    release.settle()
    write(run_dir, release)


def unfinished(run_dir: Path, release, saved_round: int) -> list[list[float]]:
    """The releases of rounds after ``saved_round`` (the checkpoint's) that a stopped run
    charged, as the release keeps them; ConfigError in one line where the ledger is missing,
    unreadable or changed. Nothing without DP."""
    if not hasattr(release, "lost"):
        return []
    path = Path(run_dir) / LEDGER
    try:
        ledger = json.loads(read_text(path))
    except FileNotFoundError:
        raise _refused(run_dir, "is missing: a run under differential privacy cannot go on "
                       "without the ledger of what it released") from None
    except (OSError, UnsafeFile, ValueError) as err:
        raise _refused(run_dir, f"cannot be read ({err})") from None
    if not (isinstance(ledger, dict) and ledger.get("format") == FORMAT
            and isinstance(ledger.get("releases"), list) and isinstance(ledger.get("hmac"), str)):
        raise _refused(run_dir, "is not a driftfl privacy ledger")
    try:
        secret = seal.key()
    except seal.Unsealed as err:
        raise _refused(run_dir, str(err)) from None
    expected = seal.tag(_body(ledger.get("delta"), ledger["releases"]), secret).hex()
    if not hmac.compare_digest(expected, ledger["hmac"]):
        raise _refused(run_dir, "does not verify with this machine's checkpoint key: it was "
                       "changed after driftfl wrote it")
    names = ["dp_sigma", *release.stream_names]
    out = []
    for entry in ledger["releases"]:
        if entry["round"] <= saved_round:
            continue  # in the checkpoint's own ledger
        sigmas = entry["sigmas"]
        if list(sigmas) != names or not all(isinstance(s, (int, float)) and s > 0
                                            for s in sigmas.values()):
            raise _refused(run_dir, f"charges round {entry['round']} with {sigmas}, not this "
                           f"experiment's {', '.join(names)}")
        out.append([float(entry["round"]), float(entry["q"]),
                    *(float(sigmas[n]) for n in names)])
    return out


def charged_line(entries: list[list[float]]) -> str:
    """The line a resumed run prints about the rounds it sends again ("": none)."""
    rounds = sorted({int(e[0]) for e in entries})
    if not rounds:
        return ""
    listed = ", ".join(map(str, rounds))
    return (f"driftfl: privacy: round{'s' if len(rounds) > 1 else ''} {listed} went out before "
            "the run stopped and will be sent again, with fresh noise: both sendings are "
            f"charged ({LEDGER})")
