"""GPU targets (`opencl`, `metal`): what they can run comes from the GPU kernel library
(``optcli.gpu``), which both share: a node runs on a GPU target when a GPU kernel for its op
exists and that kernel's ``check`` accepts the node (static shapes, ranks, attributes)."""

from __future__ import annotations

from optcli.ir import Graph, Node
from optcli.targets.base import Target


def _kernels(node: Node):
    import optcli.gpu.ops  # noqa: F401  (registers the GPU kernels on first use)
    from optcli.gpu.registry import gpu_kernels_for

    return gpu_kernels_for(node.op_type, node.domain)


class GpuTarget(Target):
    def can_run(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if node.proto is not None:
            return False, f"no {self.name} kernel for {node.op_type} (it needs the generic fallback)"
        kernels = _kernels(node)
        if not kernels:
            return False, f"no {self.name} kernel for {node.op_type}"
        reasons = []
        for k in kernels:
            reason = k.check(node, graph)
            if reason is None:
                return True, f"{self.name} kernel"
            reasons.append(reason)
        # The most general variant (lowest priority) refuses only for fundamental reasons.
        return False, f"{self.name} {node.op_type} kernel does not apply: {reasons[-1]}"

    def select_kernel(self, node: Node, graph: Graph) -> str:
        fitting = [k for k in _kernels(node) if k.check(node, graph) is None]
        best = min(fitting, key=lambda k: (k.cost(node, graph) if k.cost else 0.0, -k.priority, k.variant))
        return best.id

    def supported_ops(self) -> list[tuple[str, str]]:
        import optcli.gpu.ops  # noqa: F401
        from optcli.gpu.registry import gpu_ops

        hidden = {("optcli", op) for op in ("Upload", "Download", "Pack", "Unpack")}
        return [op for op in gpu_ops() if op not in hidden]


OPENCL = GpuTarget(name="opencl", device="gpu", description="OpenCL 1.2+ devices through pyopencl")
METAL = GpuTarget(name="metal", device="gpu", description="Apple GPUs through Metal")
