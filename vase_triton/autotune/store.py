"""Tuned configurations on disk: one JSON file per (device, Triton version).

File `<dir>/<device>-<SMs>sm-triton-<version>.json`, e.g. `NVIDIA_H200-132sm-triton-3.6.0.json`:

    {"schema": 1,
     "device": {"name": "NVIDIA H200", "multiprocessors": 132},
     "versions": {"triton": "3.6.0", "torch": "2.11.0", "vase_triton": "0.1.0"},
     "kernels": {"decode": {
         "source_hash": "<sha256 of the kernel sources, 16 hex digits>",
         "entries": {"B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0": {
             "winner": {"params": {...}, "ms": 0.021},
             "default": {"params": {...}, "ms": 0.030},    (null if the heuristic failed its check)
             "runner_up": {"params": {...}, "ms": 0.022},  (null with one valid candidate)
             "candidates": 27, "rejected": 2, "shape": {...}}},
         "trials": {"<key being tuned>": {"<params id>": {"ms": 0.03, "shape": {...}}
                                                       | {"error": "...", "shape": {...}}}}}}}

A kernel section whose `source_hash` differs from the running kernel's is stale: ignored
when read, replaced when written. `trials` hold every candidate timed for a key whose
tuning has not finished, so an interrupted run resumes; they are dropped once the entry
is written. Trials are of one launch shape: a run that resumes a key at another shape of
its bucket (batch 4 after batch 5) times every candidate again. Writers hold
`<file>.lock`, re-read the file, apply their change and replace it atomically (temporary
file + `os.replace`, keeping the file's permissions), so concurrent tuners never lose or
corrupt each other's results and readers never see a partial file; a temporary file a
killed writer left is removed by the next writer. A file that cannot be read or decoded,
is not valid JSON, is truncated, has another schema, belongs to another Triton version
or device, or holds a malformed entry or key is ignored with one warning; the next
writer moves it aside to `<file>.unusable-<UTC time>` (so nothing in it is lost) and
starts a new file.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import secrets
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch
import triton
from filelock import FileLock

from vase_triton.autotune import shapes
from vase_triton.autotune.device import DeviceProfile

SCHEMA_VERSION = 1
LOCK_TIMEOUT_S = 120.0


class AutotuneStoreWarning(UserWarning):
    """A stored file or entry was ignored; kernels fall back to their heuristics."""


_warned: set[tuple] = set()


def warn_once(identity: tuple, message: str) -> None:
    """Warn with `message` the first time `identity` is seen in this process."""
    if identity not in _warned:
        _warned.add(identity)
        warnings.warn(message, AutotuneStoreWarning, stacklevel=3)


def params_id(params: dict[str, int]) -> str:
    """Canonical text of a configuration: `block_m=64,block_n=32,num_stages=3,num_warps=4`."""
    return ",".join(f"{name}={params[name]}" for name in sorted(params))


def checked_ms(ms: object) -> float:
    """A stored time `ms` as a positive, finite float; ValueError otherwise (a JSON integer
    may exceed every float)."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise ValueError(f"expected a positive time; got {ms!r}")
    try:
        value = float(ms)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a positive, finite time; got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class Timing:
    """A configuration and its median time in milliseconds."""

    params: dict[str, int]
    ms: float

    def to_json(self) -> dict:
        return {"params": dict(self.params), "ms": self.ms}

    @classmethod
    def from_json(cls, data: object) -> Optional["Timing"]:
        if data is None:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
            raise ValueError("expected {'params': {...}, 'ms': float}")
        params, ms = data["params"], data.get("ms")
        if not all(isinstance(name, str) and type(value) is int for name, value in params.items()):
            raise ValueError("expected integer parameters")
        return cls(dict(params), checked_ms(ms))


@dataclasses.dataclass(frozen=True)
class Entry:
    """A tuned key: the winner, the heuristic default and the runner-up, with their times.

    candidates: configurations tried; rejected: those that failed to compile, to run or
    their check against the reference; shape: the concrete launch shape tuned.
    """

    winner: Timing
    default: Optional[Timing]
    runner_up: Optional[Timing]
    candidates: int
    rejected: int
    shape: dict

    def to_json(self) -> dict:
        return {
            "winner": self.winner.to_json(),
            "default": self.default.to_json() if self.default else None,
            "runner_up": self.runner_up.to_json() if self.runner_up else None,
            "candidates": self.candidates,
            "rejected": self.rejected,
            "shape": dict(self.shape),
        }

    @classmethod
    def from_json(cls, data: object) -> "Entry":
        if not isinstance(data, dict):
            raise ValueError("expected an object")
        winner = Timing.from_json(data.get("winner"))
        if winner is None:
            raise ValueError("expected a winner")
        counts = (data.get("candidates"), data.get("rejected"))
        if not all(type(count) is int and count >= 0 for count in counts):
            raise ValueError("expected candidate counts")
        shape = data.get("shape", {})
        if not isinstance(shape, dict):
            raise ValueError("expected a shape object")
        return cls(winner, Timing.from_json(data.get("default")), Timing.from_json(data.get("runner_up")), *counts, shape)

    @property
    def speedup(self) -> Optional[float]:
        """Default time over tuned time (None when the default failed its check)."""
        return self.default.ms / self.winner.ms if self.default else None


