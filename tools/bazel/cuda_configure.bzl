"""cuda_configure: the one place that decides whether this build has CUDA.

Creates the @cuda repository from the toolkit at $HGEMM_CUDA_PATH (default /usr/local/cuda) when
its bin/nvcc exists: cudart, cuBLAS and the headers (cuda.BUILD), and a defs.bzl with
CUDA_FOUND = True. Without a toolkit the same targets exist but are incompatible with every
platform, so whatever depends on them (the kernels, the CUDA backend, the GPU tests and
benchmarks) is skipped by `bazel build //...` and `bazel test //...`, and the server builds with
the CPU backend only. tools/cuda.bzl turns this into if_cuda() and CUDA_COMPATIBLE.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("HGEMM_CUDA_PATH", "/usr/local/cuda")
    found = ctx.path(root + "/bin/nvcc").exists
    if found:
        for d in ["bin", "include", "lib64"]:
            ctx.symlink(root + "/" + d, d)
        ctx.template("BUILD", ctx.attr.build_file, executable = False)
    else:
        ctx.file("BUILD", "\n".join([
            "# No CUDA toolkit at %s: every target here is incompatible." % root,
            "package(default_visibility = [\"//visibility:public\"])",
            "",
        ] + [
            ("cc_library(name = \"%s\", " +
             "target_compatible_with = [\"@platforms//:incompatible\"])") % t
            for t in ["headers", "cudart", "cublas"]
        ]) + "\n")
    ctx.file("defs.bzl", "CUDA_FOUND = %s\nCUDA_PATH = %r\n" % (found, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    attrs = {"build_file": attr.label(mandatory = True)},
    environ = ["HGEMM_CUDA_PATH"],
    local = True,
)
