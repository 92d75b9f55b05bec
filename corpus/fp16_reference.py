"""What fp16 storage itself costs a model: onnxruntime with every float activation rounded to half.

GPU plans at ``--precision=fp16`` store tensors as half and compute in float.  On some real
models (MediaPipe's pose landmark, whose segmentation logits come from large cancelling sums)
that alone moves an output by far more than the fp16 budget, whatever the runtime: onnxruntime
given the same rounding after each node shows the same error.  The corpus judges our fp16 runs
against that floor, so a model fails only when we lose more than half storage has to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


def _rounded_to_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """Weights rounded to half, and a Cast to half and back after every float node output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for t in g.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32:
            t.CopyFrom(numpy_helper.from_array(a.astype(np.float16).astype(np.float32), t.name))
    typed = onnx.shape_inference.infer_shapes(out)
    floats = {v.name for v in [*typed.graph.value_info, *typed.graph.output]
              if v.type.tensor_type.elem_type == FLOAT}
    graph_outputs = {o.name for o in g.output}
    nodes = []
    for node in g.node:
        nodes.append(node)
        for i, name in enumerate(list(node.output)):
            if name not in floats or name in graph_outputs:
                continue
            node.output[i] = name + "/exact"
            nodes += [helper.make_node("Cast", [name + "/exact"], [name + "/half"], to=TensorProto.FLOAT16),
                      helper.make_node("Cast", [name + "/half"], [name], to=FLOAT)]
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return out


def fp16_storage_errors(path: Path, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict:
    """Per output, the error onnxruntime shows with half storage (relative, as in evaluate)."""
    from corpus.evaluate import relative_error

    model = _rounded_to_half(onnx.load(str(path)))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    return {name: relative_error(got[name], ref) for name, ref in expected.items()}
