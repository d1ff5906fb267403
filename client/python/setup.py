"""The hgemm package's build step beyond pyproject.toml: libhgemm_client.so (the native core,
client/c) copied into the package, so that `import hgemm` finds it beside itself.

Where the library comes from, in order:
  1. $HGEMM_NATIVE_LIB, a library already built (tools/test_python.sh, the GPU bundle);
  2. `bazel build //client/c:libhgemm_client.so` in the clone this directory belongs to, when
     `bazel` is on PATH (and $HGEMM_BUILD_NATIVE is not "0");
  3. none: the package installs without it and uses the pure-Python (grpcio) core, saying so
     here and in hgemm.info().
The wheel is then platform-specific (it carries a shared library), though no Python headers are
involved: one library serves every CPython 3.x.
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIBRARY = "libhgemm_client.so"
TARGET = "//client/c:" + LIBRARY


def _warn(message: str) -> None:
    print(f"hgemm setup: {message}", file=sys.stderr)


def find_or_build_library():
    """The path of a libhgemm_client.so to bundle, or None (see the module's docstring)."""
    given = os.environ.get("HGEMM_NATIVE_LIB")
    if given:
        if not os.path.isfile(given):
            raise SystemExit(f"hgemm setup: HGEMM_NATIVE_LIB={given} is not a file")
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
        library = find_or_build_library()
        if library is not None:
            destination = os.path.join(self.build_lib, "hgemm", LIBRARY)
            shutil.copyfile(library, destination)  # Bazel's outputs are read-only: no copymode
            os.chmod(destination, 0o755)


class BinaryDistribution(Distribution):
    """A wheel tagged for this platform: it may carry libhgemm_client.so."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
