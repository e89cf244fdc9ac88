"""`math-verify` in a child process that is killed when one verdict overruns its time.

A grading thread cannot be stopped: sympy evaluating `3^{3^{16}}` sits in one C call that
holds the GIL for half a minute, so an abandoned thread stalls the whole evaluation and
keeps a core busy afterwards. A process can be killed. The child is a fresh interpreter that
runs this file alone (not the package, whose import would load torch: 0.8 s and 60 MB
instead of 3 s and 320 MB per start); it shares no CUDA context or locks with the caller
and never re-runs the caller's script. It starts on the first verdict and again after each
kill; its start-up, mostly imports, is waited for separately and never counts against a
verdict's time. `math-verify`'s own `signal.alarm` timeouts are off: the kill replaces them.
The child's address space is capped (`MEMORY_LIMIT_BYTES`, where the platform has
`setrlimit`): an answer whose evaluation would take more memory fails there with a
`MemoryError` and is an overrun, instead of driving the machine out of memory (where the
kernel's out-of-memory killer may pick the process holding the model).

The two talk in JSON lines: `[gold, answer]` in, `true`/`false` out (`"memory-limit"` for a
verdict that ran out of memory); the child's first line is `"ready"` once `math-verify` is
imported, or the import error's text.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import Optional, Union

START_TIMEOUT_S = 300.0
MEMORY_LIMIT_BYTES = 4 * 2**30
READY = "ready"
# `python -c` with this file's path as argv[1]: run as a script by path, the file would put its
# own directory first on sys.path, where the package's modules could shadow ones sympy imports.
RUN_BY_PATH = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


class Overrun(Enum):
    """A verdict that did not finish within the verifier's limits; false, as a wrong answer is."""

    TIME = "timeout"
    MEMORY = "memory-limit"

    def __bool__(self) -> bool:
        return False


def _math_verify(gold: str, answer: str) -> Union[bool, str]:
    """`verify(parse(gold), parse(answer))`, gold first (the relation is asymmetric); a parse
    or sympy failure is a wrong answer; running out of memory gives `Overrun.MEMORY.value`."""
    from math_verify import parse, verify

    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        answer_parsed = parse("\\boxed{" + answer + "}", parsing_timeout=None)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))
    except MemoryError:
        return Overrun.MEMORY.value
    except Exception:
        return False


def _cap_address_space(limit_bytes: int) -> None:
    """Lower this process's soft address-space limit to `limit_bytes` (never above the hard
    limit, which a soft one may not exceed); where the platform has no `setrlimit`, the time
    limit alone applies."""
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def serve(memory_limit_bytes: Optional[int]) -> None:
    """The child's loop over stdin until it closes, its address space capped at
    `memory_limit_bytes` (None: not capped), ignoring SIGINT. Anything else printed goes to
    stderr, so that stdout carries only the replies."""
    # Ctrl-C reaches the whole process group: the caller handles it and stops this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if memory_limit_bytes is not None:
        _cap_address_space(memory_limit_bytes)
    try:
        import math_verify
    except Exception as error:
        replies.write(json.dumps(f"{type(error).__name__}: {error}") + "\n")
        replies.flush()
        return
    logging.getLogger(math_verify.__name__).setLevel(logging.ERROR)
    replies.write(json.dumps(READY) + "\n")
    replies.flush()
    for line in sys.stdin:
        gold, answer = json.loads(line)
        replies.write(json.dumps(_math_verify(gold, answer)) + "\n")
        replies.flush()


def _forward(lines, replies: queue.Queue) -> None:
    """Put each line the child writes in `replies`, then None when its output ends."""
    with lines:
        for line in lines:
            replies.put(line)
    replies.put(None)


class VerifierStartError(RuntimeError):
    """The `math-verify` process did not start (not importable, or no answer in time)."""


class Verifier:
    """Verdicts of `math-verify` with a hard time limit each, in a process of capped memory.

    Use as a context manager (or call `close`) so the child process ends with the work.
    `memory_limit_bytes` caps the child's address space (None: no cap).
    """

    def __init__(
        self, start_timeout_s: float = START_TIMEOUT_S, memory_limit_bytes: Optional[int] = MEMORY_LIMIT_BYTES
    ):
        self.start_timeout_s = start_timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self._process: Optional[subprocess.Popen] = None
        self._replies: queue.Queue = queue.Queue()

    def verdict(self, gold: str, answer: str, timeout_s: float) -> Union[bool, Overrun]:
        """Whether `answer` equals `gold` per `math-verify`; `Overrun.TIME` when it takes over
        `timeout_s` seconds (the child is then killed and the next verdict starts a new one),
        `Overrun.MEMORY` when it needs more than `memory_limit_bytes`."""
        if self._process is None or self._process.poll() is not None:
            self.start()
        try:
            self._process.stdin.write(json.dumps([gold, answer]) + "\n")
            self._process.stdin.flush()
            reply = self._replies.get(timeout=min(timeout_s, threading.TIMEOUT_MAX))
        except (OSError, queue.Empty):  # a dead child (out of memory, killed) counts as an overrun
            reply = None
        if reply is None:
            self.close()
            return Overrun.TIME
        verdict = json.loads(reply)
        return Overrun(verdict) if isinstance(verdict, str) else bool(verdict)

    def start(self) -> None:
        """Start a new child process, as a verdict does when there is none: call it first to learn
        before any other work that `math-verify` cannot start (`VerifierStartError`, which says why)."""
        self.close()
        self._process = subprocess.Popen(
            [sys.executable, "-c", RUN_BY_PATH, str(Path(__file__).resolve()), json.dumps(self.memory_limit_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, encoding="utf-8",
        )
        self._replies = queue.Queue()
        threading.Thread(target=_forward, args=(self._process.stdout, self._replies), daemon=True,
                         name="vase-grading-replies").start()  # fmt: skip
        try:
            first = self._replies.get(timeout=self.start_timeout_s)
        except queue.Empty:
            first = json.dumps(f"no answer within {self.start_timeout_s:g} s")
        message = json.loads(first) if first is not None else f"it exited with code {self._process.wait()}"
        if message != READY:
            self.close()
            raise VerifierStartError(f"grading: the math-verify process did not start ({message})")

    def close(self) -> None:
        """Stop the child process, if any."""
        if self._process is not None:  # its output stream ends, and is closed, with its reader thread
            self._process.kill()
            self._process.wait()
            try:
                self._process.stdin.close()
            except OSError:  # a request the killed child never read
                pass
        self._process = None

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


if __name__ == "__main__":
    serve(json.loads(sys.argv[2]))
