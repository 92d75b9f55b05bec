"""The onnxscript source of `oscript_table_decoder_loop40` (recipes_recurrent.py): a paddle2onnx-style
table-structure decoder, a `Loop` around an attention GRU cell.

A module of its own, imported only when that recipe is built, because onnxscript reads the
function's annotations (FLOAT[...]) by name from the module and its closure: with
`from __future__ import annotations` (as in the recipe files) they would not resolve.

    python corpus/oscript_table_decoder.py OUT.onnx     # what the recipe runs, with PYTHONHASHSEED=0

onnxscript orders a loop's carried values by iterating a set of names, so the order of the
Loop's inputs (and the names it numbers) follows the hash seed: the recipe runs this file in a
child process with PYTHONHASHSEED=0 to get the same file every time.
"""
import sys

import numpy as np
from onnxscript import FLOAT, script
from onnxscript import opset17 as op
from recipes_recurrent import TABLE_C as C
from recipes_recurrent import TABLE_H as H
from recipes_recurrent import TABLE_HW as HW
from recipes_recurrent import TABLE_K as K
from recipes_recurrent import TABLE_LOC as LOC
from recipes_recurrent import TABLE_STEPS as N


def decoder_proto(seed: int = 0):
    """The decoder as a ModelProto: weights as Constant nodes of the main graph (seeded), which
    the Loop body reads from the outer scope; per-step results go into carried [1, N, *] tensors
    by ScatterND, as paddle2onnx writes `preds[:, i, :] = step`."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    wi2h, wh2h, bh2h, wscore = w(C, H), w(H, H), w(1, H)[0], w(H, 1)
    wx, wh, bx, bh = w(C + K, 3 * H), w(H, 3 * H), w(1, 3 * H)[0], w(1, 3 * H)[0]
    wgen, bgen, wloc, bloc = w(H, K), w(1, K)[0], w(H, LOC), w(1, LOC)[0]

    @script()
    def decoder(x: FLOAT[1, C, HW, HW]) -> (FLOAT[1, N, K], FLOAT[1, N, LOC]):
        Wi2h, Wh2h, Bh2h = op.Constant(value=wi2h), op.Constant(value=wh2h), op.Constant(value=bh2h)
        Wscore, Wx, Wh = op.Constant(value=wscore), op.Constant(value=wx), op.Constant(value=wh)
        Bx, Bh, Wgen = op.Constant(value=bx), op.Constant(value=bh), op.Constant(value=wgen)
        Bgen, Wloc, Bloc = op.Constant(value=bgen), op.Constant(value=wloc), op.Constant(value=bloc)
        feats = op.Transpose(op.Reshape(x, op.Constant(value_ints=[1, C, -1])), perm=[0, 2, 1])
        proj = op.MatMul(feats, Wi2h)                          # [1, HW*HW, H], outside the loop
        hidden = op.ConstantOfShape(op.Constant(value_ints=[1, H]))
        pre = op.Constant(value_ints=[0])                      # start token
        probs = op.ConstantOfShape(op.Constant(value_ints=[1, N, K]))
        locs = op.ConstantOfShape(op.Constant(value_ints=[1, N, LOC]))
        for i in range(N):
            # depth is a rank-1, 1-element tensor, as paddle2onnx writes it
            onehot = op.OneHot(pre, op.Constant(value_ints=[K]), op.Constant(value_floats=[0.0, 1.0]), axis=-1)
            hp = op.Unsqueeze(op.Add(op.MatMul(hidden, Wh2h), Bh2h), op.Constant(value_ints=[1]))
            att = op.Softmax(op.MatMul(op.Tanh(op.Add(proj, hp)), Wscore), axis=1)
            context = op.Squeeze(op.MatMul(op.Transpose(att, perm=[0, 2, 1]), feats), op.Constant(value_ints=[1]))
            gx = op.Add(op.MatMul(op.Concat(context, onehot, axis=1), Wx), Bx)
            gh = op.Add(op.MatMul(hidden, Wh), Bh)
            xr, xz, xc = op.Split(gx, op.Constant(value_ints=[H, H, H]), axis=1)
            hr, hz, hc = op.Split(gh, op.Constant(value_ints=[H, H, H]), axis=1)
            r = op.Sigmoid(op.Add(xr, hr))
            z = op.Sigmoid(op.Add(xz, hz))
            cand = op.Tanh(op.Add(xc, op.Mul(r, hc)))
            hidden = op.Add(op.Mul(op.Sub(op.Constant(value_float=1.0), z), cand), op.Mul(z, hidden))
            step = op.Add(op.MatMul(hidden, Wgen), Bgen)
            loc = op.Sigmoid(op.Add(op.MatMul(hidden, Wloc), Bloc))
            where = op.Unsqueeze(op.Concat(op.Constant(value_ints=[0]), op.Reshape(i, op.Constant(value_ints=[1])),
                                           axis=0), op.Constant(value_ints=[0]))
            probs = op.ScatterND(probs, where, op.Softmax(step, axis=1))
            locs = op.ScatterND(locs, where, loc)
            pre = op.ArgMax(step, axis=1, keepdims=0)          # the next step's token
        return probs, locs

    return decoder.to_model_proto()


if __name__ == "__main__":
    import onnx
    onnx.save(decoder_proto(), sys.argv[1])