def store_path(directory: Path, profile: DeviceProfile) -> Path:
    """The file of `profile`'s device and the running Triton version in `directory`."""
    return Path(directory) / f"{profile.label}-triton-{triton.__version__}.json"


def new_document(profile: DeviceProfile) -> dict:
    """An empty store document for `profile`'s device and the running versions."""
    from vase_triton import __version__

    return {
        "schema": SCHEMA_VERSION,
        "device": {"name": profile.name, "multiprocessors": profile.multiprocessors},
        "versions": {"triton": triton.__version__, "torch": torch.__version__, "vase_triton": __version__},
        "kernels": {},
    }


def _check_document(document: object, profile: DeviceProfile) -> Optional[str]:
    """Why `document` cannot be used for `profile`'s device, or None when it can."""
    if not isinstance(document, dict):
        return "expected a JSON object"
    if document.get("schema") != SCHEMA_VERSION:
        return f"schema {document.get('schema')!r}, expected {SCHEMA_VERSION} (written by another vase_triton version)"
    versions, device = document.get("versions"), document.get("device")
    if not isinstance(versions, dict) or versions.get("triton") != triton.__version__:
        found = versions.get("triton") if isinstance(versions, dict) else None
        return f"tuned with Triton {found!r}, running {triton.__version__}"
    if not isinstance(device, dict) or (device.get("name"), device.get("multiprocessors")) != (
        profile.name,
        profile.multiprocessors,
    ):
        return f"tuned on another device ({device!r}), running on {profile.name} with {profile.multiprocessors} SMs"
    kernels = document.get("kernels")
    if not isinstance(kernels, dict):
        return "expected a 'kernels' object"
    for kernel, section in kernels.items():
        if not isinstance(section, dict) or not isinstance(section.get("source_hash"), str):
            return f"kernel {kernel!r}: expected an object with a source_hash"
        entries, trials = section.get("entries", {}), section.get("trials", {})
        if not isinstance(entries, dict) or not isinstance(trials, dict):
            return f"kernel {kernel!r}: expected 'entries' and 'trials' objects"
        for key, entry in entries.items():
            try:
                Entry.from_json(entry)
            except ValueError as error:
                return f"kernel {kernel!r}, key {key!r}: {error}"
        for key, by_params in trials.items():
            if not isinstance(by_params, dict) or not all(isinstance(t, dict) for t in by_params.values()):
                return f"kernel {kernel!r}, trials of {key!r}: expected objects"
        problem = _check_keys(kernel, section["source_hash"], [*entries, *trials])
        if problem is not None:
            return problem
    return None


def _check_keys(kernel: str, source_hash: str, keys: list[str]) -> Optional[str]:
    """Why one of `kernel`'s stored keys is malformed, or None. Keys of a kernel this version
    lacks, or of another version of its source (whose key fields may differ), are never read."""
    from vase_triton.autotune.spaces import SPACES

    if kernel not in SPACES or source_hash != SPACES[kernel].source_hash():
        return None
    for key in keys:
        try:
            shapes.check_key(key, SPACES[kernel].key_fields)
        except ValueError as error:
            return f"kernel {kernel!r}: {error}"
    return None


