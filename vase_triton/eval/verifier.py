"""`math-verify` in a child process that is killed when one verdict overruns its time.

A grading thread cannot be stopped: sympy evaluating `3^{3^{16}}` sits in one C call that
holds the GIL for half a minute, so an abandoned thread stalls the whole evaluation and
keeps a core busy afterwards. A process can be killed. The child is started (spawned, so it
shares no CUDA context or locks with the caller) on the first verdict and again after each
kill; its start-up, mostly imports, is waited for separately and never counts against a
verdict's time. `math-verify`'s own `signal.alarm` timeouts are off: the kill replaces them.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import signal
from typing import Optional

START_TIMEOUT_S = 300.0


def _math_verify(gold: str, answer: str) -> bool:
    """`verify(parse(gold), parse(answer))`, gold first (the relation is asymmetric); a parse
    or sympy failure is a wrong answer."""
    from math_verify import parse, verify

    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        answer_parsed = parse("\\boxed{" + answer + "}", parsing_timeout=None)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))
    except Exception:
        return False


def _serve(connection) -> None:
    """The child's loop: `(gold, answer)` in, a bool out, until the pipe closes.

    The first message out is None once `math-verify` is imported, or the import error's text.
    Interrupts are left to the parent, which kills the child when it stops.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        importlib.import_module("math_verify")  # once, before the first timed verdict
    except Exception as error:
        connection.send(f"{type(error).__name__}: {error}")
        return
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    connection.send(None)
    while True:
        try:
            gold, answer = connection.recv()
        except EOFError:
            return
        connection.send(_math_verify(gold, answer))


class Verifier:
    """Verdicts of `math-verify` with a hard time limit each.

    Use as a context manager (or call `close`) so the child process ends with the work.
    """

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S):
        self.start_timeout_s = start_timeout_s
        self._process = None
        self._connection = None

    def verdict(self, gold: str, answer: str, timeout_s: float) -> Optional[bool]:
        """Whether `answer` equals `gold` per `math-verify`; None when it takes over `timeout_s`
        seconds (the child is then killed and the next verdict starts a new one)."""
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._connection.send((gold, answer))
            if self._connection.poll(timeout_s):
                return bool(self._connection.recv())
        except (EOFError, OSError):  # the child died mid-verdict (out of memory, killed): as an overrun
            pass
        self.close()
        return None

    def _start(self) -> None:
        self.close()
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_serve, args=(child_end,), name="vase-grading", daemon=True)
        process.start()
        child_end.close()
        self._process, self._connection = process, parent_end
        try:
            ready = parent_end.poll(self.start_timeout_s)
            message = parent_end.recv() if ready else f"no answer within {self.start_timeout_s:g} s"
        except EOFError:
            message = f"it exited with code {process.exitcode}"
        if message is not None:
            self.close()
            raise RuntimeError(f"grading: the math-verify process did not start ({message})")

    def close(self) -> None:
        """Stop the child process, if any."""
        if self._process is not None:
            self._connection.close()
            self._process.kill()
            self._process.join()
            self._process.close()
        self._process = self._connection = None

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
