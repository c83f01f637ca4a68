"""Crash-guarded work for the coverage tool: a fresh process per job, forked workers per item.

Building the graph calls thousands of ops on guessed arguments, and a meta kernel can take
the process down (a segfault, a SIGFPE); so the work runs in a fresh process
(:func:`run_job`, which also keeps the caller's threads and imports out of it), and that
process forks workers (:func:`guarded_map`) whose crash costs one item, not the run.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

from eagerdecomp.errors import EagerDecompError

__all__ = ["guarded_map", "run_job", "ProgressBar"]


class ProgressBar:
    """``label [#####-----] 1234/3110 (40%), 52 s, about 78 s left`` on ``stream``.

    On a terminal the line is redrawn in place (at most a few times a second); on a pipe or
    a log, where a carriage return would pile up, a line is written at each tenth instead.
    """

    def __init__(self, stream, label: str, width: int = 30, prefix: str = ""):
        self.stream, self.label, self.width, self.prefix = stream, label, width, prefix
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.total = 0
        self.t0 = time.monotonic()
        self._drawn = 0.0  # when the terminal line was last drawn
        self._tenth = -1  # the last tenth written as a line
        self._open = False  # a terminal line without its newline yet

    def start(self, total: int, label: str | None = None) -> None:
        """A new count to ``total`` (a new phase, or round of analysis), under ``label`` if given."""
        self.interrupt()
        self.total, self.t0, self._tenth, self._drawn = total, time.monotonic(), -1, 0.0
        self.label = label or self.label

    def update(self, done: int) -> None:
        """Show ``done`` of the total."""
        if not self.total:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._drawn < 0.2 and done < self.total:
                return
            self._drawn = now
            self.stream.write("\r" + self._text(done, now))
            self._open = done < self.total
            if not self._open:
                self.stream.write("\n")
        else:
            tenth = done * 10 // self.total
            if tenth == self._tenth:
                return
            self._tenth = tenth
            self.stream.write(self._text(done, now) + "\n")
        self.stream.flush()

    def interrupt(self) -> None:
        """End a half-drawn terminal line, so that a message printed next starts on its own."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def _text(self, done: int, now: float) -> str:
        filled = self.width * done // self.total
        spent = now - self.t0
        bar = "#" * filled + "-" * (self.width - filled)
        text = f"{self.prefix}{self.label} [{bar}] {done}/{self.total} ({100 * done // self.total}%), {spent:.0f} s"
        if 0 < done < self.total:
            text += f", about {spent * (self.total - done) / done:.0f} s left"
        return text


def guarded_map(fn, items: list, workers: int, progress=None) -> dict:
    """``{item: fn(item)}``, computed in forked workers; an item whose call kills its worker
    maps to ``None`` and the rest of that worker's share goes on in a fresh fork.

    ``progress`` (a callable taking a message) is told each round's count; where it has a
    ``bar`` attribute (a :class:`ProgressBar`), the bar follows the items as they finish."""
    results: dict = {}
    pending = list(items)
    total = len(items)
    bar = getattr(progress, "bar", None)
    if bar is not None:
        bar.start(total, "analysing ops")
    while pending:
        shares = [pending[i::workers] for i in range(workers)]
        running = []
        # NOTE: the results come back in files read once a worker has exited (a crash leaves
        # them readable up to the item that crashed); the count for the bar comes sooner,
        # one byte per finished item on a pipe that every worker of this round shares
        ticks_r, ticks_w = os.pipe()
        for share in filter(None, shares):
            fd, path = tempfile.mkstemp(prefix="eagerdecomp-cov-")
            os.close(fd)
            pid = os.fork()
            if pid == 0:  # the worker: one record before and one after each item
                code = 0
                try:
                    os.close(ticks_r)
                    with open(path, "ab", buffering=0) as out:
                        for i, item in enumerate(share):
                            out.write(pickle.dumps(("start", i)))
                            try:
                                result = fn(item)
                            except Exception as e:  # noqa: BLE001
                                result = e
                            out.write(pickle.dumps(("done", i, result)))
                            os.write(ticks_w, b".")
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            running.append((pid, path, share))
        os.close(ticks_w)
        _follow(ticks_r, bar, len(results))
        os.close(ticks_r)
        pending = []
        for pid, path, share in running:
            os.waitpid(pid, 0)
            started, done = -1, set()
            with open(path, "rb") as f:
                while True:
                    try:
                        record = pickle.load(f)
                    except EOFError:
                        break
                    except Exception:  # noqa: BLE001 - a record cut short by the crash
                        break
                    if record[0] == "start":
                        started = record[1]
                    else:
                        done.add(record[1])
                        results[share[record[1]]] = record[2]
            os.unlink(path)
            if started >= 0 and started not in done:
                results[share[started]] = None  # it took the worker down
            pending += [item for i, item in enumerate(share) if i > started and i not in done]
        if bar is not None:
            bar.update(len(results))
        elif progress:
            progress(f"analysed {len(results)}/{total} ops")
    return results


def _follow(ticks: int, bar, before: int) -> None:
    """Read the workers' ticks until every worker has closed the pipe (exited or crashed)."""
    done = before
    while True:
        chunk = os.read(ticks, 4096)  # blocks until a tick, or b"" once every worker is gone
        if not chunk:
            return
        done += len(chunk)
        if bar is not None:
            bar.update(done)


def run_job(
    job: dict,
    quiet: bool = False,
    entry: str = "eagerdecomp.coverage.graph:_serve",
    what: str = "building the coverage graph",
) -> dict:
    """Run ``entry`` (``module:function``) in a fresh Python process with ``job`` (JSON) in
    ``argv[1]``; it writes its JSON answer to the path in ``argv[2]``, which is returned."""
    module, fn = entry.split(":")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        proc = subprocess.run(
            [sys.executable, "-c", f"from {module} import {fn}; {fn}()", json.dumps(job), out],
            env=env,
            stderr=subprocess.PIPE if quiet else None,
            text=True,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or "")[-2000:] if quiet else "(see the output above)"
            raise EagerDecompError(f"{what} failed (exit code {proc.returncode}): {tail}")
        with open(out) as f:
            return json.load(f)
