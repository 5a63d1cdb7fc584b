"""Lowering and compiling a kernel with TileLang 0.1.15.

Two traps this module hides: ``tilelang.lower`` needs an enclosing TVM target
context (without one, layout inference fails with "Target context
required"), and a target must be an explicit dict because ``"auto"`` probes
for a GPU. ``TILELANG_CACHE_DIR`` (read when tilelang is first imported)
decides where compiled kernels are cached.
"""

from __future__ import annotations


def lower(program, target: dict) -> str:
    """Run TileLang's passes and code generation; return the device source."""
    import tilelang
    from tilelang import tvm

    with tvm.target.Target(target):
        artifact = tilelang.lower(program, target=target)
    return artifact.kernel_source


def compile_kernel(program, target: dict):
    """A callable JIT kernel taking torch tensors in the program's parameter
    order (inputs then outputs), written in place."""
    import tilelang

    return tilelang.compile(program, target=target)


def build(program, target: dict) -> str:
    """Lower and run the device compiler (nvcc for cuda, through TileLang's
    own callback and its binary cache); return the device source. Raises
    on a compiler error. No device is needed."""
    import tilelang
    from tilelang import tvm

    with tvm.target.Target(target):
        artifact = tilelang.lower(program, target=target, enable_device_compile=True)
    return artifact.kernel_source
