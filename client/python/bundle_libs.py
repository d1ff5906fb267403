"""libhgemm_client.so made to load where Debian's gRPC, protobuf, absl and OpenSSL are not: what
`auditwheel repair` does (auditwheel has no Debian package, and pip cannot reach PyPI here).

bundle(library, package_dir) copies the library into package_dir and every shared library it
needs that is not the system's (ldd's closure, below) into package_dir/.libs, each renamed
libNAME-<hash>.so.N: its SONAME and the DT_NEEDED entries that name it are rewritten, so that a
process that already loaded another copy under the original name (grpcio, torch) keeps that one
and the library gets its own. RUNPATH is $ORIGIN/.libs on the library and $ORIGIN on the bundled
ones (DT_RUNPATH serves only an object's own dependencies, so each needs one).

The system's libraries (SYSTEM) follow manylinux's policy: glibc's and the GCC runtime's, taken
to be on every glibc Linux. libstdc++ and libgcc_s are never bundled because a process must have
one C++ runtime (exceptions and std:: types cross libraries), and the Python process may have
loaded it already. Everything else is bundled, libz too (manylinux does not promise it). The
target still needs a glibc and a libstdc++ as new as the symbol versions the library and the
bundled ones use (built on Debian 12: GLIBC_2.34, GLIBCXX_3.4.30).

    python3 bundle_libs.py LIBRARY PACKAGE_DIR   # what setup.py does; prints the bundled names
"""
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional

LIBS = ".libs"
SYSTEM = frozenset({
    "linux-vdso.so.1", "ld-linux-x86-64.so.2",  # the kernel's vDSO, the dynamic loader
    "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
    "libutil.so.1",                              # glibc
    "libstdc++.so.6", "libgcc_s.so.1",           # the GCC runtime
})
# ldd's lines: "\tNAME => PATH (0x...)", "\tNAME => not found", "\tPATH (0x...)", "\tNAME (0x...)".
_LDD_LINE = re.compile(r"^\s*(\S+)(?: => (.+?))?(?: \(0x[0-9a-f]+\))?$")


def dependencies(path: os.PathLike) -> Dict[str, Optional[str]]:
    """Every shared library `path` loads (ldd: the closure, as this machine's loader resolves it
    now): its name (SONAME) -> the file it resolves to, None where none is found."""
    out = subprocess.run(["ldd", str(path)], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        if line.strip() == "statically linked":  # what ldd says of a library that needs none
            continue
        m = _LDD_LINE.match(line)
        if not m:
            raise ValueError(f"unexpected ldd output for {path}: {line!r}")
        name, target = m.groups()
        if target is None:  # the loader by its path, or the vDSO (no file)
            found[os.path.basename(name)] = name if os.path.isabs(name) else None
        else:
            found[name] = None if target == "not found" else target
    return found


def foreign(path: os.PathLike, inside: os.PathLike) -> List[str]:
    """What `path` loads that is neither the system's nor a file under `inside` (the installed
    package): "NAME => PATH" lines, empty when the library is self-contained."""
    inside = os.path.realpath(inside) + os.sep
    return [f"{name} => {target or 'not found'}"
            for name, target in sorted(dependencies(path).items())
            if name not in SYSTEM and not (target and
                                           os.path.realpath(target).startswith(inside))]


def _hashed(name: str, path: str) -> str:
    """libNAME-<8 hex of the file's sha256>.so.N, auditwheel's naming."""
    stem, _, version = name.partition(".so")
    digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()[:8]
    return f"{stem}-{digest}.so{version}"


def _copy(source: str, destination: pathlib.Path) -> None:
    shutil.copyfile(source, destination)  # Bazel's outputs and /lib's files: read-only or root's
    os.chmod(destination, 0o755)


def bundle(library: os.PathLike, package_dir: os.PathLike) -> List[str]:
    """Copies `library` into package_dir and the libraries it needs into package_dir/.libs,
    patched as the module's docstring says; returns the bundled files' names. Raises
    RuntimeError when a dependency is not found or, once patched, still resolves outside."""
    package_dir = pathlib.Path(package_dir)
    libs_dir = package_dir / LIBS
    shutil.rmtree(libs_dir, ignore_errors=True)  # a previous build's, hashed differently
    libs_dir.mkdir(parents=True)
    target = package_dir / os.path.basename(library)
    _copy(library, target)

    needed = {name: path for name, path in dependencies(library).items() if name not in SYSTEM}
    missing = sorted(name for name, path in needed.items() if path is None)
    if missing:
        raise RuntimeError(f"{library} needs libraries the loader does not find: {missing}")
    renamed = {name: _hashed(name, path) for name, path in needed.items()}
    for name, path in needed.items():
        _copy(path, libs_dir / renamed[name])

    for elf in [target, *(libs_dir / new for new in renamed.values())]:
        names = subprocess.run(["patchelf", "--print-needed", str(elf)], check=True,
                               capture_output=True, text=True).stdout.split()
        # One kind of change a call: Debian 12's patchelf (0.14) writes one change's string
        # into another's entry when a call makes several kinds (a RUNPATH that is a SONAME).
        edits = [[arg for name in names if name in renamed
                  for arg in ("--replace-needed", name, renamed[name])]]
        if elf.parent == libs_dir:
            edits += [["--set-soname", elf.name], ["--set-rpath", "$ORIGIN"]]
        else:
            edits += [["--set-rpath", f"$ORIGIN/{LIBS}"]]
        for edit in edits:
            if edit:
                subprocess.run(["patchelf", *edit, str(elf)], check=True)

    outside = foreign(target, package_dir)
    if outside:
        raise RuntimeError(f"{target} still loads libraries from outside the package: {outside}")
    return sorted(renamed.values())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: bundle_libs.py LIBRARY PACKAGE_DIR")
    print("\n".join(bundle(sys.argv[1], sys.argv[2])))
