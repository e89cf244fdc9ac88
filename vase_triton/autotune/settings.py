"""The environment switches of autotuning (README, "Environment variables").

- `VASE_AUTOTUNE`: `off` (heuristics only), `cached` (stored configurations where they
  exist, else the heuristics), `online` (as `cached`, and a launch whose key has no entry
  tunes it on first use and stores the result). Default: `cached` on GPUs and `off` under
  the Triton interpreter, whose timings mean nothing; setting it explicitly turns lookups
  on under the interpreter too (tests do).
- `VASE_AUTOTUNE_DIR`: the user's store directory; default
  `$XDG_CACHE_HOME/vase_triton/autotune`, else `~/.cache/vase_triton/autotune`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vase_triton.backend import interpreter_enabled

MODES = ("off", "cached", "online")
# Tuned results shipped with the package; a user file for the same device takes precedence.
PACKAGED_DIRECTORY = Path(__file__).resolve().parent / "configs"


def autotune_mode() -> str:
    """The lookup mode from `VASE_AUTOTUNE` (see the module docstring)."""
    raw = os.environ.get("VASE_AUTOTUNE", "").strip().lower()
    if not raw:
        return "off" if interpreter_enabled() else "cached"
    if raw not in MODES:
        raise ValueError(f"VASE_AUTOTUNE: expected one of {', '.join(MODES)}; got {raw!r}")
    return raw


def store_directory() -> Path:
    """The user's store directory from `VASE_AUTOTUNE_DIR` (see the module docstring).

    Raises ValueError, naming the variable, when it cannot be resolved (a `~` without a home
    directory), cannot be looked at (a parent without permission, a name too long) or names
    something that is not a directory.
    """
    configured = os.environ.get("VASE_AUTOTUNE_DIR", "").strip()
    cache_home = os.environ.get("XDG_CACHE_HOME", "").strip()
    try:
        if configured:
            directory = Path(configured).expanduser()
        else:
            base = Path(cache_home).expanduser() if cache_home else Path.home() / ".cache"
            directory = base / "vase_triton" / "autotune"
    except RuntimeError as error:  # no home directory to expand `~` to
        given = f"got {configured!r}" if configured else "it is not set"
        raise ValueError(f"VASE_AUTOTUNE_DIR: expected a directory path ({error}); {given}") from None
    try:
        is_directory = stat.S_ISDIR(directory.stat().st_mode)
    except FileNotFoundError:  # made when a result is first stored
        return directory
    except OSError as error:  # a parent without permission, a name too long, ...
        raise ValueError(
            f"VASE_AUTOTUNE_DIR: expected a usable directory; got {str(directory)!r} ({error.strerror or error})"
        ) from None
    if not is_directory:
        raise ValueError(f"VASE_AUTOTUNE_DIR: expected a directory; got {str(directory)!r}, which is not one")
    return directory
