"""Builds the optional C++ library ``eagerdecomp._C`` (csrc/).

The package works without it: if the build fails (no compiler, no torch
headers) or ``EAGERDECOMP_NO_EXT=1`` is set, a pure-Python package is
installed and ``python -m eagerdecomp.info`` says so. Build against an
installed torch with ``pip install --no-build-isolation .``.
"""

import glob
import os
import sys

from setuptools import setup


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


setup(**_extension())
