"""The persistent kernel cache: traced kernels written to disk, loaded by the next process.

Where: ``cache_dir("kernels")/<fingerprint>/<key hash>.pkl`` (:mod:`eagerdecomp.paths`).
The fingerprint covers everything that decides a kernel besides its key: the torch
version, the eagerdecomp version and the bytes of its sources (its decompositions,
tracing and exactness rules), and the opset. A runtime built with
decompositions of the user's own (``EagerDecompMode(decompositions=...)`` or
:func:`eagerdecomp.register_decomposition`) does not use the disk at all: a Python
function's behaviour cannot be fingerprinted honestly (closures, globals).

What: exact-key kernels (:class:`~eagerdecomp.replay.Kernel`), shape families (every
member: graph, guard, output metadata), and the C++ hit path's programs
(:mod:`eagerdecomp.runtime.hits`) under the key words of the C++ library that made them, which
the next process installs before its first miss, so a warm process starts on C++ hits.
An entry holds the text of its key, which is compared on load, so a hash collision or
a stale layout reads as a miss.

Bundles. A store also reads the read-only kernel bundles ``EAGERDECOMP_BUNDLE`` names
(:mod:`eagerdecomp.runtime.bundle`): after its own folder, the bundle's folder of the same
fingerprint. It never writes, removes or packs there; an unreadable bundle entry is a miss.

Robustness. Writes go to a temporary file in the same folder, then ``os.replace``:
readers see a whole old entry or a whole new one, never a part, and two processes
writing at once leave one valid entry. An entry that cannot be read (corrupt,
truncated, written by an older format) is ignored with one warning per process,
removed, and rebuilt by tracing. ``EAGERDECOMP_DISK_CACHE=0`` turns the disk off.

Size. Shapes that change every call (a growing KV cache) write an entry per new exact key,
so the cache is bounded: at exit, a process that wrote entries keeps the newest
:data:`MAX_ENTRIES` files of its folder (``EAGERDECOMP_DISK_ENTRIES``), removing the
oldest written down to three quarters of that. A removed entry is a miss, traced again.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import itertools
import os
import pickle
import shutil
import sys
import threading
import warnings
import weakref
from pathlib import Path

import torch

from eagerdecomp.runtime import bundle
from eagerdecomp.runtime.paths import cache_dir
from eagerdecomp.runtime.quiet import quiet
from eagerdecomp.runtime.replay import Deferred

__all__ = ["enabled", "every_key", "Store", "store_for", "folder_name", "code_fingerprint", "flush", "clear"]

FORMAT = 5  # bumped when the entry layout or what a key means changes: older entries then read as stale
_warned = threading.Event()  # one warning per process for unreadable entries


def enabled() -> bool:
    """Off with ``EAGERDECOMP_DISK_CACHE=0``."""
    return os.environ.get("EAGERDECOMP_DISK_CACHE", "1") != "0"


def every_key() -> bool:
    """``EAGERDECOMP_DISK_EVERY_KEY=1`` (``cache build`` sets it): the exact keys a proved shape
    family answers are written too (kernel entry and C++ program), so a bundle serves its
    workloads' keys from C++ at once. Otherwise they are not: the family answers them in any
    process, and a file per new length would cost a shape that changes every call."""
    return os.environ.get("EAGERDECOMP_DISK_EVERY_KEY", "0") == "1"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """torch's version, ours, and the bytes of our sources (a decomposition edited in place changes it)."""
    from eagerdecomp import __version__

    h = hashlib.sha256(f"{torch.__version__}|{__version__}|{FORMAT}".encode())
    root = Path(__file__).parent.parent  # the package: every subpackage's sources
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _op_from_name(name: str):
    ns, rest = name.split(".", 1)
    packet, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, ns), packet), overload)


@functools.cache
def _namedtuple(module: str, name: str, fields: tuple):
    """A stand-in for a namedtuple class made at runtime (torch's refs return types):
    same name and fields, one class per process."""
    import collections

    cls = collections.namedtuple(name.rsplit(".", 1)[-1], fields)
    cls.__module__ = module
    return cls


class _Pickler(pickle.Pickler):
    # NOTE: an output spec may name a namedtuple class created at runtime, which pickle
    # cannot find by name; it is written as its name and fields instead.
    def reducer_override(self, obj):
        if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields"):
            if getattr(sys.modules.get(obj.__module__), obj.__qualname__, None) is not obj:
                return _namedtuple, (obj.__module__, obj.__qualname__, tuple(obj._fields))
        return NotImplemented


