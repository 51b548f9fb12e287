"""The claim store: one directory for every user of the machine, one file per queued or running
claim, and a lock file whose ``flock`` every decision holds (first come, first served).

The directory is made like /tmp (mode 1777: anyone may add a file, only its owner or root may
remove it), so a user cannot remove another user's claim. A store that cannot be trusted (a
symbolic link, not a directory, owned by another user who is not root, world-writable without the
sticky bit, not writable by us) is refused with one sentence (``ClaimStoreError``, a ConfigError:
exit 2, nothing queued). A claim names its user by its file's owner, never by what the file says.

A claim lives as long as its waiter (which becomes the run's launcher in place, same pid and start
time): one whose process is gone, by pid and start time, counts for nobody and is removed by
whoever checks next and may remove it. Plain Python.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from engine.core.common import strict_json
from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, lookup
from engine.core.runs.rundir import RunDir

STORE_ENV = "DDPTUI_CLAIMS_DIR"
DEFAULT_STORE = Path("/tmp/ddptui-claims")
STORE_MODE = 0o1777
CLAIM_MODE = 0o644  # everyone reads the line; only its owner (or root) changes a claim
LOCK_NAME = ".lock"
CLAIM_MAX_BYTES = 64 * 1024


class ClaimStoreError(ConfigError):
    """A claim store that cannot be used or trusted: one sentence, nothing queued."""


class ClaimState(str, Enum):
    WAITING = "waiting"
    HOLDING = "holding"  # its devices are its own until its launcher ends

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class DeviceWant:
    """What a queued run waits for: ``count`` CPU slots, or GPUs (``indices`` those very ones;
    () any ``count`` free ones)."""

    kind: str  # "cpu" | "gpu"
    count: int
    indices: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"cpu:{self.count}"
        if self.indices:
            return "GPU " + ",".join(str(i) for i in self.indices)
        return f"any {self.count} GPU{'s' if self.count != 1 else ''}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "indices": list(self.indices)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceWant:
        return cls(str(data["kind"]), int(data["count"]), tuple(int(i) for i in data["indices"]))


@dataclass(frozen=True)
class Claim:
    """One queued run's place in line (``ticket``: earlier is first) and, once it holds them, its
    devices (``held``: GPU indices; a CPU claim holds ``want.count`` slots)."""

    ticket: int
    run_id: str
    run_dir: str
    want: DeviceWant
    waiter: ProcessRef
    queued_at: float
    label: str = ""  # what runs: the preset, or the script
    state: ClaimState = ClaimState.WAITING
    held: tuple[int, ...] = ()
    uid: int = -1  # the claim file's owner, as read; -1 in one not read from the store yet

    @property
    def file_name(self) -> str:
        return f"{self.ticket:020d}-{self.run_id}.json"

    def holding(self, devices: tuple[int, ...]) -> Claim:
        return replace(self, state=ClaimState.HOLDING, held=devices)

    def to_json(self) -> dict[str, Any]:
        return {
            "ticket": self.ticket,
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "want": self.want.to_json(),
            "waiter": self.waiter.to_json(),
            "queued_at": self.queued_at,
            "label": self.label,
            "state": str(self.state),
            "held": list(self.held),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], uid: int) -> Claim:
        return cls(
            ticket=int(data["ticket"]),
            run_id=str(data["run_id"]),
            run_dir=str(data["run_dir"]),
            want=DeviceWant.from_json(data["want"]),
            waiter=ProcessRef.from_json(data["waiter"]),
            queued_at=float(data["queued_at"]),
            label=str(data.get("label", "")),
            state=ClaimState(data.get("state", ClaimState.WAITING)),
            held=tuple(int(i) for i in data.get("held", ())),
            uid=uid,
        )


def claim_alive(claim: Claim) -> bool:
    """Its waiter (or the launcher it became) still runs, by pid and start time, and the run it
    holds devices for has not ended (no summary.json yet: the launcher writes it once its ranks
    are gone, then cleans up before it exits). A process this user cannot tell counts as alive:
    another user's claim is never dropped on a guess."""
    state, _ = lookup(claim.waiter)
    if not (state.alive or state == ProcessState.UNREADABLE):
        return False
    return claim.state == ClaimState.WAITING or not run_ended(claim)


