"""The portable wheel: `pip wheel` of client/python with the native core bundled (setup.py,
bundle_libs.py) is one py3-none-linux_x86_64 wheel that installs into a fresh venv without the
system's site-packages, where every library the core loads is the package's own or the system's
(bundle_libs.SYSTEM: never Debian's gRPC, protobuf, absl or OpenSSL), and the core runs a GEMM
against a real server through its C ABI (wheel_smoke.py: that venv has no numpy, grpcio or
protobuf, which `import hgemm` needs).

The library is $HGEMM_CLIENT_LIB, else <repo>/bazel-bin/client/c/libhgemm_client.so
(tools/test_python.sh builds it). In the native run only: the wheel is the same on both cores.
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import hgemm
from conftest import REPO

SOURCE = REPO / "client" / "python"
TAG = "py3-none-linux_x86_64"
# What the native core needs that a bare Debian 12 lacks, by the name the bundle must not load.
NOT_SYSTEM = ("libgrpc", "libgpr", "libprotobuf", "libabsl_", "libssl", "libcrypto")

pytestmark = pytest.mark.skipif(os.environ.get("HGEMM_TRANSPORT") == "grpcio",
                                reason="the wheel does not depend on the core: native run only")

_spec = importlib.util.spec_from_file_location("bundle_libs", SOURCE / "bundle_libs.py")
bundle_libs = importlib.util.module_from_spec(_spec)  # not by sys.path: the source tree's hgemm
_spec.loader.exec_module(bundle_libs)                 # must not shadow the installed one


def _library() -> str:
    path = (os.environ.get("HGEMM_CLIENT_LIB")
            or str(REPO / "bazel-bin/client/c/libhgemm_client.so"))
    if not os.path.isfile(path):
        pytest.fail(f"no library at {path}: run `bazel build //client/c:libhgemm_client.so` or "
                    f"set HGEMM_CLIENT_LIB")
    return path


def _run(*args, **kwargs):
    run = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                         **kwargs)
    assert run.returncode == 0, f"{args} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    return run.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built from a copy of client/python (a build/ an earlier install left in the
    tree cannot slip into it)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(SOURCE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache", "tests"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-index",
         "--no-deps", "-w", work / "dist", source,
         env=dict(os.environ, HGEMM_NATIVE_LIB=_library()))
    wheels = list((work / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """(its python, the installed package's directory): a venv without the system's
    site-packages, the wheel installed by pip alone."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    # Without pip: ensurepip takes most of a minute on a loaded machine; this pip installs.
    _run("/usr/bin/python3", "-m", "venv", "--without-pip", root)
    python = root / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
         "--no-deps", wheel)
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    package = pathlib.Path(purelib.strip()) / "hgemm"
    assert (package / "libhgemm_client.so").is_file(), sorted(os.listdir(package))
    return python, package


def test_wheel_is_one_for_every_python3(wheel):
    assert wheel.name == f"hgemm-{hgemm.__version__}-{TAG}.whl", wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(f"hgemm-{hgemm.__version__}.dist-info/WHEEL").decode()
    assert f"Tag: {TAG}" in metadata.splitlines(), metadata
    assert "Root-Is-Purelib: false" in metadata.splitlines(), metadata
    assert {"hgemm/libhgemm_client.so", "hgemm/py.typed"} <= set(names)
    bundled = [n for n in names if n.startswith(f"hgemm/{bundle_libs.LIBS}/")]
    for prefix in NOT_SYSTEM:
        assert any(n.split("/")[-1].startswith(prefix) for n in bundled), (prefix, bundled)


def test_installed_libraries_load_nothing_from_outside(venv):
    _, package = venv
    libraries = [package / "libhgemm_client.so", *(package / bundle_libs.LIBS).iterdir()]
    assert len(libraries) > len(NOT_SYSTEM), libraries
    for library in libraries:
        assert bundle_libs.foreign(library, package) == [], library
    # The check saw the bundle: gRPC resolved inside the package, by its bundled name.
    resolved = bundle_libs.dependencies(package / "libhgemm_client.so")
    grpc = [path for name, path in resolved.items() if name.startswith("libgrpc-")]
    assert grpc and all(path.startswith(str(package)) for path in grpc), resolved


def test_check_flags_the_unbundled_library(venv):
    """The check above can fail: the library as Bazel built it loads Debian's libraries."""
    _, package = venv
    outside = bundle_libs.foreign(_library(), package)
    for prefix in NOT_SYSTEM:
        assert any(line.startswith(prefix) for line in outside), (prefix, outside)


def test_native_core_runs_a_gemm_in_a_bare_venv(venv, server, tmp_path):
    python, package = venv
    present = _run(python, "-c", "import importlib.util as u; "
                   "print([m for m in ('numpy', 'grpc', 'google') if u.find_spec(m)])")
    assert present.strip() == "[]", f"the venv is not bare: it has {present}"
    out = json.loads(_run(python, pathlib.Path(__file__).with_name("wheel_smoke.py"),
                          server.address, cwd=tmp_path))
    assert out["library"] == str(package / "libhgemm_client.so"), out
    assert out["backend"] == "cpu", out
    outside = [path for path in out["loaded"] if not path.startswith(str(package) + os.sep)
               and not any(os.path.basename(path).startswith(name)
                           for name in bundle_libs.SYSTEM)]
    assert outside == [], f"the core loaded libraries from outside the package: {outside}"
