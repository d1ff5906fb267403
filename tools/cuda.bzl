"""cuda_library: compile .cu files with the machine's nvcc and wrap the objects in a cc_library;
if_cuda and CUDA_COMPATIBLE: what a target takes or is when the build has CUDA.

Whether it has is decided once, by tools/bazel/cuda_configure.bzl (a toolkit found) and
--define=cuda=off (tools:cuda_off). Targets that need CUDA depend on @cuda//:cudart (or on the
kernels), which makes them incompatible, and so skipped, in a build without it; a target that
merely can use CUDA takes it through if_cuda().

`bazel build --define=ptxas_verbose=1 //kernels/...` prints every kernel's registers, shared
memory and spills (-Xptxas -v); the default build stays quiet.

Bazel 4 has no CUDA rules and nothing may be downloaded, so each .cu file becomes one genrule
that runs the toolkit's nvcc. Headers the .cu files include must be listed in `hdrs`
(this package's) or `textual_hdrs` (other packages'), so that they exist in the sandbox.
"""

load("@cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH")

# target_compatible_with of targets that need CUDA without depending on @cuda (nvcc genrules).
CUDA_COMPATIBLE = select({
    "//tools:cuda_off": ["@platforms//:incompatible"],
    "//conditions:default": [],
}) if CUDA_FOUND else ["@platforms//:incompatible"]

def if_cuda(with_cuda, without_cuda = []):
    """`with_cuda` in a build with CUDA, else `without_cuda` (for deps, defines, srcs)."""
    if not CUDA_FOUND:
        return without_cuda
    return select({
        "//tools:cuda_off": without_cuda,
        "//conditions:default": with_cuda,
    })

# sm_90a machine code for the H200 (wgmma and friends) plus compute_90a PTX, kept so that the
# driver can still JIT the kernels should the machine code not match.
CUDA_ARCH_FLAGS = "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]"

NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xcompiler -fPIC",
    "-I.",
    CUDA_ARCH_FLAGS,
])

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], nvcc_flags = "", **kwargs):
    """A cc_library whose srcs are .cu files compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files, one nvcc invocation each.
      hdrs: public headers of this library (also visible to nvcc).
      textual_hdrs: further headers the .cu files include (e.g. from other packages).
      deps: cc_library deps for linking (cudart, cuBLAS, ...).
      nvcc_flags: extra nvcc flags, e.g. "-Xptxas -v".
      **kwargs: passed to the cc_library.
    """
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_objs/%s/%s.o" % (name, stem)
        cmd = "%s/bin/nvcc %s %s -c $(location %s) -o $@" % (CUDA_PATH, NVCC_FLAGS, nvcc_flags, src)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + textual_hdrs,
            outs = [obj],
            cmd = select({
                "//tools:ptxas_verbose": cmd + " -Xptxas -v",
                "//conditions:default": cmd,
            }),
            message = "nvcc %s" % src,
            target_compatible_with = CUDA_COMPATIBLE,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = True,
        alwayslink = True,
        **kwargs
    )
