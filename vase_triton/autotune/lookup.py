"""Run-time lookup of tuned configurations, called by every launcher on every launch.

`tuned_params(kernel, shape, device)` returns the stored parameters for a launch (the
entry of the shape's key, else the nearest stored bucket within `MAX_DISTANCE` octaves),
or None, and the launcher then uses its heuristic. The answer is memoised per (kernel,
shape, device): after the first launch of a shape a lookup is one dictionary access,
with no file I/O, no environment read, no device query and no synchronisation, so it is
safe on the decode hot path, under `torch.compile` (the ops are opaque custom ops) and
during CUDA graph capture. `VASE_AUTOTUNE` and `VASE_AUTOTUNE_DIR` are read at the first
launch and stored files once per process and device; `reset()` forgets all of it.

In `online` mode a key without an entry is tuned at its first launch on a CUDA device
outside graph capture and compilation, and stored; a launch inside them takes the
heuristic and leaves the answer unmemoised. No failure here ever breaks a launch: an
unusable file or store directory, a stale or invalid entry, or a failed online tuning
falls back to the heuristic.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from vase_triton.autotune import settings, shapes, store
from vase_triton.autotune.device import DeviceProfile, profile_for
from vase_triton.backend import interpreter_enabled

# Farthest stored bucket a lookup may borrow, in octaves summed over the key's sizes.
MAX_DISTANCE = 3.0

_log = logging.getLogger(__name__)
_memo: dict[tuple, Optional[dict]] = {}
_MISSING = object()
_DEFERRED = object()  # online tuning put off to a later launch: the answer is not memoised
_views: dict[tuple, "StoreView"] = {}
_fitted: dict[tuple, dict] = {}  # heuristics stepped down to fit a device (`fitted_heuristic`)


class Found(NamedTuple):
    """A stored entry for a wanted key: the key it is stored under and where it came from."""

    key: str
    entry: store.Entry
    origin: str


class StoreView:
    """The entries of one device: packaged configurations overlaid by the user's file."""

    def __init__(self, profile: DeviceProfile, directory: Optional[Path]):
        self.profile = profile
        self.user_file = store.StoreFile(directory, profile) if directory is not None else None
        self.documents = {
            "packaged": store.StoreFile(settings.PACKAGED_DIRECTORY, profile).read(),
            "user": self.user_file.read() if self.user_file is not None else None,
        }
        self._parsed: dict[tuple, dict[str, tuple[dict, store.Entry, str]]] = {}

    def _entries(self, kernel: str, source_hash: str) -> dict[str, tuple[dict, store.Entry, str]]:
        cache_key = (kernel, source_hash)
        if cache_key not in self._parsed:
            merged = {}
            for origin in ("packaged", "user"):
                document = self.documents[origin]
                if origin == "user" and store.is_stale(document, kernel, source_hash):
                    store.warn_once(
                        ("stale", str(self.user_file.path), kernel, source_hash),
                        f"vase_triton autotune: entries of {kernel} in {self.user_file.path} were tuned for another "
                        "version of its kernel source and are ignored; run `vase-triton autotune` again",
                    )
                for key, entry in store.entries(document, kernel, source_hash).items():
                    merged[key] = (shapes.parse_key(key), entry, origin)
            self._parsed[cache_key] = merged
        return self._parsed[cache_key]

    def find(self, kernel: str, key: str, source_hash: str) -> Optional[Found]:
        """The entry of `key`, else the nearest one within `MAX_DISTANCE` (ties: the first key in order)."""
        available = self._entries(kernel, source_hash)
        if key in available:
            _, entry, origin = available[key]
            return Found(key, entry, origin)
        wanted = shapes.parse_key(key)
        best, best_distance = None, math.inf
        for stored_key in sorted(available):
            distance = shapes.key_distance(wanted, available[stored_key][0])
            if distance < best_distance:
                best, best_distance = stored_key, distance
        if best is None or best_distance > MAX_DISTANCE:
            return None
        _, entry, origin = available[best]
        return Found(best, entry, origin)

    def add(self, kernel: str, source_hash: str, key: str, entry: store.Entry) -> None:
        """Make a freshly tuned entry visible to this process's lookups."""
        self._entries(kernel, source_hash)[key] = (shapes.parse_key(key), entry, "user")


def store_view(profile: DeviceProfile, directory: Optional[Path]) -> StoreView:
    """The (memoised) view of `profile`'s stored entries in `directory` (None: none) and the packaged configurations."""
    cache_key = (profile, str(directory), str(settings.PACKAGED_DIRECTORY))
    if cache_key not in _views:
        _views[cache_key] = StoreView(profile, directory)
    return _views[cache_key]


