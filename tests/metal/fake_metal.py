"""A stand-in for PyObjC's ``Metal`` module whose "GPU" is the host, through the Metal shim.

It implements the calls ``optcli.runtime.metal.device`` makes, with PyObjC's conventions (selectors
as ``name_with_`` methods, NSError out-parameters returned in a tuple), so that the backend's
own code -- buffer planning, binding by argument index, encoding, committing at Downloads,
reading shared buffers -- runs end to end on Linux.  Libraries are compiled from the text the
backend passes to ``newLibraryWithSource_options_error_``.  As on a real GPU, committing only
queues a command buffer: its dispatches run later, when the host waits for it (``waitUntilCompleted``
runs the queue's committed buffers in commit order, up to that one), so a backend that reads a
buffer without waiting reads stale data here too.  What it cannot show: PyObjC's real signatures
and a real GPU's behaviour.
"""

from __future__ import annotations

import struct

import numpy as np

from tests.metal import shim

MTLResourceStorageModeShared = 0
MTLCommandBufferStatusCommitted = 2
MTLCommandBufferStatusCompleted = 4
MTLCommandBufferStatusError = 5


def MTLSizeMake(w, h, d):  # noqa: N802 (Metal's name)
    return (int(w), int(h), int(d))


class _Alloc:
    @classmethod
    def alloc(cls):
        return cls()

    def init(self):
        return self


class MTLCompileOptions(_Alloc):
    fast_math = True

    def setFastMathEnabled_(self, value):  # noqa: N802
        self.fast_math = bool(value)


class _Contents:
    def __init__(self, data: bytearray):
        self.data = data

    def as_buffer(self, length):
        return memoryview(self.data)[:length]


class FakeBuffer:
    def __init__(self, data: bytearray):
        self.data = data
        self.array = np.frombuffer(self.data, np.uint8)  # keeps a stable pointer for the shim

    def contents(self):
        return _Contents(self.data)

    def length(self):
        return len(self.data)


class FakeFunction:
    def __init__(self, program, entry):
        self.program, self.entry = program, entry


class FakeLibrary:
    def __init__(self, text: str):
        self.program = shim.program_text(text)

    def newFunctionWithName_(self, entry):  # noqa: N802
        return FakeFunction(self.program, entry) if entry in self.program.entries else None


class FakePipeline:
    def __init__(self, function: FakeFunction):
        self.function = function

    def maxTotalThreadsPerThreadgroup(self):  # noqa: N802
        return 1024

    def threadExecutionWidth(self):  # noqa: N802
        return 32


class FakeEncoder:
    def __init__(self, command):
        self.command, self.pipeline, self.slots = command, None, {}

    def setComputePipelineState_(self, pipeline):  # noqa: N802
        self.pipeline = pipeline

    def setBuffer_offset_atIndex_(self, buffer, offset, index):  # noqa: N802
        assert offset == 0
        self.slots[index] = buffer

    def setBytes_length_atIndex_(self, data, length, index):  # noqa: N802
        assert len(data) == length and length in (4, 32)  # a scalar, or the epilogue's 8 floats
        self.slots[index] = bytes(data)

    def dispatchThreads_threadsPerThreadgroup_(self, grid, group):  # noqa: N802
        assert all(g >= 1 for g in group) and np.prod(group) <= 1024
        fn = self.pipeline.function
        kinds = [k for k in fn.program.entries[fn.entry] if k in shim.ARG_KINDS]
        args = []
        for index, kind in enumerate(kinds):
            slot = self.slots[index]
            if kind in ("IN", "OUT"):
                assert isinstance(slot, FakeBuffer), f"{fn.entry}: argument {index} is not a buffer"
                args.append(slot.array.ctypes.data)
            elif kind == "EPI":
                assert isinstance(slot, bytes) and len(slot) == 32, f"{fn.entry}: argument {index} is not 8 floats"
                args.append(np.frombuffer(slot, np.float32).copy())
            else:
                assert isinstance(slot, bytes) and len(slot) == 4, f"{fn.entry}: argument {index} is not a scalar"
                args.append(struct.unpack("<i" if kind == "INT" else "<f", slot)[0])
        self.command.dispatches.append((fn, args, grid))

    def endEncoding(self):  # noqa: N802
        self.command.encoded = True


class FakeCommandBuffer:
    def __init__(self, queue):
        self.queue, self.device = queue, queue.device
        self.dispatches, self.encoded, self.committed, self.completed = [], False, False, False

    def computeCommandEncoder(self):  # noqa: N802
        return FakeEncoder(self)

    def commit(self):
        """Queue the work; the "GPU" runs it later (at a wait), never before commit returns."""
        assert self.encoded and not self.committed
        self.committed = True
        self.device.commits += 1
        self.queue.committed.append(self)

    def _execute(self):
        for fn, args, grid in self.dispatches:  # serial dispatch type: one after the other
            fn.program.run(fn.entry, args, grid)
        self.completed = True

    def waitUntilCompleted(self):  # noqa: N802
        assert self.committed
        self.device.waits += 1
        while not self.completed:  # a queue completes its command buffers in commit order
            self.queue.committed.pop(0)._execute()

    def status(self):
        return MTLCommandBufferStatusCompleted if self.completed else MTLCommandBufferStatusCommitted

    def error(self):
        return None


class FakeQueue:
    def __init__(self, device):
        self.device = device
        self.committed: list[FakeCommandBuffer] = []  # committed, not yet run

    def commandBuffer(self):  # noqa: N802
        return FakeCommandBuffer(self)


class FakeDevice:
    def __init__(self):
        self.commits = self.waits = self.libraries = 0

    def name(self):
        return "Fake Metal device (host shim)"

    def newCommandQueue(self):  # noqa: N802
        return FakeQueue(self)

    def newLibraryWithSource_options_error_(self, text, options, error):  # noqa: N802
        assert options.fast_math is False, "the kernels rely on INFINITY: no fast math"
        self.libraries += 1
        return FakeLibrary(text), None

    def newComputePipelineStateWithFunction_error_(self, function, error):  # noqa: N802
        return FakePipeline(function), None

    def newBufferWithLength_options_(self, length, options):  # noqa: N802
        assert options == MTLResourceStorageModeShared
        return FakeBuffer(bytearray(length))

    def newBufferWithBytes_length_options_(self, data, length, options):  # noqa: N802
        assert options == MTLResourceStorageModeShared and len(data) == length
        return FakeBuffer(bytearray(data))


DEVICE = FakeDevice()


def MTLCreateSystemDefaultDevice():  # noqa: N802
    return DEVICE


def MTLCopyAllDevices():  # noqa: N802
    return [DEVICE]