def _dumps(obj) -> bytes:
    import io

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class _Ref:
    """A graph node named in another node's arguments."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return _Ref, (self.name,)


def _target_data(target):
    if isinstance(target, torch._ops.OpOverload):
        return ("op", str(target))
    if isinstance(target, str):
        return ("attr", target)
    return ("fn", target.__module__, target.__qualname__)


def _target_from(data):
    if data[0] == "op":
        return _op_from_name(data[1])
    if data[0] == "attr":
        return data[1]
    import importlib

    obj = importlib.import_module(data[1])
    for part in data[2].split("."):
        obj = getattr(obj, part)
    return obj


def _graph_data(graph) -> list:
    """The graph as plain data: (op, name, target, args, kwargs) per node, nodes named by _Ref.

    NOTE: not FX's own pickling, which traces the generated code again on load (and so
    cannot load code that calls a plain Python function on a size).
    """
    import torch.fx as fx

    def plain(a):  # FX's immutable lists and dicts become plain ones; nodes become _Refs
        if isinstance(a, fx.Node):
            return _Ref(a.name)
        if isinstance(a, tuple):
            return tuple(plain(x) for x in a)
        if isinstance(a, list):
            return [plain(x) for x in a]
        if isinstance(a, dict):
            return {k: plain(v) for k, v in a.items()}
        return a

    return [(n.op, n.name, _target_data(n.target), plain(n.args), plain(n.kwargs)) for n in graph.nodes]


def _graph_from(data, constants: dict, class_name: str, op_name: str):
    import torch.fx as fx

    graph = fx.Graph()
    env: dict = {}

    def resolve(a):
        if isinstance(a, _Ref):
            return env[a.name]
        if type(a) in (list, tuple):
            return type(a)(resolve(x) for x in a)
        if type(a) is dict:
            return {k: resolve(v) for k, v in a.items()}
        return a

    for op, name, target, args, kwargs in data:
        env[name] = graph.create_node(op, _target_from(target), resolve(args), resolve(kwargs), name=name)
    graph._co_fields = {"co_filename": f"<eagerdecomp kernel {op_name}>"}
    return Deferred(graph, constants, class_name)  # the module is made if the kernel runs in Python


def _kernel_data(kernel) -> dict:
    return {
        "op": str(kernel.op),
        "graph": _graph_data(kernel.graph),
        "class": kernel.class_name,
        "constants": dict(kernel.constants),
        "spec": kernel.spec,
        "warnings": [text for text, _ in kernel.warnings],
        "fixups": list(kernel.fixups),
        "ints": list(kernel.ints),
    }


def _kernel_from(data: dict):
    from eagerdecomp.runtime.replay import Kernel

    module = _graph_from(data["graph"], data["constants"], data["class"], data["op"])
    spec = data["spec"]
    kernel = Kernel(
        _op_from_name(data["op"]), module, spec, [(t, UserWarning) for t in data["warnings"]], data["fixups"]
    )
    kernel.ints = tuple(tuple(p) for p in data["ints"])
    return kernel


def _member_data(member) -> dict:
    return {
        "kernel": _kernel_data(member.kernel),
        "guard": member.guard.source,
        "sources": dict(member.sources),
        "metas": member.metas,
        "shares": member.shares,
        "unproven": member.unproven,
    }


def _member_from(data: dict):
    from eagerdecomp.runtime.family import Member
    from eagerdecomp.runtime.symbolic import Guard

    kernel, guard = _kernel_from(data["kernel"]), Guard(data["guard"])
    return Member(kernel, guard, data["sources"], data["metas"], data["shares"], data["unproven"])


class Store:
    """The entries of one (code, opset) fingerprint: one folder, and the same fingerprint's
    folders of read-only bundles (``bundles``), read after it."""

    def __init__(self, folder: Path, bundles: tuple = ()):
        import cachetools

        self.folder = folder
        self.bundles = tuple(bundles)
        self._lock = threading.Lock()
        self._loaded = cachetools.LRUCache(maxsize=4096)  # kernel id -> Kernel read from disk
        self._ids = cachetools.LRUCache(maxsize=4096)  # id(Kernel) -> (Kernel, kernel id)
        self._new_programs: set = set()  # library builds this process wrote programs for
        self._wrote = False  # whether this process wrote entries (checked against the bound at exit)
        _STORES.add(self)

    def _path(self, text: str, folder: Path | None = None) -> Path:
        return (folder or self.folder) / (hashlib.sha256(text.encode()).hexdigest()[:40] + ".pkl")

    def _load(self, path: Path, kind):
        """The whole entry at ``path`` (a dict) of ``kind`` (or one of a tuple of kinds), or
        None: missing, or unreadable (dropped)."""
        kinds = kind if type(kind) is tuple else (kind,)
        try:
            with open(path, "rb") as f, quiet():  # unpickling torch objects may warn (deprecations)
                entry = pickle.load(f)
            if not (isinstance(entry, dict) and entry.get("format") == FORMAT and entry.get("kind") in kinds):
                raise ValueError("written by another format")
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 - any unreadable entry is ignored and rebuilt
            self._drop(path, e)
            return None
        return entry

    def _find(self, text: str, kind: str):
        """``(data, path)`` of ``text``'s entry: our folder's, else the first bundle's that has it."""
        for folder in (self.folder, *self.bundles):
            path = self._path(text, folder)
            entry = self._load(path, kind)
            if entry is not None and entry.get("key") == text:  # (another key with the same hash: a miss)
                return entry["data"], path
        return None, None

    def _read(self, text: str, kind: str):
        return self._find(text, kind)[0]

    def _drop(self, path: Path, error: Exception) -> None:
        if not _warned.is_set():
            _warned.set()
            warnings.warn(
                f"eagerdecomp: ignoring an unreadable kernel cache entry {path} ({type(error).__name__}: {error}); "
                "it is traced again (further such entries are ignored silently)",
                RuntimeWarning,
                stacklevel=2,
            )
        if path.parent == self.folder or self.folder in path.parents:  # a bundle's files are never removed
            try:
                path.unlink()
            except OSError:
                pass

    def _write(self, text: str, kind: str, make_data, path: Path | None = None) -> None:
        if _write_entry(path or self._path(text), text, kind, make_data):
            self._wrote = True

    # -- kernels of exact keys -------------------------------------------------------------
    # NOTE: a key's entry names its kernel by content; the kernel is a file of its own. Many keys
    # answered by one shape-generic kernel then share one file on disk and one Kernel in memory.
    def load_kernel(self, key):
        kid = self._read(repr(key.parts), "key")
        if kid is None:
            return None
        with self._lock:
            kernel = self._loaded.get(kid)
        if kernel is not None:
            return kernel
        data, path = self._find("kernel " + kid, "kernel")
        if data is None:
            return None
        try:
            with quiet():
                kernel = _kernel_from(data)
        except Exception as e:  # noqa: BLE001
            self._drop(path, e)
            return None
        with self._lock:
            self._loaded[kid] = kernel
            self._ids[id(kernel)] = (kernel, kid)
        return kernel

    def save_kernel(self, key, kernel) -> None:
        """Write ``kernel`` (once per content) and ``key``'s entry naming it."""
        with self._lock:
            known = self._ids.get(id(kernel))
        if known is None or known[0] is not kernel:
            try:
                data = _kernel_data(kernel)
                kid = hashlib.sha256(_dumps(data)).hexdigest()[:40]
            except Exception:  # noqa: BLE001 - cannot be written: memory only
                return
            # (a kernel a bundle holds is not copied: our key entry names it there). NOTE: a file
            # of ours is written again, once per process and kernel, though one may exist: that
            # one may be damaged, and a family answering the keys after it would never rewrite it
            if not any(self._path("kernel " + kid, f).exists() for f in self.bundles):
                self._write("kernel " + kid, "kernel", lambda: data)
            with self._lock:
                self._ids[id(kernel)] = (kernel, kid)
        else:
            kid = known[1]
        self._write(repr(key.parts), "key", lambda: kid)

    # -- shape families ----------------------------------------------------------------------
    def load_members(self, fkey) -> tuple:
        data, path = self._find(repr(fkey.parts), "family")
        if not data:
            return ()
        try:
            with quiet():
                return tuple(_member_from(d) for d in data)
        except Exception as e:  # noqa: BLE001
            self._drop(path, e)
            return ()

    def save_members(self, fkey, members) -> None:
        self._write(repr(fkey.parts), "family", lambda: [_member_data(m) for m in members])

    # -- the C++ hit path's programs (eagerdecomp.runtime.hits) -------------------------------------
    # NOTE: a program is filed under the C++ table's own key words, whose layout is the C++
    # library's: each build has its folder (``lib`` names it), never read by another build.
    # Programs are made in bursts (every op of a step at a new length): they are kept in memory
    # and written :data:`PROGRAM_BATCH` at a time, a loose file per batch (a file per program
    # was half of the disk time of a step at a new length, profiled). At exit a process packs
    # its folder into one file, which the next process reads whole before its first miss; a
    # process killed before then loses its last batch, which costs the next process a
    # specialization per key (its kernels are on disk), never a trace.
    def _programs(self, lib: str, folder: Path | None = None) -> Path:
        return (folder or self.folder) / f"programs-{lib}"

    def save_program(self, lib: str, entry: tuple) -> None:
        """Keep one program: ``(stack, op name, words, ...)``, filed by its first three; written
        with the next batch."""
        folder = self._programs(lib)
        key = repr(entry[:3])
        with _pending_lock:
            _SAVED.add(folder)
            batch = _PENDING.setdefault(folder, {})
            batch.pop(key, None)  # re-inserted: the newest come last
            batch[key] = entry
            full = len(batch) >= PROGRAM_BATCH
        with self._lock:
            self._new_programs.add(lib)
        if full:
            _write_batch(folder)

    def _read_programs(self, folder: Path) -> tuple:
        """``({key text: program}, loose files)`` of one programs folder: its pack, then loose
        files (a program or a batch of them), then those this process has not written yet."""
        packed = self._load(folder / "pack", "pack")
        entries = {repr(e[:3]): e for e in (packed["data"] if packed else ())}
        loose = sorted(folder.glob("[!.]*.pkl")) if folder.is_dir() else []
        for path in loose:
            entry = self._load(path, ("program", "programs"))
            if entry is None:
                continue
            for e in entry["data"] if entry["kind"] == "programs" else (entry["data"],):
                key = repr(e[:3])
                entries.pop(key, None)  # re-inserted: the newest come last
                entries[key] = e
        with _pending_lock:
            pending = list(_PENDING.get(folder, {}).items())
        for key, e in pending:
            entries.pop(key, None)
            entries[key] = e
        return entries, loose

    def load_programs(self, lib: str, pack: bool = False) -> list:
        """Every program of ``lib``'s folder (the pack, then loose files and those not written
        yet), after the bundles' (ours win); with ``pack``, also write ours as the new pack
        (the newest :data:`MAX_PROGRAMS`) and remove the loose files."""
        folder = self._programs(lib)
        if pack:
            with _pending_lock:  # packed below with the rest: no batch of their own
                pending = _PENDING.pop(folder, {})
        entries, loose = self._read_programs(folder)
        if pack:
            for key, e in pending.items():
                entries.pop(key, None)
                entries[key] = e
        own = list(entries.values())[-MAX_PROGRAMS:]
        if pack and (loose or pending):
            self._write(lib, "pack", lambda: own, folder / "pack")
            for path in loose:  # (a program written since it was listed stays loose)
                try:
                    path.unlink()
                except OSError:
                    pass
        if not self.bundles:
            return own
        merged: dict = {}
        for b in reversed(self.bundles):  # the first bundle wins over later ones, ours over all
            merged.update(self._read_programs(self._programs(lib, b))[0])
        merged.update((repr(e[:3]), e) for e in own)
        return list(merged.values())[-MAX_PROGRAMS:]

    def pack_programs(self) -> None:
        """Pack the folders this process wrote programs to (at exit)."""
        with self._lock:
            libs, self._new_programs = self._new_programs, set()
        for lib in libs:
            self.load_programs(lib, pack=True)

    def prune(self, limit: int | None = None) -> int:
        """Past ``limit`` entry files (default :data:`MAX_ENTRIES`), remove the oldest written
        down to three quarters of it; returns how many were removed."""
        limit = MAX_ENTRIES if limit is None else limit
        try:
            entries = [e for e in os.scandir(self.folder) if e.name.endswith(".pkl") and not e.name.startswith(".")]
        except OSError:
            return 0
        if len(entries) <= limit:
            return 0
        dated = []
        for e in entries:
            try:
                dated.append((e.stat().st_mtime_ns, e.path))
            except OSError:  # removed meanwhile (another process pruning)
                pass
        dated.sort()
        removed = 0
        for _, path in dated[: len(dated) - limit * 3 // 4]:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
        return removed


MAX_PROGRAMS = 4096  # programs kept per library build and fingerprint (the newest)
MAX_ENTRIES = int(os.environ.get("EAGERDECOMP_DISK_ENTRIES", "32768"))  # entry files per fingerprint
PROGRAM_BATCH = 64  # programs kept in memory per folder before they are written
_STORES: weakref.WeakSet[Store] = weakref.WeakSet()
# programs folder -> {key text: program} not written yet (shared by the stores of one folder)
_PENDING: dict = {}
_pending_lock = threading.Lock()
_SAVED: set = set()  # programs folders this process saved programs to
_made: set = set()  # folders this process made or found (each write need not ask again)
_names = itertools.count()  # temporary and batch file names, unique in this process


def _write_entry(path: Path, text: str, kind: str, make_data) -> bool:
    """Write one entry to ``path`` atomically; False where it cannot be (memory only then)."""
    try:
        payload = _dumps({"format": FORMAT, "kind": kind, "key": text, "data": make_data()})
    except Exception:  # noqa: BLE001 - a kernel that cannot be pickled stays in memory only
        return False
    parent = path.parent
    for attempt in (0, 1):
        try:
            if parent not in _made or attempt:
                parent.mkdir(parents=True, exist_ok=True)
                _made.add(parent)
            # NOTE: a name unique to this process and write, created exclusively: mkstemp's random
            # names cost a third of a write, and its mode 0600 would hide a bundle's files
            # from the other users it is shipped to (this one follows the umask)
            tmp = parent / f".tmp-{os.getpid()}-{threading.get_ident()}-{next(_names)}.pkl"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # the folder was removed since (cache_clear(disk=True)): make it again
            _made.discard(parent)
            continue
        except OSError:
            return False  # a read-only or full disk: the kernel stays in memory only
        try:
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
                os.replace(tmp, path)  # atomic: readers see the old entry or this one
                return True
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            return False
    return False


def _write_batch(folder: Path) -> None:
    """Write the programs of ``folder`` not written yet, as one loose file."""
    with _pending_lock:
        batch = _PENDING.pop(folder, None)
    if not batch:
        return
    name = f"batch-{os.getpid()}-{next(_names)}"
    if not _write_entry(folder / f"{name}.pkl", name, "programs", lambda: list(batch.values())):
        for key, e in batch.items():  # one that cannot be pickled: the others one by one
            _write_entry(folder / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.pkl", key, "program", lambda e=e: e)


def _write_pending() -> None:
    with _pending_lock:
        folders = list(_PENDING)
    for folder in folders:
        _write_batch(folder)


@atexit.register
def _pack_at_exit() -> None:
    try:
        _write_pending()  # (those of stores no longer alive too)
    except Exception:  # noqa: BLE001
        pass
    for store in list(_STORES):
        try:
            store.pack_programs()
            if store._wrote:
                store.prune()
        except Exception:  # noqa: BLE001 - the loose files stay; the next process reads them
            pass


# NOTE: as for the kernel caches: every store's lock is held across fork, so a child never
# sees a memo half-updated; the child then gets fresh locks (the held ones would stay held).
_FORK_HELD: list = []


def _before_fork() -> None:
    _FORK_HELD[:] = list(_STORES)
    for store in _FORK_HELD:
        store._lock.acquire()
    _pending_lock.acquire()


def _after_fork_in_parent() -> None:
    _pending_lock.release()
    for store in _FORK_HELD:
        store._lock.release()
    _FORK_HELD.clear()


def _after_fork_in_child() -> None:
    global _pending_lock
    _pending_lock = threading.Lock()
    for store in _FORK_HELD:
        store._lock = threading.Lock()
    _FORK_HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def folder_name(opset) -> str:
    """The folder of ``opset``'s entries under ``kernels/``: our sources' fingerprint and its ops."""
    h = hashlib.sha256(code_fingerprint().encode())
    for name in sorted(map(str, opset.ops)):
        h.update(name.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def store_for(opset, extra: dict) -> Store | None:
    """The store of a runtime over ``opset``; None when its table has decompositions of the user's."""
    from eagerdecomp.decompositions.registry import USER

    if extra or USER:
        return None
    name = folder_name(opset)
    return Store(cache_dir("kernels") / name, bundle.folders_for(name, opset.name, code_fingerprint()))


def flush() -> None:
    """Write and pack the programs every store of this process made, those of stores no longer
    alive too (at exit, only live stores pack): a bundle builder's last step."""
    with _pending_lock:
        folders = {(f.parent, f.name.removeprefix("programs-")) for f in _SAVED}
    for folder, lib in sorted(folders):
        Store(folder).load_programs(lib, pack=True)
    for store in list(_STORES):
        with store._lock:
            store._new_programs.clear()


def clear() -> None:
    """Remove every kernel written to disk (all fingerprints), and the compiled code Inductor
    keeps under our root for ``compile="inductor"`` (eagerdecomp.compiled)."""
    with _pending_lock:
        _PENDING.clear()
        _SAVED.clear()
    shutil.rmtree(cache_dir("kernels"), ignore_errors=True)
    shutil.rmtree(cache_dir("inductor"), ignore_errors=True)
