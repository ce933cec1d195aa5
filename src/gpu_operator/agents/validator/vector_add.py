"""`vectorAdd`, the validator's CUDA workload, in our image: two vectors of 50,000 floats added on
the first CUDA device by a kernel, with the result checked on the host, as NVIDIA's CUDA sample in
its validator image does (same steps on stdout, `Failed to <step> (error code <name>)!` on stderr,
exit 1).

No CUDA toolkit is needed: the kernel is PTX that the driver compiles (`cuModuleLoadData`), and
the driver API is called through `libcuda.so.1`, which the NVIDIA runtime puts into the container
(capability `compute`, part of the default `utility,compute`). Verified on the mock driver of the
tests only; docs/image.md says so.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable
from typing import Any, TextIO

ELEMENTS = 50_000
THREADS = 256
LIBRARY = "libcuda.so.1"
EXIT_FAILURE = 1

# c[i] = a[i] + b[i] for i < n (n, the float count, as the last parameter).
PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry vectorAdd(
    .param .u64 param_a,
    .param .u64 param_b,
    .param .u64 param_c,
    .param .u32 param_n
)
{
    .reg .pred  %p<2>;
    .reg .f32   %f<4>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<11>;

    ld.param.u64    %rd1, [param_a];
    ld.param.u64    %rd2, [param_b];
    ld.param.u64    %rd3, [param_c];
    ld.param.u32    %r2, [param_n];
    mov.u32         %r3, %ctaid.x;
    mov.u32         %r4, %ntid.x;
    mov.u32         %r5, %tid.x;
    mad.lo.s32      %r1, %r3, %r4, %r5;
    setp.ge.s32     %p1, %r1, %r2;
    @%p1 bra        DONE;
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mul.wide.s32    %rd7, %r1, 4;
    add.s64         %rd8, %rd4, %rd7;
    add.s64         %rd9, %rd5, %rd7;
    add.s64         %rd10, %rd6, %rd7;
    ld.global.f32   %f1, [%rd8];
    ld.global.f32   %f2, [%rd9];
    add.f32         %f3, %f1, %f2;
    st.global.f32   [%rd10], %f3;
DONE:
    ret;
}
\x00"""

# cudaError names the sample prints, for the driver's CUresult values that matter here.
ERRORS = {
    1: "invalid argument",
    2: "out of memory",
    3: "initialization error",
    35: "CUDA driver version is insufficient for CUDA runtime version",
    100: "no CUDA-capable device is detected",
    101: "invalid device ordinal",
    200: "device kernel image is invalid",
    209: "no kernel image is available for execution on the device",
    214: "uncorrectable ECC error encountered",
    218: "a PTX JIT compilation failed",
    700: "an illegal memory access was encountered",
    719: "unspecified launch failure",
    999: "unknown error",
}


class CudaError(Exception):
    def __init__(self, step: str, code: int) -> None:
        super().__init__(step)
        self.step = step
        self.code = code

    def line(self) -> str:
        return (
            f"Failed to {self.step} (error code {ERRORS.get(self.code, f'CUresult {self.code}')})!"
        )


def _check(step: str, code: int) -> None:
    if code != 0:
        raise CudaError(step, code)


def _steps(blocks: int) -> list[str]:
    return [
        "Copy input data from the host memory to the CUDA device",
        f"CUDA kernel launch with {blocks} blocks of {THREADS} threads",
        "Copy output data from the CUDA device to the host memory",
    ]


def vector_add(cuda: Any, out: TextIO, n: int = ELEMENTS) -> int:
    """The sample on the driver API `cuda` (libcuda, or a stand-in); its exit status."""
    out.write(f"[Vector addition of {n} elements]\n")
    size = n * 4
    rng = random.Random(0)
    a = [rng.random() for _ in range(n)]
    b = [rng.random() for _ in range(n)]
    host_a = ctypes.create_string_buffer(struct.pack(f"{n}f", *a), size)
    host_b = ctypes.create_string_buffer(struct.pack(f"{n}f", *b), size)
    host_c = ctypes.create_string_buffer(size)
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    module = ctypes.c_void_p()
    kernel = ctypes.c_void_p()
    buffers = [ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()]
    blocks = (n + THREADS - 1) // THREADS
    try:
        _check("allocate device vector A", cuda.cuInit(0))
        _check("allocate device vector A", cuda.cuDeviceGet(ctypes.byref(device), 0))
        _check("allocate device vector A", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
        for name, buffer in zip("ABC", buffers, strict=True):
            _check(f"allocate device vector {name}", cuda.cuMemAlloc_v2(ctypes.byref(buffer), size))
        steps = _steps(blocks)
        out.write(steps[0] + "\n")
        for name, buffer, host in (("A", buffers[0], host_a), ("B", buffers[1], host_b)):
            _check(
                f"copy vector {name} from host to device",
                cuda.cuMemcpyHtoD_v2(buffer, ctypes.cast(host, ctypes.c_void_p), size),
            )
        out.write(steps[1] + "\n")
        _check("launch vectorAdd kernel", cuda.cuModuleLoadData(ctypes.byref(module), PTX))
        _check(
            "launch vectorAdd kernel",
            cuda.cuModuleGetFunction(ctypes.byref(kernel), module, b"vectorAdd"),
        )
        count = ctypes.c_uint32(n)
        # Kernel parameters: an array of pointers to each argument's value.
        params = (ctypes.c_void_p * 4)(
            *(ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in (*buffers, count))
        )
        _check(
            "launch vectorAdd kernel",
            cuda.cuLaunchKernel(
                kernel, blocks, 1, 1, THREADS, 1, 1, 0, None,
                ctypes.cast(params, ctypes.c_void_p), None,
            ),
        )  # fmt: skip
        _check("launch vectorAdd kernel", cuda.cuCtxSynchronize())
        out.write(steps[2] + "\n")
        _check(
            "copy vector C from device to host",
            cuda.cuMemcpyDtoH_v2(ctypes.cast(host_c, ctypes.c_void_p), buffers[2], size),
        )
    except CudaError as err:
        sys.stderr.write(err.line() + "\n")
        return EXIT_FAILURE
    finally:
        for buffer in buffers:
            if buffer.value:
                cuda.cuMemFree_v2(buffer)
        if context.value:
            cuda.cuCtxDestroy_v2(context)
    c = struct.unpack(f"{n}f", host_c.raw)
    for i in range(n):
        if abs(a[i] + b[i] - c[i]) > 1e-5:
            sys.stderr.write(f"Result verification failed at element {i}!\n")
            return EXIT_FAILURE
    out.write("Test PASSED\nDone\n")
    return 0


def load(loader: Callable[[str], Any] = ctypes.CDLL) -> Any:
    """libcuda, with the argument types the calls above pass."""
    lib = loader(LIBRARY)
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    lib.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p,
    ]  # fmt: skip
    lib.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
    lib.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]
    lib.cuModuleGetFunction.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p,
    ]  # fmt: skip
    return lib


def main(out: TextIO = sys.stdout) -> int:
    try:
        cuda = load()
    except OSError:
        out.write(f"[Vector addition of {ELEMENTS} elements]\n")
        sys.stderr.write(
            "Failed to allocate device vector A (error code CUDA driver version is insufficient "
            f"for CUDA runtime version)! ({LIBRARY} is not in this container: the NVIDIA runtime "
            "did not inject the driver)\n"
        )
        return EXIT_FAILURE
    return vector_add(cuda, out)
