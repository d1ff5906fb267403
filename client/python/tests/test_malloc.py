"""hgemm._malloc: the glibc settings the first Client applies, in fresh processes."""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

# Two 20 MiB buffers made, written and freed, round after round: with glibc's defaults the
# second round's buffers come from the heap, and freeing both leaves 40 MiB at the heap's top,
# which reaches the adapted trim threshold (twice the 20 MiB mmap threshold): every later round
# faults its pages in again. Printed: whether tuning is on, and the page faults of rounds 3-6.
PATTERN = """
import resource, sys
import hgemm
hgemm.Client("127.0.0.1:1").close()  # the first client tunes malloc
from hgemm import _malloc
size = 20 << 20
def round_():
    a = b"x" * size
    b = b"y" * size
    del a, b
for _ in range(2):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    round_()
print(_malloc.tune(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def run_pattern(**env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "HGEMM_MALLOC_TUNING")}
    out = subprocess.run([sys.executable, "-c", PATTERN], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_large_buffers_are_reused_instead_of_faulted_in():
    tuned, tuned_faults = run_pattern()
    untuned, default_faults = run_pattern(HGEMM_MALLOC_TUNING="0")
    assert tuned and not untuned
    pages = 4 * 2 * (20 << 20) // 4096  # written in rounds 3-6
    if default_faults < pages // 2:
        pytest.skip(f"glibc's defaults reuse these buffers too ({default_faults} faults)")
    assert tuned_faults < pages // 20, (tuned_faults, default_faults)


@pytest.mark.parametrize("env", [{"HGEMM_MALLOC_TUNING": "0"},
                                 {"MALLOC_TRIM_THRESHOLD_": str(1 << 20)},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}])
def test_the_environments_choice_stands(env):
    tuned, _ = run_pattern(**env)
    assert not tuned
