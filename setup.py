"""Builds the optional C++ library ``eagerdecomp._C`` (csrc/) and, in a wheel, the shipped bundle.

The package works without it: if the build fails (no compiler, no torch
headers) or ``EAGERDECOMP_NO_EXT=1`` is set, a pure-Python package is
installed and ``python -m eagerdecomp.info`` says so. Build against an
installed torch with ``pip install --no-build-isolation .``.

A wheel (not an editable install) also carries a kernel bundle built from the package's own
workloads (``python -m eagerdecomp cache build``, about a minute), so a fresh install's first
steps of them trace nothing (``eagerdecomp/runtime/bundle.py``). It is keyed by the very sources
it ships with; optional like the C++ library (``EAGERDECOMP_WHEEL_BUNDLE=0`` leaves it out).
"""

import glob
import os
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build import build


class BuildWithBundle(build):
    def run(self):
        super().run()  # (the sources, then the C++ library: the bundle is keyed as the wheel runs)
        editable = getattr(self.get_finalized_command("build_py"), "editable_mode", False)
        if editable or os.environ.get("EAGERDECOMP_WHEEL_BUNDLE") == "0":
            return
        out = os.path.join(self.build_lib, "eagerdecomp", "data", "bundle")
        # NOTE: run from the built tree (its sources are the fingerprint the bundle is keyed by, and
        # its library, if one was built, keys the calls as an installed wheel does), in a cache of its own
        env = dict(os.environ, PYTHONPATH=os.path.abspath(self.build_lib))
        cmd = [sys.executable, "-m", "eagerdecomp", "cache", "build", "-o", out]
        with tempfile.TemporaryDirectory() as cache:
            proc = subprocess.run(cmd, env=env | {"EAGERDECOMP_CACHE_DIR": cache}, capture_output=True, text=True)
        if proc.returncode:  # (a workload that cannot run here: the bundle keeps the others')
            print(f"eagerdecomp: bundle built in part or not at all:\n{proc.stderr[-2000:]}", file=sys.stderr)


def _extension():
    if os.environ.get("EAGERDECOMP_NO_EXT") == "1":
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return {}

    class OptionalBuild(BuildExtension):
        # NOTE: a failed C++ build must not fail the install: the library has
        # a pure-Python path, and only the reference device needs the C++ part.
        def run(self):
            try:
                super().run()
            except Exception as exc:  # noqa: BLE001 - any compiler failure
                print(f"eagerdecomp: C++ library not built ({exc}); pure-Python install", file=sys.stderr)

    sources = sorted(glob.glob("csrc/*.cpp"))
    if not sources:
        return {}
    ext = CppExtension("eagerdecomp._C", sources, extra_compile_args=["-O2"])
    return {"ext_modules": [ext], "cmdclass": {"build_ext": OptionalBuild}}


def _commands():
    options = _extension()
    options.setdefault("cmdclass", {})["build"] = BuildWithBundle
    return options


setup(**_commands())
