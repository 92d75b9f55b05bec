"""GPU targets (`opencl`, `metal`): capabilities come from the GPU kernel library.

Until a GPU kernel is registered for an op, these targets report it as unsupported and
placement sends the node to the next target in ``--valid_targets`` order, with the reason in
the report.  Both targets share one portable kernel library (see ARCHITECTURE.md).
"""

from __future__ import annotations

from optcli.ir import Graph, Node
from optcli.targets.base import Target

# (domain, op_type) -> kernel id, filled by the GPU kernel library when it registers kernels.
GPU_KERNELS: dict[str, dict[tuple[str, str], str]] = {"opencl": {}, "metal": {}}


class GpuTarget(Target):
    def can_run(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if (node.domain, node.op_type) in GPU_KERNELS[self.name]:
            return True, f"{self.name} kernel"
        return False, f"no {self.name} kernel for {node.op_type}"

    def select_kernel(self, node: Node, graph: Graph) -> str:
        return GPU_KERNELS[self.name][(node.domain, node.op_type)]

    def supported_ops(self) -> list[tuple[str, str]]:
        return sorted(GPU_KERNELS[self.name])


OPENCL = GpuTarget(name="opencl", device="gpu", description="OpenCL 1.2+ GPUs through pyopencl")
METAL = GpuTarget(name="metal", device="gpu", description="Apple GPUs through Metal")
