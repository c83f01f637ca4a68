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

from eagerdecomp.errors import EagerDecompError

__all__ = ["guarded_map", "run_job"]


def guarded_map(fn, items: list, workers: int, progress=None) -> dict:
    """``{item: fn(item)}``, computed in forked workers; an item whose call kills its worker
    maps to ``None`` and the rest of that worker's share goes on in a fresh fork."""
    results: dict = {}
    pending = list(items)
    total = len(items)
    while pending:
        shares = [pending[i::workers] for i in range(workers)]
        running = []
        for share in filter(None, shares):
            fd, path = tempfile.mkstemp(prefix="eagerdecomp-cov-")
            os.close(fd)
            pid = os.fork()
            if pid == 0:  # the worker: one record before and one after each item
                code = 0
                try:
                    with open(path, "ab", buffering=0) as out:
                        for i, item in enumerate(share):
                            out.write(pickle.dumps(("start", i)))
                            try:
                                result = fn(item)
                            except Exception as e:  # noqa: BLE001
                                result = e
                            out.write(pickle.dumps(("done", i, result)))
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            running.append((pid, path, share))
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
            if progress:
                progress(f"analysed {len(results)}/{total} ops")
    return results


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
