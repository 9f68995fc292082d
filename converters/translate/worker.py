"""Translations in a second process: a conversion's exact-grid twin is translated and converted
there while this process translates, converts and checks the model itself (docs/LCE_NOTES.md
"Conversion time").

LCE's converter holds Python's GIL for the whole of its run (seconds for a model of tens of
millions of weights), so a thread converts nothing in parallel: a process does.
`TranslationWorker` runs `python -m bnnexport.converters.translate.worker`, which imports
TensorFlow and LCE at once (while the parent normalises), then answers each request, a
serialized ONNX model and `translate`'s keyword arguments, with its `Translated`. Requests and
answers are pickles on the child's stdin and stdout, and the child writes nothing else there.

`in_background(model, **kwargs)` returns a `Pending` whose `result()` is the `Translated`: the
worker's, or, where there is no worker or it failed in any way (died, answered with an error),
`translate`'s in this process, which raises the error itself. The answer is the same either way
(the translation is deterministic: tests/converters/translate/test_worker.py compares them);
only when it is ready differs. One request is in flight at a time; a `Pending` given up before
its result was read (`cancel`) ends the worker, and the next request starts a fresh one. The
child ignores Ctrl-C (its parent ends it) and ends when its stdin closes.

Example:
    >>> worker = TranslationWorker()                                  # doctest: +SKIP
    >>> pending = in_background(model, worker, float_model=False)      # doctest: +SKIP
    >>> pending.result().flatbuffer == translate(model, False).flatbuffer  # doctest: +SKIP
    True
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import onnx
from bnnexport.converters.translate.onnx_to_tflite import (
    Translated,
    import_tensorflow_and_lce,
    translate,
)

# the second process pays off where the twin's translation takes seconds: from this size of the
# ONNX model on, with a second core, and with memory for a second conversion at its peak (about
# 16x the weights, docs/LCE_NOTES.md "Conversion memory") to spare
MIN_MODEL_BYTES = 4 << 20
PEAK_MEMORY_FACTOR = 24


class TranslationWorker:
    """The child process that translates (module doc); started at once, it imports TensorFlow
    and LCE while its parent goes on."""

    def __init__(self) -> None:
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # an error is raised again by the local translation
        )
        self._sending: threading.Thread | None = None
        self.busy = False
        self._closed = False

    def alive(self) -> bool:
        """Whether the child still runs and takes requests."""
        return not self._closed and self._child.poll() is None

    def submit(self, model: bytes, kwargs: dict[str, Any]) -> Callable[[], Translated | None]:
        """Send one request (written by a thread: the child may still be importing) and return
        what reads its answer: the `Translated`, or None where the worker failed."""
        self.busy = True
        self._sending = threading.Thread(target=self._send, args=((model, kwargs),), daemon=True)
        self._sending.start()
        return self._answer

    def _send(self, request: tuple[bytes, dict[str, Any]]) -> None:
        try:
            pickle.dump(request, self._child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._child.stdin.flush()
        except OSError:  # the child died; its answer is then None
            pass

    def _answer(self) -> Translated | None:
        if self._sending is not None:
            self._sending.join()
        try:
            status, value = pickle.load(self._child.stdout)
        except Exception:  # noqa: BLE001 (a dead child, a broken pipe: translate here instead)
            self.close()
            return None
        self.busy = False
        return value if status == "ok" else None

    def wait(self, timeout: float) -> int | None:
        """The child's exit code once it has ended, within `timeout` seconds (None: it runs)."""
        try:
            return self._child.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """End the child without waiting for it: SIGTERM, on which it removes its temporary
        SavedModel and exits as soon as the converter call it may be in returns (it also ends
        by itself when this process ends and its stdin closes)."""
        if not self._closed and self._child.poll() is None:
            self._child.terminate()
        self._closed = True


_shared: list[TranslationWorker] = []  # the process's one worker, started on first use


def shared_worker() -> TranslationWorker:
    """This process's worker, started on first use and again after it ended or was given up."""
    if not _shared or not _shared[0].alive() or _shared[0].busy:
        if _shared:
            _shared.pop().close()
        _shared.append(TranslationWorker())
    return _shared[0]


def worthwhile(model_bytes: int) -> bool:
    """Whether a model of `model_bytes` is translated faster with the worker's help: large
    enough, a second core to run on, memory for both conversions at once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        model_bytes >= MIN_MODEL_BYTES
        and (cores or 1) >= 2
        and available_memory() >= PEAK_MEMORY_FACTOR * model_bytes
    )


def available_memory() -> int:
    """The memory available to a new process, in bytes (Linux's MemAvailable; 0 elsewhere, so
    nothing is started where it cannot be told)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Pending:
    """A translation under way in the worker (or to be made here, without one): `result()`."""

    def __init__(
        self,
        model: onnx.ModelProto,
        kwargs: dict[str, Any],
        worker: TranslationWorker | None,
    ) -> None:
        self.model, self.kwargs = model, kwargs
        self._worker = worker
        self._answer = worker.submit(model.SerializeToString(), kwargs) if worker else None
        self._result: Translated | None = None

    @property
    def in_worker(self) -> bool:
        """Whether the translation was sent to the worker."""
        return self._answer is not None

    def result(self) -> Translated:
        """The `Translated`: the worker's answer, or this process's translation."""
        if self._result is None:
            answer, self._answer = self._answer, None
            found = answer() if answer is not None else None
            self._result = found if found is not None else translate(self.model, **self.kwargs)
        return self._result

    def cancel(self) -> None:
        """Give the translation up: a worker still busy with it is ended."""
        if self._answer is not None and self._worker is not None:
            self._answer = None
            self._worker.close()


def in_background(
    model: onnx.ModelProto, worker: TranslationWorker | None = None, **kwargs: Any
) -> Pending:
    """`translate(model, **kwargs)` started in `worker` (None: made here on `result()`)."""
    return Pending(model, kwargs, worker)


def main() -> None:
    """The child: import TensorFlow and LCE, then answer requests until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's to end
    signal.signal(signal.SIGTERM, _exit_cleanly)  # `close`: leave no temporary SavedModel
    requests, answers = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing but answers reaches the answers' pipe
    import_tensorflow_and_lce()
    while True:
        try:
            model, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            answer: tuple[str, Any] = ("ok", translate(onnx.load_from_string(model), **kwargs))
        except Exception as error:  # noqa: BLE001 (the parent translates again and raises it)
            answer = ("error", f"{type(error).__name__}: {error}")
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


def _exit_cleanly(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)  # unwinds through `translate`'s temporary directory, which removes it


if __name__ == "__main__":
    main()
