"""The runtime: route one op call to pass-through, cached replay, eager decomposition,
native fallthrough or an error. Shared by the dispatch mode and the device switch.

Routes are decided once per op (by membership and op tags) and kept in a
dict, so a call costs one lookup before its real work.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import warnings

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from eagerdecomp.decompositions.registry import version as table_version
from eagerdecomp.decompositions.table import default_table
from eagerdecomp.errors import EagerDecompError, MismatchError, UnsupportedArgumentError, UnsupportedOpError
from eagerdecomp.ops.attribution import entry, warn_as_eager
from eagerdecomp.ops.checks import check
from eagerdecomp.ops.opset import OpSet, resolve_op
from eagerdecomp.ops.schema import returns_tensor
from eagerdecomp.runtime import hits, routes
from eagerdecomp.runtime.cache import Bypassed, ByValue, KernelCache, Unsupported, cache_for
from eagerdecomp.runtime.compiler import PENDING, compiler_for
from eagerdecomp.runtime.direct import Unfinished, run_direct, tiered
from eagerdecomp.runtime.disk import enabled as disk_enabled
from eagerdecomp.runtime.disk import every_key, store_for
from eagerdecomp.runtime.exact import (
    Refusal,
    _call,
    check_devices,
    concrete_fake_mode,
    fakes_like,
    layout_matters,
    reference,
    refused,
    relayout,
    unalias,
)
from eagerdecomp.runtime.family import (
    MAX_MEMBERS,
    Family,
    agrees,
    audit,
    family_key,
    int_paths,
    matches,
    read_ints,
    symint_positions,
)
from eagerdecomp.runtime.family import enabled as family_enabled
from eagerdecomp.runtime.fwad import below_forward_ad
from eagerdecomp.runtime.host import HostTier, device_of, untraceable
from eagerdecomp.runtime.key import Bypass, make_key
from eagerdecomp.runtime.lift import LiftRefused, lift_positions, split, wrapped_positions
from eagerdecomp.runtime.lower import Lowerer, Stuck
from eagerdecomp.runtime.miss import Answer, Miss
from eagerdecomp.runtime.observe import log, profiling, ranged
from eagerdecomp.runtime.quiet import issue_once, quiet, replay_once
from eagerdecomp.runtime.replay import Kernel
from eagerdecomp.runtime.stats import COMPILED, DISK, FAMILY, LIFTED, Route, Stats
from eagerdecomp.runtime.symbolic import NotGeneric
from eagerdecomp.runtime.trace import trace, trace_family

__all__ = ["Runtime", "runtime_for", "ON_UNSUPPORTED"]

ON_UNSUPPORTED = ("error", "fallthrough", "warn", "cpu")

# Ops whose outputs cannot be replayed from a kernel traced over fake tensors.
# NOTE: decided by tags, as FakeTensor's cache does, not by a hand list.
_BYPASS_TAGS = {
    torch.Tag.data_dependent_output: "data-dependent output",
    torch.Tag.dynamic_output_shape: "dynamic output shape",
}


def _unstrided_layout(args, kwargs):
    """The layout of the first tensor argument that is not strided (sparse, ...), or None."""
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor) and x.layout is not torch.strided:
            return x.layout
    return None


class Runtime:
    """Decomposes calls of ops outside ``opset``; one per mode or device switch.

    The kernel cache is shared by every runtime with the same opset and table.
    """

    def __init__(
        self, opset: OpSet, table: dict, cache: KernelCache, on_unsupported: str = "error", store=None, compiler=None
    ):
        if on_unsupported not in ON_UNSUPPORTED:
            raise EagerDecompError(f"on_unsupported must be one of {ON_UNSUPPORTED}, got {on_unsupported!r}")
        self.opset = opset
        self.ops = opset.ops  # a frozenset: the pass-through test is one hash lookup
        self.table = table
        self.cache = cache
        self.on_unsupported = on_unsupported
        self.hint = None  # an extra remedy for UnsupportedOpError, set by the caller that can offer one
        self.stats = Stats()
        self._routes: dict = {}
        self._lift: dict = {}  # op -> positions of floats to lift; () = key them by value
        self.composites: dict = {}  # op -> composite dispatch key to run when it has no path (device switch)
        self._tls = threading.local()  # per thread: a call from the mode's C++ key (cxx) and its program (offer)
        self.store = store  # the persistent kernel cache (eagerdecomp.disk), or None
        self.compiler = compiler  # compiles hot kernels (eagerdecomp.compiled), or None
        # the C++ hit path (eagerdecomp.runtime.hits): None on the pure-Python path; under compile=
        # the compiler's own table, whose programs may run compiled code
        self.hits, self.hit_counts = hits.table_for(self)
        self.stats.hits = self.hit_counts
        self.stats.kernels_of = cache.kernels_of  # what a kernel served only in C++ runs, for the report
        self.serves_device = False  # set by the device switch: programs go back to its C++ fallback
        self.host = HostTier() if on_unsupported == "cpu" else None  # the CPU tier (eagerdecomp.runtime.host)

    # -- routing -------------------------------------------------------------------
    @entry  # (eager's warnings raised below are attributed to the frame that called the op)
    def __call__(self, func, args, kwargs):
        route = self._routes.get(func)
        if route is None:
            route = self._routes[func] = self._route_for(func)
        try:
            return route(func, args, kwargs)
        except BaseException as e:
            # NOTE: PyTorch's dispatch guards restore the whole thread-local key set they
            # saw when made, and some are held by Python frames (Tensor.__repr__ holds one).
            # A frame kept alive by the traceback frees its guard after the dispatcher's own
            # guards have unwound, putting back the state inside this call for good (autograd
            # off in the whole thread). Freeing the failed call's frames here, before we
            # return into the dispatcher, keeps the guards in order.
            traceback.clear_frames(e.__traceback__)
            raise

    def _route_for(self, func):
        if func in self.ops:
            return self.passthrough
        route = routes.custom_route(func, self.table)  # collectives, infrastructure, custom ops
        if route is not None:
            return routes.handler(self, route)
        for tag, reason in _BYPASS_TAGS.items():
            if tag in func.tags:
                log.info("%s: decomposed eagerly on every call (%s)", func, reason)
                return lambda f, a, k, reason=reason: self.bypass(f, a, k, reason)
        if func._schema.returns and not returns_tensor(func):
            # NOTE: a Python value (bool, int...) that a kernel would bake in, right only when all
            # it reads is in the key; storage sizes and identities (is_set_to) are not
            return lambda f, a, k: self.bypass(f, a, k, "non-tensor output")
        if self.hits is None or self.serves_device:  # (the device's C++ fallback asked already)
            return self._decompose
        call, counts, miss, slow, tls = self.hits.call, self.hit_counts, hits.MISS, self._decompose, self._tls

        def decompose(func, args, kwargs):  # the C++ hit path first: one call, then Python on a miss
            if getattr(tls, "cxx", False):  # (the mode's C++ key asked already, keyed from its stack)
                return slow(func, args, kwargs)
            out = call(counts, func, args, kwargs)
            return slow(func, args, kwargs) if out is miss else out

        return decompose

    # -- routes --------------------------------------------------------------------
    def passthrough(self, func, args, kwargs):
        self.stats.passthrough(func)
        return func(*args, **kwargs)

    def via_cxx(self) -> bool:
        """Whether this call came from a C++ fallback (the device switch's, or the mode's key):
        it asked the table already, and takes the key's program back (``hits.offer``)."""
        return self.serves_device or getattr(self._tls, "cxx", False)

    def decompose(self, func, args, kwargs):
        """Replay the cached kernel for this call's key, tracing it on a miss."""
        if self.hits is not None and not self.via_cxx():
            out = self.hits.call(self.hit_counts, func, args, kwargs)  # a hit: keyed, found, replayed in C++
            if out is not hits.MISS:
                return out
        return self._decompose(func, args, kwargs)

    @below_forward_ad
    def _decompose(self, func, args, kwargs):
        """The Python path: key the call, look its entry up (a miss decides how it is made:
        direct, a family's kernel, the disk, a trace), run it; then install the key's program."""
        table = self.hits
        if table is not None and self.compiler is None and not self.cache.programs_read and self._store() is not None:
            # the first miss over this cache: install the programs earlier processes wrote
            if hits.preload(self) and not self.via_cxx():
                out = table.call(self.hit_counts, func, args, kwargs)
                if out is not hits.MISS:
                    return out
        lift = self._lift.get(func)
        if lift is None:
            lift = self._lift[func] = lift_positions(func) + wrapped_positions(func)
        lifted = ()
        key_args, key_kwargs = args, kwargs
        if lift:
            key_args, key_kwargs, lifted = split(lift, args, kwargs)
        try:
            key, tensors = make_key(func, key_args, key_kwargs)
        except Bypass as b:
            return self.bypass(func, args, kwargs, b.reason)
        miss = Miss(func, args, kwargs, (key_args, key_kwargs), key, tensors, lifted)
        entry, answer = self.cache.get_or_make(key, self._answer, miss)
        if answer is Answer.COLD:
            return self._direct(miss)
        if type(entry) is Kernel:
            return self._replay(miss, entry, answer)
        if type(entry) is ByValue:
            # its floats change the graph: key them by value from now on, in this runtime
            self._lift[func] = ()
            self.stats.keyed_by_value(func)
            return self._decompose(func, args, kwargs)
        cache = "hit" if answer is None else "miss"
        if type(entry) is Bypassed:
            try:
                return self._lower_eagerly(func, args, kwargs, entry.reason, cache)
            except Exception:
                if answer is not None:
                    # NOTE: eager refuses this call too (a bad argument, overlapping out=): the trace
                    # failed for the call, not the key, so later valid calls may still get a kernel
                    self.cache.discard(key)
                raise
        error = UnsupportedOpError(func, entry.chain, entry.reason)
        return self.unsupported(func, args, kwargs, error, cache, keyed=True)

    def _replay(self, miss, kernel, answer):
        """Run ``kernel`` for ``miss``'s call (``answer``: how the miss made it; None: a hit)."""
        func, stats = miss.func, self.stats
        if func not in stats.leaf_ops:  # a kernel another runtime traced: still report what it runs
            stats.record_kernel(kernel)
        inputs = miss.inputs(kernel)
        if answer is Answer.FAMILY:  # a shape-generic kernel answered a new exact key: no trace
            return self._replay_family(miss, kernel, inputs)
        if answer is Answer.DISK:  # loaded from the persistent cache: no trace
            stats.record(func, Route.REPLAY, DISK, "miss")
            replay_once(func, miss.args, miss.kwargs)
        elif answer is Answer.TRACED:  # (the trace fired eager's once-per-process warning itself)
            stats.record(func, Route.TRACE, LIFTED if miss.lifted else None, "miss")
        else:
            replay_once(func, miss.args, miss.kwargs)
            compiled = self.compiler.lookup(miss.key, kernel, inputs, stats) if self.compiler is not None else None
            if compiled is not None:
                stats.record(func, Route.REPLAY, COMPILED, "hit")
                out = ranged("compiled", func, compiled, inputs) if profiling() else compiled(inputs)
                if self.hits is not None:
                    self._offer(miss, kernel, inputs)
                return out
            stats.record(func, Route.REPLAY, LIFTED if miss.lifted else None, "hit")
        out = ranged("replay", func, kernel, inputs) if profiling() else kernel(inputs)
        if self.hits is not None:  # from now on this key is served in C++
            self._offer(miss, kernel, inputs)
        return out

    def _offer(self, miss, kernel, inputs, persist=True):
        """Install this key's C++ program; under compile=, once the compiler's verdict is in
        (until then its calls must come back here to be counted), with its compiled code.
        ``persist=False``: not written to disk (a proved family's new key)."""
        call = None
        if self.compiler is not None:
            call = self.compiler.program_call(miss.key, kernel, inputs, len(miss.tensors), len(miss.lifted))
            if call is PENDING:
                return
        hits.offer(self, miss, kernel, call, persist)

    def _replay_family(self, miss, kernel, inputs):
        """The first replay of a shape-generic kernel for an exact key, its outputs checked
        against the member's layout at these sizes (eager's: proved, or checked by the meta
        kernel in :meth:`_from_family`): this catches a real kernel that returns another
        layout than its meta kernel said while tracing."""
        func, args, kwargs, member = miss.func, miss.args, miss.kwargs, miss.member
        self.stats.record(func, Route.REPLAY, FAMILY, "miss")
        replay_once(func, args, kwargs)
        out, installed = hits.MISS, None
        if self.hits is not None and self.compiler is None and not self.via_cxx() and not profiling():
            # NOTE: the key's program is installed first and runs this call in C++: a new exact
            # key then costs its specialization, not a replay of the graph in Python
            installed = hits.offer(self, miss, kernel, persist=False)
            if installed is not None:
                out = self.hits.run(func, args, kwargs)
        if out is hits.MISS:
            out = ranged("replay", func, kernel, inputs) if profiling() else kernel(inputs)
        if matches(member, tree_flatten(out)[0], miss.tensors, read_ints(kernel.ints, args, kwargs)):
            store = self._store()
            # NOTE: a proved member's keys are not written (see disk.every_key): its family answers
            # them in any process, unchecked, and a file per new length was most of a new key's
            # time with the disk on. An unproven member's key is: checked here, a later process
            # loads it by key, unchecked.
            keep = store is not None and (member.unproven is not None or every_key())
            if keep:
                store.save_kernel(miss.key, kernel)
            if installed is not None:
                if keep:
                    hits.persist(self, installed)
            elif self.hits is not None:  # (a C++ fallback asked: it installs the program, written only if kept)
                self._offer(miss, kernel, inputs, persist=keep)
            return out
        # NOTE: never expected; a wrong layout must not be returned. A functional op is run
        # again from an exact-shape kernel; a mutating op has already written: a clear error.
        if installed is not None:
            self.hits.discard(func, args, kwargs)
        self.cache.discard(miss.key)
        self.cache.set_family(miss.fkey, Family((), "replayed layout differed from eager's"))
        if func._schema.is_mutable:
            raise MismatchError(
                f"{func}: a shape-generic kernel returned a layout eager does not; "
                "run with EAGERDECOMP_SHAPE_GENERIC=0 and report this"
            )
        return self.decompose(func, args, kwargs)

    def _family_key(self, miss):
        """The shape family of the call's key, or None (it keeps exact-shape kernels)."""
        if not family_enabled():
            return None
        func, (key_args, key_kwargs) = miss.func, miss.keyed
        try:
            paths = int_paths(symint_positions(func), miss.args, miss.kwargs)
            return family_key(func, miss.key, miss.tensors, paths, key_args, key_kwargs)
        except NotGeneric as e:
            self.stats.exact_shapes(func, e.reason)  # (why this call keeps an exact-shape kernel)
            return None

    def _direct(self, miss):
        """A call whose key is not hot yet: its decomposition run on its own tensors, with a
        trace's checks (:mod:`eagerdecomp.runtime.direct`), no kernel made."""
        func, tiers = miss.func, self.cache.tiers
        known = tiers.known(miss.key)
        try:
            a = (func, miss.args, miss.kwargs, self.opset, self.table, miss.tensors, known)
            out, ran, ref = ranged("direct", func, run_direct, *a) if profiling() else run_direct(*a)
        except Stuck:
            # NOTE: no path, found before anything was written or drawn: the trace decides what
            # the call is (the CPU tier, a composite kernel, the error) and remembers it
            tiers.heat(miss.key)
            return self._decompose(func, miss.args, miss.kwargs)
        except Unfinished as e:
            raise UnsupportedOpError(
                func,
                e.stuck.chain,
                f"{e.stuck.reason}, met after part of the call had run (run with EAGERDECOMP_TRACE_AFTER=0)",
            ) from None
        if known is None:
            tiers.keep(miss.key, ref)
        if func not in self.stats.leaf_ops or not ran <= self.stats.leaf_ops[func]:
            self.stats.record_ops(func, ran)
        self.stats.record(func, Route.DIRECT, None, None)
        return out

    def _from_family(self, miss, no_trace=False, disk=True):
        """A shape-generic kernel for ``miss`` (of family ``miss.fkey``), found or traced, or None:
        trace an exact one. A member found sets ``miss.member``. ``no_trace``: only a member this
        process holds (or, with ``disk``, the disk cache or a bundle has), never a trace."""
        func, args, kwargs, tensors, fkey = miss.func, miss.args, miss.kwargs, miss.tensors, miss.fkey
        paths = int_paths(symint_positions(func), args, kwargs)
        ints = read_ints(paths, args, kwargs)
        eager = []  # the op's meta kernel on this call, made once and only when a guard holds

        def ref():
            if not eager:
                with _disable_current_modes():
                    mode = concrete_fake_mode(tensors)
                    eager.append(reference(func, args, kwargs, mode, fakes_like(mode, tensors), refuse=True))
            if isinstance(eager[0], Refusal):  # the family's kernel would answer: eager refuses
                raise eager[0].error
            return eager[0]

        def find(members):
            for m in members:
                if m.guard(tensors, ints):
                    if m.unproven is None and not audit():
                        check(func, args, kwargs)  # what eager refuses that no meta kernel says
                    elif not agrees(m, tensors, ref(), ints):
                        if m.unproven is None:
                            raise _ProofFailed(func, m, tensors)
                        raise NotGeneric(
                            "a shape-generic kernel's output layout differed from eager's at another shape"
                        )
                    if m.unproven is not None:
                        self.stats.per_key_checks(func, m.unproven)
                    miss.member = m
                    return m.kernel
            return None

        def make():
            if no_trace:
                raise _NoMember
            t0 = time.perf_counter()
            targs = (func, args, kwargs, tensors, self.opset, self.table, miss.lifted, paths)
            member = ranged("trace", func, trace_family, *targs) if profiling() else trace_family(*targs)
            if not member.guard(tensors, ints) or not agrees(member, tensors, ref(), ints):
                raise NotGeneric("the shape-generic trace does not reproduce eager at its own shape")
            if member.unproven is not None:
                self.stats.per_key_checks(func, member.unproven)
            log.info(
                "%s: traced a shape-generic kernel in %.1f ms; guard: %s",
                func,
                1e3 * (time.perf_counter() - t0),
                member.guard.source,
            )
            return member

        store = self._store() if disk else None
        if store is not None and self.cache.family(fkey) is None:
            members = store.load_members(fkey)  # another process's members, checked per key as ours
            if members:
                self.cache.adopt_family(fkey, Family(members))
        if no_trace:
            family = self.cache.family(fkey)
            if family is None or not family.members:
                return None
        try:
            kernel, made = self.cache.find_or_make_member(fkey, find, make, MAX_MEMBERS)
        except _NoMember:
            return None
        except _ProofFailed as e:  # never hidden behind an exact-shape kernel
            raise MismatchError(str(e)) from None
        except (EagerDecompError, Bypass, LiftRefused) as e:
            # NOTE: the exact trace decides what this call is (unsupported, bypassed...). The
            # family keeps exact-shape kernels from now on: a symbolic attempt per new shape
            # of an op with no path would double every miss (only speed is given up)
            reason = f"symbolic trace refused: {type(e).__name__}"
            if self.cache.family(fkey) is None:
                self.cache.set_family(fkey, Family((), reason))
            self.stats.exact_shapes(func, reason)
            return None
        if kernel is None:
            family = self.cache.family(fkey)
            if not no_trace:
                self.stats.exact_shapes(func, family.exact if family is not None and family.exact else "re-entered")
            return None
        if made:
            miss.member = None  # (traced for this call: its replay is the trace's, checked above)
            self.stats.record_kernel(kernel)
            family = self.cache.family(fkey)
            if store is not None and family is not None and family.members:
                store.save_members(fkey, family.members)
                store.save_kernel(miss.key, kernel)  # checked against eager at this key when traced
        return kernel

    def _answer(self, miss) -> tuple:
        """``(entry, answer)`` for a key met for the first time: a kernel (from a family member
        this process holds, the disk, or a trace), the reason there is none (data, never an
        error), or ``(None, COLD)``: run it direct (:mod:`eagerdecomp.runtime.tiers`)."""
        func, args, kwargs, tensors, key, lifted = (
            miss.func,
            miss.args,
            miss.kwargs,
            miss.tensors,
            miss.key,
            miss.lifted,
        )
        if self.host is not None:
            chain = untraceable(func, self.opset, self.table)
            if chain is not None:  # no trace could find a path: the CPU tier, without an empty trace
                check_devices(func, tensors, args, kwargs)
                with _disable_current_modes():  # eager's own error for arguments it refuses, as trace() gives
                    _, refusal = refused(reference(func, args, kwargs, refuse=True))
                if refusal is not None:
                    raise refusal.error
                log.info("%s: no path to the opset (%s: no decomposition)", func, chain[-1])
                return Unsupported(chain, "no decomposition"), Answer.TRACED
        store = self._store()
        fkey = miss.fkey = self._family_key(miss)
        # NOTE: a family this process holds answers first: a shape that changes every call
        # would otherwise look the disk up (or run direct) for each new key (a proved family's
        # keys are never written there). Then what another process left, never run direct: the
        # key's kernel, then its family's members (a bundle's answer a length it never met)
        kernel = self._from_family(miss, no_trace=True, disk=False) if fkey is not None else None
        if kernel is not None:
            return kernel, Answer.FAMILY
        if store is not None:
            kernel = store.load_kernel(key)
            if kernel is not None:
                return kernel, Answer.DISK
            if fkey is not None and self.cache.family(fkey) is None:
                kernel = self._from_family(miss, no_trace=True)
                if kernel is not None:
                    return kernel, Answer.FAMILY
        tiers = self.cache.tiers
        known = tiers.known(key)  # (eager's metadata from its direct calls: the trace needs it too)
        if tiered(func) and tiers.cold(key, fkey):
            return None, Answer.COLD  # (nothing stored: the next call of this key asks again)
        # NOTE: a shape-generic trace costs ten to twenty exact ones: taken once its family has
        # paid about that in exact traces (tiers.FAMILY_TRACES), never for a key whose shape is its
        # program's only one
        if fkey is not None and (not tiered(func) or tiers.varies(fkey)):
            kernel = self._from_family(miss)
            if kernel is not None:
                return kernel, (Answer.TRACED if miss.member is None else Answer.FAMILY)
        t0 = time.perf_counter()
        try:
            targs = (func, args, kwargs, tensors, self.opset, self.table, lifted, known)
            kernel = ranged("trace", func, trace, *targs) if profiling() else trace(*targs)
        except LiftRefused as e:
            log.info("%s: keyed by the value of its floats (%s)", func, e)
            return ByValue(str(e)), Answer.TRACED
        except Bypass as b:
            if lifted:  # the stand-in values, not the call, may be what failed: retry by value
                log.info("%s: keyed by the value of its floats (%s)", func, b.reason)
                return ByValue(b.reason), Answer.TRACED
            log.info("%s: no replayable kernel, decomposed eagerly for this key (%s)", func, b.reason)
            return Bypassed(b.reason), Answer.TRACED
        except UnsupportedOpError as e:
            log.info("%s: no path to the opset (%s)", func, e.reason)
            return Unsupported(tuple(e.chain), e.reason), Answer.TRACED
        log.info(
            "%s: traced in %.1f ms into %d opset op(s)", func, 1e3 * (time.perf_counter() - t0), len(kernel.leaf_ops)
        )
        if log.isEnabledFor(logging.DEBUG):  # (the code is generated for the log alone)
            log.debug("%s: kernel code:%s", func, kernel.code)
        self.stats.record_kernel(kernel)
        tiers.traced(fkey)
        if store is not None:
            store.save_kernel(key, kernel)
        return kernel, Answer.TRACED

    def _store(self):
        return self.store if self.store is not None and disk_enabled() else None

    @below_forward_ad
    def bypass(self, func, args, kwargs, reason):
        """Decompose eagerly on the real tensors: still only opset ops run below."""
        try:
            return self._lower_eagerly(func, args, kwargs, reason, None)
        except EagerDecompError:
            raise
        except Exception as e:
            # NOTE: decompositions are written for strided tensors; on a sparse one some pass
            # (a transpose is a permute the sparse kernel has) and others fail deep inside with
            # PyTorch's storage, overlap or missing-kernel errors that name neither the op the
            # user called nor the cause. Those become one clear error naming both.
            layout = _unstrided_layout(args, kwargs)
            if layout is None:
                raise
            raise UnsupportedArgumentError(
                f"{func}: its decomposition does not run on a {layout} argument ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:160]}); the presets have no sparse kernels. Densify it before "
                "the mode (.to_dense()), or run this op outside it (docs/limits.md: sparse tensors)"
            ) from e

    def _through_tier(self, func, args, kwargs, error):
        """The op a taken-over ``func``'s decomposition is blocked at, when the CPU tier would run
        it for this call, else None."""
        if self.host is None or not error.chain or error.chain[-1] is func:
            return None
        blocked = error.chain[-1]
        device = device_of(args, kwargs)
        if device.type == "cpu" or self.host.refusal(blocked, device) is not None:
            return None
        return blocked

    def _lower_eagerly(self, func, args, kwargs, reason, cache, through=None):
        """Decompose ``func`` on the real tensors; ``through``: one more op to call as it is
        (from the device switch, which sends it to the CPU tier), where a ``Stuck`` lowering
        raises :class:`_Blocked` instead of taking the unsupported route."""
        opset = self.opset if through is None else self.opset.ops | {through}
        lowerer = Lowerer(opset, self.table, _call)
        # NOTE: no kernel here, so no trace's check of the layout: eager's is read before the
        # call (an out= is resized by it) and the results are moved to it after
        ref = refusal = None
        if layout_matters(func):
            with _disable_current_modes():  # the meta kernel's calls are no mode's to see
                ref, refusal = refused(reference(func, args, kwargs, refuse=True))
            if refusal is not None and func._schema.is_mutable:  # refused before anything is written
                raise refusal.error
        else:
            check(func, args, kwargs)  # what eager refuses that a decomposition might not
        try:
            # NOTE: as a trace does (trace.py), only eager's own warnings come out of a decomposition,
            # raised after it at the line that called the op, as eager raises a kernel's
            with quiet() as caught:
                if profiling():
                    out = ranged("eager", func, lowerer.lower, func, args, kwargs)
                else:
                    out = lowerer.lower(func, args, kwargs)
            for text in issue_once(caught):
                warn_as_eager(text)
        except Stuck as e:
            if refusal is not None:  # declined arguments eager refuses: eager's error, not "no path"
                raise refusal.error from None
            if through is not None:
                raise _Blocked from None
            return self.unsupported(func, args, kwargs, UnsupportedOpError(func, e.chain, e.reason), cache)
        if refusal is not None:  # the decomposition raised nothing of its own where eager refuses
            raise refusal.error
        self.stats.record(func, Route.EAGER, reason, cache)

        # (the fix-ups lowered as the call was: clone or empty_strided may be outside the opset)
        def fix(op, a, k):
            return op(*a, **k) if op in opset else lowerer.lower(op, a, k)

        return relayout(func, args, kwargs, unalias(func, args, kwargs, out, fix), ref, fix)

    def unsupported(self, func, args, kwargs, error: UnsupportedOpError, cache=None, keyed=False):
        """No path to the opset: the composite kernel (device switch), the CPU tier, an error, or
        a native run. ``keyed``: the call has a cache key, so a C++ program may serve it next."""
        composite = self.composites.get(func)
        if composite is not None and error.op is func:
            through = self._through_tier(func, args, kwargs, error)
            if through is not None:
                # NOTE: the op's own decomposition is blocked only at another op, which the CPU
                # tier runs: keep the decomposition (on the device's kernels) with that op on the
                # host. PyTorch's composite kernel is no fallback for such an op: mode.values'
                # calls the CPU/CUDA kernel stub directly and rejects any other device.
                reason = f"{error.reason}; {through} on the CPU tier"
                try:
                    return self._lower_eagerly(func, args, kwargs, reason, cache, through=through)
                except _Blocked:
                    pass  # another op with no path: the composite kernel, as before (nothing was written)
            # NOTE: a taken-over op whose decomposition leads to an op with no path runs PyTorch's
            # composite kernel, as the device would without eagerdecomp. The trace failed over
            # fake tensors (or lowering stopped before any real op), so nothing ran yet.
            self.stats.record(func, Route.COMPOSITE, error.reason, cache)
            return func._op_dk(composite, *args, **kwargs)
        device = device_of(args, kwargs) if self.host is not None else None
        if device is not None and device.type != "cpu":
            out = self.host(self, func, args, kwargs, error, cache, device)
            if keyed and self.via_cxx():  # later calls with this key: the C++ fallback's
                hits.offer_host(self, func, device)
            return out
        if self.on_unsupported == "error":
            self.stats.record(func, Route.UNSUPPORTED, error.reason, cache)
            raise (error.with_hint(self.hint) if self.hint else error) from None
        if self.on_unsupported == "warn":
            warnings.warn(f"{error} Running {func} natively.", stacklevel=3)
        self.stats.record(func, Route.FALLTHROUGH, error.reason, cache)
        return func(*args, **kwargs)


