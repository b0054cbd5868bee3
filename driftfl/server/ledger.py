"""The privacy ledger (``privacy_ledger.json`` in a DP run's directory): every release the run
charged, written before each round's messages go out and again when the round is recorded.

Why a file of its own: the checkpoint is written at the end of a round. A run stopped after its
clients replied (each with fresh noise) and before the checkpoint is resumed from the round
before, sends the round again, and its clients noise afresh: the round has been released twice.
The ledger holds the first sending's charge (at the round's worst, ``planned``, or what it
released where the release came before the stop), so the resumed run charges both. Anyone can
recompute the run's epsilon from it alone (docs/privacy.md).

It cannot be edited, swapped, rolled back or lost without a resume refusing it:
- its body (the run's id, a generation counted up at every write, delta, the releases) carries
  an HMAC tag under the checkpoint's key (seal.py);
- each write also records its generation and digest outside every run directory, beside that
  key (``<DRIFTFL_HOME>/ledgers/<run id>.json``, with the run directory): an older genuine
  ledger, one of another run or one in another directory is refused on resume;
- the checkpoint holds the run's id and the ledger's generation when it was written: a ledger
  older than its checkpoint, or a DP checkpoint without its ledger, is refused;
- a fresh start in a directory that holds a ledger is refused (``check_fresh``): a run stopped
  before its first checkpoint is resumed from round 0 with every charge kept.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from driftfl.common import paths
from driftfl.common.errors import ConfigError
from driftfl.common.untrusted import UnsafeFile, read_text, write_text

from . import seal

LEDGER = "privacy_ledger.json"
FORMAT = "driftfl privacy ledger"
VERSION = 2  # 1 (earlier driftfl) had no run id nor generation: refused on resume
ADVICE = "resume another run directory, or run without resume= to start afresh"


def _refused(run_dir: Path, problem: str) -> ConfigError:
    return ConfigError(f"cannot resume {run_dir}: its {LEDGER} {problem}; {ADVICE}")


def _body(run: str, generation: int, delta: float, releases: list[dict]) -> bytes:
    return json.dumps({"version": VERSION, "run": run, "generation": generation,
                       "delta": delta, "releases": releases}, sort_keys=True).encode()


def head_path(run: str) -> Path:
    """Where the latest generation of run ``run``'s ledger is recorded: beside the key."""
    return paths.home() / "ledgers" / f"{run}.json"


def check_fresh(run_dir: Path) -> None:
    """ConfigError in one line where ``run_dir`` holds a privacy ledger: a fresh start there
    would overwrite the record of what a run under differential privacy released."""
    path = Path(run_dir) / LEDGER
    if not (path.exists() or path.is_symlink()):
        return
    raise ConfigError(f"{run_dir} holds {LEDGER}, the record of what a run under differential "
                      "privacy released there, which a fresh start would overwrite; go on "
                      f"with driftfl run resume={run_dir} (from its last checkpoint, or from "
                      "round 0 where it has none, every charge kept), or choose another "
                      "directory")


@dataclass
class Ledger:
    """One run's ledger: its id, the generation last written, and where it lives."""

    run_dir: Path
    run: str
    generation: int = 0

    @classmethod
    def fresh(cls, run_dir: Path) -> Ledger:
        check_fresh(run_dir)
        return cls(Path(run_dir), secrets.token_hex(16))

    def binding(self) -> dict:
        """What the checkpoint keeps of the ledger (seal.py covers it with the rest)."""
        return {"run": self.run, "generation": self.generation}

    def write(self, release) -> None:
        """The ledger of ``release`` as it stands (atomic; nothing without DP), then its
        generation and digest beside the key."""
        releases = release.charged()
        if not releases:
            return
        self.generation += 1
        delta = release.settings.delta
        body = _body(self.run, self.generation, delta, releases)
        tag = seal.tag(body, seal.key(create=True)).hex()
        write_text(self.run_dir / LEDGER, json.dumps(
            {"format": FORMAT, "version": VERSION, "run": self.run,
             "generation": self.generation, "delta": delta, "releases": releases,
             "hmac": tag}, indent=1) + "\n")
        head = head_path(self.run)
        head.parent.mkdir(parents=True, exist_ok=True)
        write_text(head, json.dumps({"generation": self.generation,
                                     "sha256": hashlib.sha256(body).hexdigest(),
                                     "run_dir": str(self.run_dir.resolve())}) + "\n")

    def charge(self, release, server_round: int) -> None:
        """Charge round ``server_round`` and put the charge on disk before its messages go
        out."""
        release.charge(server_round)
        self.write(release)

    def record(self, release) -> None:
        """After a round, before its checkpoint: the round's release in place of its charge."""
        release.settle()
        self.write(release)