class StoreFile:
    """The store file of one device in one directory: validated reads, locked atomic updates."""

    def __init__(self, directory: Path, profile: DeviceProfile):
        self.profile = profile
        self.path = store_path(directory, profile)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def read(self) -> Optional[dict]:
        """The file's document, or None when it is absent or unusable (warned once)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            self._ignore(f"cannot be read ({error.strerror or error})")
            return None
        try:
            document = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            self._ignore(f"not UTF-8 text, corrupt ({error})")
            return None
        except (ValueError, RecursionError) as error:  # nesting too deep for the parser
            self._ignore(f"not valid JSON, corrupt or truncated ({type(error).__name__}: {error})")
            return None
        problem = _check_document(document, self.profile)
        if problem is not None:
            self._ignore(problem)
            return None
        return document

    def _ignore(self, reason: str) -> None:
        try:
            stat = self.path.stat()
            version = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            version = None
        warn_once(
            ("file", str(self.path), version, reason),
            f"vase_triton autotune: ignoring {self.path}: {reason}; kernels use their heuristic configurations",
        )

    def update(self, change: Callable[[dict], None]) -> dict:
        """Apply `change` to the current document under the file lock and write it atomically.

        An absent file starts from an empty document; an unusable one is first moved aside
        (warned) and the change starts from an empty document. Returns the document written.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock_path), timeout=LOCK_TIMEOUT_S):
            # Writers hold the lock while their temporary file exists: any found now is a killed writer's.
            for orphan in self.path.parent.glob(f"{self.path.name}.*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    orphan.unlink()
            document = self.read()
            if document is None and self.path.exists():
                self._set_aside()
            document = copy.deepcopy(document) if document is not None else new_document(self.profile)
            change(document)
            _write_atomic(self.path, document)
        return document

    def _set_aside(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.unusable-{stamp}-{secrets.token_hex(2)}")
        os.replace(self.path, aside)
        warnings.warn(
            f"vase_triton autotune: moved the unusable {self.path} to {aside} and started a new file",
            AutotuneStoreWarning,
            stacklevel=4,
        )

    def clear(self) -> bool:
        """Remove the file; True when there was a file. Without one, nothing is created or locked.

        The lock file stays: removing it while another process waits on it would let a third
        process lock a fresh file of the same name, and two writers would each hold "the" lock.
        """
        if not self.path.exists():
            return False
        with FileLock(str(self.lock_path), timeout=LOCK_TIMEOUT_S):
            existed = self.path.exists()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        return existed


def _write_atomic(path: Path, document: dict) -> None:
    """Replace `path` by `document`'s JSON through a temporary file: the permissions of the file
    it replaces, else those the umask gives a new file."""
    temporary = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.flush()
            with contextlib.suppress(FileNotFoundError):
                os.chmod(handle.fileno(), path.stat().st_mode & 0o7777)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def kernel_section(document: Optional[dict], kernel: str, source_hash: str) -> Optional[dict]:
    """The section of `kernel` when it was tuned for the running kernel source, else None."""
    if document is None:
        return None
    section = document["kernels"].get(kernel)
    if section is None or section["source_hash"] != source_hash:
        return None
    return section


def is_stale(document: Optional[dict], kernel: str, source_hash: str) -> bool:
    """Whether `document` holds entries of `kernel` tuned for another version of its source."""
    if document is None or kernel not in document["kernels"]:
        return False
    return document["kernels"][kernel]["source_hash"] != source_hash


def entries(document: Optional[dict], kernel: str, source_hash: str) -> dict[str, Entry]:
    """Current (not stale) entries of `kernel`, by key."""
    section = kernel_section(document, kernel, source_hash)
    if section is None:
        return {}
    return {key: Entry.from_json(entry) for key, entry in section.get("entries", {}).items()}


def trials(document: Optional[dict], kernel: str, source_hash: str, key: str, shape: dict) -> dict[str, dict]:
    """Recorded candidate results of an unfinished tuning of `key` at `shape` (a launch shape's
    fields), by params id. Results timed at another shape of the same key are not returned."""
    section = kernel_section(document, kernel, source_hash)
    if section is None:
        return {}
    by_params = section.get("trials", {}).get(key, {})
    return {
        pid: {field: value for field, value in trial.items() if field != "shape"}
        for pid, trial in by_params.items()
        if trial.get("shape") == shape
    }


def _section_for_write(document: dict, kernel: str, source_hash: str) -> dict:
    section = kernel_section(document, kernel, source_hash)
    if section is None:
        section = {"source_hash": source_hash, "entries": {}, "trials": {}}
        document["kernels"][kernel] = section
    section.setdefault("entries", {})
    section.setdefault("trials", {})
    return section


def put_trial(document: dict, kernel: str, source_hash: str, key: str, params: dict, result: dict, shape: dict) -> None:
    """Record one candidate's result (`{"ms": t}` or `{"error": text}`) at `shape` for an unfinished
    key, dropping the key's results of any other shape (times of two shapes do not compare)."""
    section = _section_for_write(document, kernel, source_hash)
    by_params = section["trials"].setdefault(key, {})
    if any(trial.get("shape") != shape for trial in by_params.values()):
        by_params.clear()
    by_params[params_id(params)] = {**result, "shape": shape}


def put_entry(document: dict, kernel: str, source_hash: str, key: str, entry: Entry) -> None:
    """Store the tuned entry of `key` and drop its trials."""
    section = _section_for_write(document, kernel, source_hash)
    section["entries"][key] = entry.to_json()
    section["trials"].pop(key, None)