def run_ended(claim: Claim) -> bool:
    """The claim's run has written its summary: its ranks are over, its devices free."""
    return os.path.lexists(RunDir(Path(claim.run_dir)).summary_path)


def default_store_path() -> Path:
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


class ClaimStore:
    """The claim files of one store directory (``open_store`` checks and makes it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock: one decision at a time, for every user. The lock file may be
        another user's and read-only to us; ``flock`` needs no write access."""
        lock_path = self.path / LOCK_NAME
        flags = os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | flags, 0o666)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)  # ours: let every user open it for writing too
        except PermissionError:
            fd = os.open(lock_path, os.O_RDONLY | flags)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def read(self) -> list[Claim]:
        """Every claim in the store, first in line first; files that are not claims (damaged,
        links, too large) are left out."""
        claims = []
        try:
            names = sorted(n for n in os.listdir(self.path) if n.endswith(".json"))
        except OSError:
            return []
        for name in names:
            claim = self._read_one(name)
            if claim is not None:
                claims.append(claim)
        return sorted(claims, key=lambda c: c.ticket)

    def _read_one(self, name: str) -> Claim | None:
        try:
            fd = os.open(self.path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > CLAIM_MAX_BYTES:
                return None
            data = os.read(fd, CLAIM_MAX_BYTES)
            return Claim.from_json(json.loads(data), info.st_uid)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            os.close(fd)

    def next_ticket(self, claims: list[Claim]) -> int:
        """A ticket after every claim's (taken under the lock): the clock, never behind the line."""
        return max([time.time_ns(), *(c.ticket + 1 for c in claims)])

    def write(self, claim: Claim, *, new: bool = False) -> None:
        """Write ``claim``'s file: a new one never over an existing file or link; an update by
        rename, so a reader sees the old claim or the new one."""
        data = strict_json.dumps(claim.to_json()).encode()
        target = self.path / claim.file_name
        if new:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(target, flags, CLAIM_MODE)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            return
        temporary = self.path / f".{claim.file_name}.{os.getpid()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, CLAIM_MODE)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise

    def remove(self, claim: Claim) -> bool:
        """Remove ``claim``'s file; False when this user may not (another user's, in the sticky
        store) or it is already gone."""
        try:
            (self.path / claim.file_name).unlink()
        except OSError:
            return False
        return True

    def live_claims(self) -> list[Claim]:
        """The claims that still count, first in line first; the dead ones (their process gone)
        are removed where this user may (call it under the lock)."""
        claims = []
        for claim in self.read():
            if claim_alive(claim):
                claims.append(claim)
            else:
                self.remove(claim)
        return claims


def open_store(path: Path | None = None, *, create: bool = True) -> ClaimStore:
    """The store at ``path`` (the ``DDPTUI_CLAIMS_DIR`` variable's, else /tmp/ddptui-claims),
    made with mode 1777 when missing and ``create``; ClaimStoreError with one sentence when it
    cannot be used or trusted."""
    path = Path(path) if path is not None else default_store_path()
    if create and not os.path.lexists(path):
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, STORE_MODE)  # the umask would take the bits others need
        except FileExistsError:
            pass  # another user made it meanwhile: checked below like any other
        except OSError as err:
            raise ClaimStoreError(
                f"the claim store {path} cannot be made ({err.strerror or err}); give a "
                f"writable directory with --queue-store or {STORE_ENV}"
            ) from None
    _check_store(path)
    return ClaimStore(path)


def _check_store(path: Path) -> None:
    """ClaimStoreError unless ``path`` is a directory we can trust with claims."""
    try:
        info = os.lstat(path)
    except OSError as err:
        raise ClaimStoreError(f"the claim store {path} cannot be read ({err.strerror})") from None
    me = os.geteuid()
    if stat.S_ISLNK(info.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        why = "is not a directory"
    elif info.st_uid not in (0, me):
        why = f"belongs to uid {info.st_uid}, neither you nor root"
    elif info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        why = "is writable by everyone without the sticky bit (anyone could remove a claim)"
    elif not os.access(path, os.W_OK | os.X_OK):
        why = "is not writable by you"
    else:
        return
    raise ClaimStoreError(
        f"the claim store {path} {why}; give another directory with --queue-store or {STORE_ENV}"
    )