def resumed(run_dir: Path, release, saved: dict | None) -> tuple[Ledger, list[list[float]]]:
    """The ledger of the stopped run in ``run_dir`` (``saved``: its checkpoint's state, None
    where it stopped before its first) and the releases of rounds after the checkpoint's that
    it charged, as the release keeps them; ConfigError in one line where the ledger is missing,
    unreadable, changed, older than the checkpoint or than its last write, or another run's.
    Without DP, no ledger: the checkpoint alone."""
    run_dir = Path(run_dir)
    binding = (saved or {}).get("ledger") or {}
    if not hasattr(release, "lost"):
        return Ledger(run_dir, binding.get("run") or secrets.token_hex(16)), []
    path = run_dir / LEDGER
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
    if ledger.get("version") != VERSION or not isinstance(ledger.get("run"), str) \
            or not isinstance(ledger.get("generation"), int):
        raise _refused(run_dir, "was written by an earlier driftfl, without the run and "
                       "generation a resume checks")
    try:
        secret = seal.key()
    except seal.Unsealed as err:
        raise _refused(run_dir, str(err)) from None
    run, generation = ledger["run"], ledger["generation"]
    body = _body(run, generation, ledger.get("delta"), ledger["releases"])
    if not hmac.compare_digest(seal.tag(body, secret).hex(), ledger["hmac"]):
        raise _refused(run_dir, "does not verify with this machine's checkpoint key: it was "
                       "changed after driftfl wrote it")
    if saved is not None and binding.get("run") != run:
        raise _refused(run_dir, "is another run's ledger than its checkpoint's")
    if saved is not None and generation < binding.get("generation", 0):
        raise _refused(run_dir, f"is older than its checkpoint (generation {generation}, the "
                       f"checkpoint was written after generation {binding['generation']}): "
                       "an earlier copy put back")
    check_head(run_dir, run, generation, body)
    saved_round = saved["round"] if saved else 0
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
    return Ledger(run_dir, run, generation), out


def check_head(run_dir: Path, run: str, generation: int, body: bytes) -> None:
    """The ledger against the latest write recorded beside the key: the same generation and
    bytes, or one write newer (a stop between the two writes); its own run directory."""
    head = head_path(run)
    try:
        latest = json.loads(read_text(head))
        latest_generation, digest = int(latest["generation"]), str(latest["sha256"])
        written_in = str(latest["run_dir"])
    except FileNotFoundError:
        raise _refused(run_dir, f"has no record of its last write on this machine ({head}); "
                       "a run moved from another machine needs that file copied with its "
                       "checkpoint key") from None
    except (OSError, UnsafeFile, ValueError, KeyError, TypeError) as err:
        raise _refused(run_dir, f"cannot be checked: its record {head} cannot be read "
                       f"({err})") from None
    if written_in != str(Path(run_dir).resolve()):
        raise _refused(run_dir, f"was written for the run directory {written_in}: another "
                       "run's ledger, or this run moved (resume it where it ran)")
    if generation < latest_generation or (
            generation == latest_generation
            and not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest)):
        raise _refused(run_dir, f"is an earlier copy (generation {generation}; driftfl last "
                       f"wrote generation {latest_generation}, {head}): a ledger put back "
                       "would leave sendings uncharged")


def charged_line(entries: list[list[float]]) -> str:
    """The line a resumed run prints about the rounds it sends again ("": none)."""
    rounds = sorted({int(e[0]) for e in entries})
    if not rounds:
        return ""
    listed = ", ".join(map(str, rounds))
    return (f"driftfl: privacy: round{'s' if len(rounds) > 1 else ''} {listed} went out before "
            "the run stopped and will be sent again, with fresh noise: both sendings are "
            f"charged ({LEDGER})")