class _Settings(NamedTuple):
    mode: str
    directory: Optional[Path]  # None: no usable user store (warned), packaged configurations only


_settings: Optional[_Settings] = None


def _read_settings() -> _Settings:
    global _settings
    mode = settings.autotune_mode()
    try:
        directory = settings.store_directory()
    except ValueError as error:
        directory = None
        if mode != "off":
            message = f"vase_triton autotune: {error}; no user store is read or written"
            store.warn_once(("directory", str(error)), message)
    _settings = _Settings(mode, directory)
    return _settings


def reset() -> None:
    """Forget memoised answers, loaded files and the environment settings (read again at the next launch).

    Call it after changing `VASE_AUTOTUNE` or `VASE_AUTOTUNE_DIR`, or the stored files, in a running process.
    """
    global _settings
    _settings = None
    _memo.clear()
    _views.clear()
    _fitted.clear()


def fitted_heuristic(kernel: str, shape: tuple, device: torch.device, params: dict) -> dict:
    """A heuristic's `params` for a launch of `shape` on CUDA `device`, stepped down where they
    would not fit it (`KernelSpace.fitted`); memoised per kernel, shape and device."""
    from vase_triton.autotune.spaces import SPACES

    memo_key = (kernel, shape, device.index)
    if memo_key not in _fitted:
        _fitted[memo_key] = SPACES[kernel].fitted(params, shape, profile_for(device))
    return _fitted[memo_key]


def mode() -> str:
    """The lookup mode in force (`VASE_AUTOTUNE`, read at the first launch or call)."""
    return (_settings or _read_settings()).mode


def tuned_params(kernel: str, shape: tuple, device: torch.device) -> Optional[dict]:
    """Stored parameters of `kernel` for a launch of `shape` on `device`, or None (use the heuristic)."""
    current = _settings or _read_settings()
    if current.mode == "off":
        return None
    memo_key = (kernel, shape, device.type, device.index)
    params = _memo.get(memo_key, _MISSING)
    if params is _MISSING:
        params = _resolve(kernel, shape, device, current)
        if params is _DEFERRED:
            return None
        _memo[memo_key] = params
    return params


def _resolve(kernel: str, shape: tuple, device: torch.device, current: _Settings) -> Optional[dict]:
    from vase_triton.autotune.spaces import SPACES

    if device.type != "cuda" and not (device.type == "cpu" and interpreter_enabled()):
        return None
    space = SPACES[kernel]
    profile = profile_for(device)
    # Stored files are validated when read; this guard keeps out of the launch any failure
    # that content the checks did not foresee could still cause.
    try:
        view = store_view(profile, current.directory)
        key, source_hash = space.key(shape), space.source_hash()
        found = view.find(kernel, key, source_hash)
        if found is not None:
            params = found.entry.winner.params
            if space.valid(params) and space.fits(params, shape, profile):
                return params
            store.warn_once(
                ("params", kernel, found.key, store.params_id(params)),
                f"vase_triton autotune: stored {kernel} configuration {store.params_id(params)} for {found.key} "
                f"is invalid or does not fit {profile.name} at {key}; using the heuristic",
            )
            return None
    except Exception as error:
        store.warn_once(
            ("lookup", kernel, type(error).__name__, str(error)),
            f"vase_triton autotune: reading the stored {kernel} configurations failed "
            f"({type(error).__name__}: {error}); using the heuristic",
        )
        return None
    if current.mode != "online" or device.type != "cuda" or view.user_file is None:
        return None
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return _DEFERRED  # tuned at the first launch of this shape outside them
    return _tune_online(kernel, shape, device, view)


def _tune_online(kernel: str, shape: tuple, device: torch.device, view: StoreView) -> Optional[dict]:
    from vase_triton.autotune.tuner import tune

    _log.info("vase_triton autotune: tuning %s for %s on first use", kernel, shape)
    # Tuning must never break the launch that asked for it (an unwritable store, memory
    # exhausted by the tuning inputs, ...): any failure leaves this key to the heuristic.
    try:
        with torch.cuda.device(device):  # the launches' GPU, which the current one need not be
            result = tune(kernel, shape, device, view.user_file)
    except Exception as error:
        store.warn_once(
            ("online", kernel, str(view.user_file.path), type(error).__name__),
            f"vase_triton autotune: online tuning of {kernel} failed ({type(error).__name__}: {error}); "
            "using the heuristic",
        )
        return None
    if result.entry is None:
        return None
    view.add(kernel, result.source_hash, result.key, result.entry)
    return result.entry.winner.params