class _Blocked(Exception):
    """Lowering through the CPU tier met a second op with no path (``Runtime._lower_eagerly``)."""


class _NoMember(Exception):
    """No member held or on disk admits the call (``_from_family(no_trace=True)``)."""


class _ProofFailed(Exception):
    """A proved member disagrees with eager's meta kernel (seen only under EAGERDECOMP_AUDIT_PROOFS)."""

    def __init__(self, func, member, tensors):
        super().__init__(
            f"{func}: a shape-generic kernel proved eager-exact for its family (guard {member.guard.source}) "
            f"disagrees with eager's meta kernel at {[tuple(t.shape) for t in tensors]}; "
            "run with EAGERDECOMP_SHAPE_GENERIC=0 and report this"
        )


def _resolve_decompositions(decompositions) -> dict:
    """``{op or name or packet: fn}`` -> ``{OpOverload: fn}``, checked."""
    if not hasattr(decompositions, "items"):
        raise UnsupportedArgumentError(
            f"decompositions must be a mapping from op to function, got {type(decompositions).__name__}"
        )
    out = {}
    for op, fn in decompositions.items():
        if not callable(fn):
            raise UnsupportedArgumentError(f"decompositions[{op}] must be callable, got {type(fn).__name__}")
        for overload in resolve_op(op):
            out[overload] = fn
    return out


def runtime_for(opset, decompositions=None, on_unsupported: str = "error", compile=None) -> Runtime:
    """A fresh runtime (own stats) over the process-wide cache of ``(opset, table)``;
    ``compile`` (None, ``"inductor"`` or a graph compiler) compiles its hot kernels."""
    opset = OpSet.coerce(opset)
    extra = _resolve_decompositions(decompositions or {})
    table = default_table(opset, extra.items())
    fingerprint = (opset, frozenset(extra.items()), table_version())
    cache = cache_for(fingerprint)
    return Runtime(opset, table, cache, on_unsupported, store_for(opset, extra), compiler_for(cache, compile, opset))
