"""Builds the optional C extension walqueue._speedups (the metadata is in pyproject.toml).

A failed build (no compiler, no Python headers) warns and installs the
pure-Python package, which is complete on its own: the extension only makes
recovery, snapshot writing and each write's checks and changes faster
(walqueue/speedups.py, docs/performance.md).
WALQUEUE_NO_EXTENSIONS=1 at build time skips it.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext whose failure is a warning, never an install error."""

    failed: list[str] = []   # the extensions that did not build: not copied, nothing more said

    def run(self):
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 -- any failure of the compiler setup
            self._warn(error)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001 -- CompileError, LinkError, missing headers
            self._warn(error)
            self.failed.append(ext.name)

    def copy_extensions_to_source(self):
        # --inplace (pip install -e): a second warning for the missing file would only confuse.
        self.extensions = [ext for ext in self.extensions if ext.name not in self.failed]
        super().copy_extensions_to_source()

    @staticmethod
    def _warn(error):
        print(f"WARNING: walqueue._speedups was not built ({error}); walqueue works without it, "
              f"on its pure-Python path (slower recovery, snapshots and writes)", file=sys.stderr)


extensions = []
if os.environ.get("WALQUEUE_NO_EXTENSIONS") != "1":
    extensions.append(Extension("walqueue._speedups", ["src/walqueue/_speedups.c", "src/walqueue/_apply.c",
                                                      "src/walqueue/_tombstones.c"],
                                extra_compile_args=["-O3", "-std=c99", "-Wall"]))

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
