"""Our `vectorAdd` (the validator's CUDA workload in our image) on a stand-in for libcuda that
keeps device memory in this process and runs the kernel's arithmetic itself: the host side
(allocation, copies, the kernel's parameter array, the check, the sample's output) is exercised;
the PTX itself needs a real GPU (docs/image.md)."""

from __future__ import annotations

import ctypes
import io
from typing import Any

import pytest

from gpu_operator.agents.validator import vector_add


class FakeCuda:
    """The driver API calls vectorAdd makes; `fail` makes one return a CUresult."""

    def __init__(self, fail: dict[str, int] | None = None, wrong: bool = False) -> None:
        self.memory: dict[int, bytearray] = {}
        self.next = 0x1000
        self.fail = fail or {}
        self.wrong = wrong
        self.launched: tuple[Any, ...] = ()
        self.freed: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args: Any) -> int:
            if name in self.fail:
                return self.fail[name]
            handler = getattr(type(self), "_" + name, None)
            return handler(self, *args) if handler else 0

        return call

    def _cuMemAlloc_v2(self, out: Any, size: int) -> int:
        out._obj.value = self.next
        self.memory[self.next] = bytearray(size)
        self.next += 0x100000
        return 0

    def _cuMemFree_v2(self, ptr: ctypes.c_uint64) -> int:
        self.freed.append(ptr.value)
        return 0

    def _cuMemcpyHtoD_v2(self, dst: ctypes.c_uint64, src: ctypes.c_void_p, size: int) -> int:
        self.memory[dst.value][:] = ctypes.string_at(src.value, size)
        return 0

    def _cuMemcpyDtoH_v2(self, dst: ctypes.c_void_p, src: ctypes.c_uint64, size: int) -> int:
        ctypes.memmove(dst.value, bytes(self.memory[src.value]), size)
        return 0

    def _cuModuleLoadData(self, module: Any, image: bytes) -> int:
        assert b".entry vectorAdd(" in image
        assert image.endswith(b"\x00")
        return 0

    def _cuLaunchKernel(self, kernel: Any, gx: int, gy: int, gz: int, bx: int, *rest: Any) -> int:
        params = ctypes.cast(rest[-2], ctypes.POINTER(ctypes.c_void_p))
        a, b, c = (ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(3))
        n = ctypes.cast(params[3], ctypes.POINTER(ctypes.c_uint32))[0]
        self.launched = (gx, bx, n)
        fa = (ctypes.c_float * n).from_buffer(self.memory[a])
        fb = (ctypes.c_float * n).from_buffer(self.memory[b])
        fc = (ctypes.c_float * n).from_buffer(self.memory[c])
        for i in range(min(n, gx * bx)):
            fc[i] = fa[i] + fb[i] + (1.0 if self.wrong and i == 7 else 0.0)
        return 0


def test_it_adds_on_the_device_and_prints_the_samples_steps() -> None:
    cuda, out = FakeCuda(), io.StringIO()
    assert vector_add.vector_add(cuda, out, n=1000) == 0
    assert out.getvalue() == (
        "[Vector addition of 1000 elements]\n"
        "Copy input data from the host memory to the CUDA device\n"
        "CUDA kernel launch with 4 blocks of 256 threads\n"
        "Copy output data from the CUDA device to the host memory\n"
        "Test PASSED\nDone\n"
    )
    assert cuda.launched == (4, 256, 1000)
    assert len(cuda.freed) == 3


def test_a_wrong_result_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert vector_add.vector_add(FakeCuda(wrong=True), io.StringIO(), n=100) == 1
    assert "Result verification failed at element 7!" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        ("cuInit", 100, "Failed to allocate device vector A (error code no CUDA-capable device"),
        ("cuModuleLoadData", 218, "Failed to launch vectorAdd kernel (error code a PTX JIT"),
        ("cuCtxSynchronize", 214, "(error code uncorrectable ECC error encountered)!"),
    ],
)
def test_a_failing_call_is_reported_as_the_sample_reports_it(
    call: str, code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert vector_add.vector_add(FakeCuda(fail={call: code}), io.StringIO(), n=10) == 1
    assert message in capsys.readouterr().err
