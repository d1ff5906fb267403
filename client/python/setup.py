"""The hgemm package's build step beyond pyproject.toml: libhgemm_client.so (the native core,
client/c) copied into the package, so that `import hgemm` finds it beside itself.

Where the library comes from, in order:
  1. $HGEMM_NATIVE_LIB, a library already built (tools/test_python.sh, the GPU bundle);
  2. `bazel build //client/c:libhgemm_client.so` in the clone this directory belongs to, when
     `bazel` is on PATH (and $HGEMM_BUILD_NATIVE is not "0");
  3. none: the package installs without it and uses the pure-Python (grpcio) core, saying so
     here and in hgemm.info().
With the library, the shared libraries it needs beyond the system's (gRPC, protobuf, absl,
OpenSSL, ...) are bundled beside it, in hgemm/.libs (bundle_libs.py), and the wheel is tagged
py3-none-linux_x86_64 (the build machine's platform): platform-specific, but no Python headers
are involved, so one wheel serves every CPython 3. Without it the wheel is pure Python,
py3-none-any.
"""
import functools
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    from wheel.bdist_wheel import bdist_wheel  # Debian 12's setuptools 66 and wheel 0.38

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for bundle_libs: a build backend need not put HERE on sys.path
import bundle_libs  # noqa: E402

REPO = HERE.parents[1]
LIBRARY = "libhgemm_client.so"
TARGET = "//client/c:" + LIBRARY


def _warn(message: str) -> None:
    print(f"hgemm setup: {message}", file=sys.stderr)


@functools.lru_cache(maxsize=None)  # once: has_ext_modules asks it often, then build_py
def find_or_build_library():
    """The path of a libhgemm_client.so to bundle, or None (see the module's docstring)."""
    given = os.environ.get("HGEMM_NATIVE_LIB")
    if given:
        if not os.path.isfile(given):
            raise SystemExit(f"hgemm setup: HGEMM_NATIVE_LIB={given} is not a file (pip runs "
                             f"this in {HERE}: give an absolute path)")
        return given
    if os.environ.get("HGEMM_BUILD_NATIVE") == "0":
        _warn("HGEMM_BUILD_NATIVE=0: installing without the native core (grpcio only)")
        return None
    bazel = shutil.which("bazel")
    if bazel is None or not (REPO / "WORKSPACE").is_file():
        _warn("no bazel or no clone around this package: installing without the native core "
              "(grpcio only); set HGEMM_NATIVE_LIB to a built libhgemm_client.so to bundle it")
        return None
    _warn(f"building {TARGET} with bazel (a few minutes the first time)")
    try:
        subprocess.run([bazel, "build", TARGET], cwd=REPO, check=True, stdout=sys.stderr)
        bin_dir = subprocess.run([bazel, "info", "bazel-bin"], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError as e:
        _warn(f"{TARGET} did not build ({e}): installing without the native core (grpcio only)")
        return None
    return os.path.join(bin_dir, "client", "c", LIBRARY)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        package = pathlib.Path(self.build_lib, "hgemm")
        library = find_or_build_library()
        if library is None:  # nor the copies an earlier build left in build/: a pure wheel
            (package / LIBRARY).unlink(missing_ok=True)
            shutil.rmtree(package / bundle_libs.LIBS, ignore_errors=True)
            return
        bundled = bundle_libs.bundle(library, package)
        _warn(f"bundled {LIBRARY}, and in hgemm/{bundle_libs.LIBS} the {len(bundled)} libraries "
              f"it needs beyond the system's")


class BinaryDistribution(Distribution):
    """Platform-specific when it carries the library: bdist_wheel then puts the package at the
    wheel's root (Root-Is-Purelib: false) and tags it for this platform."""

    def has_ext_modules(self):
        return find_or_build_library() is not None


class Wheel(bdist_wheel):
    """py3-none-linux_x86_64 with the library (any CPython 3), else py3-none-any."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": Wheel},
      distclass=BinaryDistribution)
