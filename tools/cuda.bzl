"""cuda_library: compile .cu files with the machine's nvcc and wrap the objects in a cc_library.

`bazel build --define=ptxas_verbose=1 //kernels/...` prints every kernel's registers, shared
memory and spills (-Xptxas -v); the default build stays quiet.

Bazel 4 has no CUDA rules and nothing may be downloaded, so each .cu file becomes one genrule
that runs /usr/local/cuda/bin/nvcc. Headers the .cu files include must be listed in `hdrs`
(this package's) or `textual_hdrs` (other packages'), so that they exist in the sandbox.
"""

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
        cmd = "/usr/local/cuda/bin/nvcc %s %s -c $(location %s) -o $@" % (NVCC_FLAGS, nvcc_flags, src)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + textual_hdrs,
            outs = [obj],
            cmd = select({
                "//tools:ptxas_verbose": cmd + " -Xptxas -v",
                "//conditions:default": cmd,
            }),
            message = "nvcc %s" % src,
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
