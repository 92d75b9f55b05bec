"""Small ``.tflite`` models written by TensorFlow's own converter, for the TFLite frontend's tests.

``write_tflite_models(folder)`` runs this file as a child process: TensorFlow is imported there
only, never in the test process.  Its LLVM and PoCL's must not meet in one process (the OpenCL
device enumeration of every later test then crashed), and its import takes seconds.  The child
writes fp32, float16-quantized and int8 (int8 in and out) files of one small seeded net (conv2d +
relu, depthwise conv, average pool, dense; two outputs, the logits and their softmax) and, beside
each, what TFLite's own interpreter answers for ``sample_input``: ``run_tflite`` reads that back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SHAPE = (1, 16, 16, 3)  # NHWC, as a TFLite app feeds it
KINDS = ("fp32", "fp16", "int8")


def sample_input(dtype: type = np.float32) -> np.ndarray:
    """A seeded random input: float in [0, 1), or int8 for the int8 model."""
    rng = np.random.default_rng(7)
    if dtype == np.int8:
        return rng.integers(-128, 128, SHAPE).astype(np.int8)
    return rng.random(SHAPE, np.float32)


def write_tflite_models(folder: Path) -> dict[str, Path]:
    """The ``.tflite`` files by kind, written (with the interpreter's answers) in a child process."""
    done = subprocess.run([sys.executable, __file__, str(folder)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {kind: folder / f"{kind}.tflite" for kind in KINDS}


def run_tflite(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """TFLite's interpreter's outputs for ``x`` (which must be ``sample_input``), by tensor name."""
    with np.load(_expected(path)) as saved:
        answers = dict(saved)
    fed = answers.pop("__input__")
    assert fed.dtype == x.dtype and np.array_equal(fed, x), "run_tflite knows the answers for sample_input only"
    return answers


def _expected(path: Path) -> Path:
    return path.with_suffix(".expected.npz")


def _write_all(folder: Path) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(0)  # weights as constants: nothing for the converter to freeze
    conv_w, conv_b = rng.normal(0, 0.3, (3, 3, 3, 8)), rng.normal(0, 0.3, 8)
    dw_w, dw_b = rng.normal(0, 0.3, (3, 3, 8, 1)), rng.normal(0, 0.3, 8)
    fc_w, fc_b = rng.normal(0, 0.3, (8 * 8 * 8, 10)), rng.normal(0, 0.3, 10)
    f32 = {k: tf.constant(v, tf.float32) for k, v in locals().items() if k.endswith(("_w", "_b"))}

    @tf.function(input_signature=[tf.TensorSpec(SHAPE, tf.float32, name="image")])
    def serve(image):
        x = tf.nn.relu(tf.nn.conv2d(image, f32["conv_w"], 1, "SAME") + f32["conv_b"])
        x = tf.nn.depthwise_conv2d(x, f32["dw_w"], [1, 1, 1, 1], "SAME") + f32["dw_b"]
        x = tf.nn.avg_pool2d(x, 2, 2, "VALID")
        logits = tf.matmul(tf.reshape(x, [1, -1]), f32["fc_w"]) + f32["fc_b"]
        return {"logits": logits, "probs": tf.nn.softmax(logits)}

    def representative():
        rng = np.random.default_rng(1)
        for _ in range(8):
            yield [rng.random(SHAPE, np.float32)]

    def fp16(c):
        c.optimizations, c.target_spec.supported_types = [tf.lite.Optimize.DEFAULT], [tf.float16]

    def int8(c):
        c.optimizations, c.representative_dataset = [tf.lite.Optimize.DEFAULT], representative
        c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        c.inference_input_type = c.inference_output_type = tf.int8

    for name, configure in {"fp32": None, "fp16": fp16, "int8": int8}.items():
        converter = tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], serve)
        if configure:
            configure(converter)
        path = folder / f"{name}.tflite"
        path.write_bytes(converter.convert())
        x = sample_input(np.int8 if name == "int8" else np.float32)
        interpreter = tf.lite.Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        answers = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
        np.savez(_expected(path), __input__=x, **answers)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _write_all(Path(sys.argv[1]))
