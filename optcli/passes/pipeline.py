"""The order passes run in, in one place, top to bottom.

Cleanup first (so fusions see constant weights and no stray Identity/Dropout between the nodes
they match), then fusions, ordered so each one feeds the next: activation patterns become single
nodes before conv fusion looks for them; pads and BNs go into convs before the bias/activation
epilogue is attached; dense layers become FullyConnected before they get their epilogue.
Cleanup again at the end removes what the fusions left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from optcli.errors import UsageError
from optcli.ir import Graph
from optcli.passes import (
    batchnorm_to_affine,
    choose_host_layout,
    compile_bodies,
    compress_weights,
    constants_into_bodies,
    drop_redundant_fake_quant,
    eliminate_common_subexpressions,
    eliminate_identity,
    fold_affine_into_concat,
    fold_affine_into_next_conv,
    fold_constants,
    fold_constants_before_qdq,
    fold_dynamic_reshape_shapes,
    fold_pad_into_conv,
    fold_shape_chains,
    fold_transpose_into_dense,
    fuse_activation_patterns,
    fuse_conv_bias_activation,
    fuse_conv_bn,
    fuse_conv_scale,
    fuse_dynamic_quant_matmul,
    fuse_fake_quant,
    fuse_gelu,
    fuse_gru_cell,
    fuse_layer_norm,
    fuse_matmul_add,
    fuse_parallel_dense,
    inline_constant_if,
    insert_copies,
    keep_small_islands_on_host,
    place_nodes,
    plan_memory,
    qdq_lowering,
    qoperator_to_qdq,
    quantize_int8,
    remove_dead_nodes,
    select_kernels,
    slices_to_split,
)

PASSES: list[ModuleType] = [
    # pre-quantized models: QOperator ops -> QDQ; QDQ pairs -> integer steps or FakeQuant, weights -> int8 storage
    qoperator_to_qdq,
    fold_constants_before_qdq,  # run-time pad arithmetic folded, shapes static: the chains below can match
    *qdq_lowering.PASSES,  # QDQ chains -> integer steps (host-only plans), the rest -> FakeQuant
    # cleanup
    fold_constants,
    inline_constant_if,  # after folding made its condition a constant; folds the branch it inlines
    constants_into_bodies,  # the If/Loop/Scan left: their bodies fold what they compute from constants
    compile_bodies,  # then the bodies go through BODY_PASSES
    eliminate_identity,
    remove_dead_nodes,
    eliminate_common_subexpressions,
    slices_to_split,  # after CSE merged repeated Slices
    drop_redundant_fake_quant,  # pre-quantized models: before Pad meets Conv
    # fusion
    fuse_activation_patterns,
    fuse_gelu,
    fuse_layer_norm,
    fold_pad_into_conv,
    fuse_conv_bn,
    # int8 post-training quantization (--quant_type=INT8): calibrated once batch norms are in the convs,
    # written as QDQ chains and lowered at once (integer steps on the host, the float view elsewhere),
    # before the epilogue fusions would hide the Conv -> Relu -> QuantizeLinear chains from that lowering
    quantize_int8,
    drop_redundant_fake_quant,
    batchnorm_to_affine,
    fuse_dynamic_quant_matmul,  # before fuse_matmul_add: its bias Add is part of the chain
    fuse_matmul_add,
    fold_transpose_into_dense,  # after fuse_matmul_add: the dense layers it permutes are FullyConnected
    fuse_conv_scale,  # after fuse_matmul_add (dense layers are FullyConnected); its chain may end in an activation
    fold_affine_into_next_conv,  # what fuse_conv_scale left: chains after a nonlinearity, before a conv
    fuse_conv_bias_activation,
    fold_affine_into_concat,  # after the ChannelAffine took its activation: the convs take both
    fuse_fake_quant,  # after the epilogue activation is in place: FakeQuant is its last stage
    fold_dynamic_reshape_shapes,
    fold_shape_chains,
    fuse_parallel_dense,  # after the epilogues are in place: only layers with the same one fuse
    # cleanup again
    fold_constants,
    eliminate_identity,
    remove_dead_nodes,
    # placement and lowering preparation (required: the plan needs them)
    place_nodes,
    keep_small_islands_on_host,
    insert_copies,
    select_kernels,
    choose_host_layout,  # after the kernels are known: which of them have blocked variants
    compress_weights,
    plan_memory,
]

# What compile_bodies runs on each If/Loop/Scan body (its nested bodies through compile_bodies
# again): the cleanup and fusions above that make sense for a host body.  No quantization (no
# calibration data reaches a body), no placement or lowering (the control-flow executor runs a
# body's nodes with the kernels that fit any node), no fusions into the GPU's or the blocked
# layout's ops.
BODY_PASSES: list[ModuleType] = [
    fold_constants,
    inline_constant_if,
    constants_into_bodies,
    compile_bodies,
    eliminate_identity,
    remove_dead_nodes,
    eliminate_common_subexpressions,
    slices_to_split,
    fuse_activation_patterns,
    fuse_gelu,
    fuse_layer_norm,
    fuse_matmul_add,
    fuse_gru_cell,  # after fuse_matmul_add (its products are FullyConnected), before the epilogues take its gates
    fuse_conv_bias_activation,
    fold_dynamic_reshape_shapes,
    fold_shape_chains,
    fold_constants,
    eliminate_identity,
    remove_dead_nodes,
]

REQUIRED = {place_nodes.NAME, insert_copies.NAME, select_kernels.NAME, plan_memory.NAME}

Progress = Callable[[dict[str, Any]], None]


def pass_names(passes: Iterable[ModuleType] = PASSES) -> list[str]:
    """Distinct pass names in pipeline order."""
    return list(dict.fromkeys(p.NAME for p in passes))


def describe_passes(passes: Iterable[ModuleType] = PASSES) -> list[tuple[str, str]]:
    """(name, description) of each distinct pass, in pipeline order (for ``--print_passes``)."""
    seen: dict[str, str] = {}
    for p in passes:
        seen.setdefault(p.NAME, p.DESCRIPTION)
    return list(seen.items())


def check_disabled(disabled: Iterable[str], passes: Iterable[ModuleType] = PASSES) -> None:
    """Raise UsageError when ``disabled`` names a pass that does not exist."""
    valid = pass_names(passes)
    unknown = sorted(set(disabled) - set(valid))
    if unknown:
        raise UsageError(
            f"unknown pass name(s) {', '.join(repr(u) for u in unknown)} in --disable_pass; "
            f"valid names: {', '.join(v for v in valid if v not in REQUIRED)}"
        )
    required = sorted(set(disabled) & REQUIRED)
    if required:
        raise UsageError(f"pass {', '.join(required)} cannot be disabled: every plan needs it")


def optimize(
    graph: Graph,
    ctx: Any,
    disabled: Iterable[str] = frozenset(),
    progress: Progress | None = None,
    passes: list[ModuleType] | None = None,
) -> list[dict[str, Any]]:
    """Run the pipeline on ``graph`` in place, skipping passes named in ``disabled``.

    Returns one record per pass run, in order: ``{"name", "changed", "nodes_before",
    "nodes_after"}`` where ``changed`` is the pass's own counts.  ``progress``, when given, is
    called with each record as soon as its pass finishes.
    """
    passes = PASSES if passes is None else passes
    if getattr(ctx, "body_passes", False) is None:
        ctx.body_passes = [p for p in BODY_PASSES if p.NAME not in set(disabled)]
    disabled = set(disabled)
    check_disabled(disabled, passes)
    ctx.disabled_passes = frozenset(disabled)
    records: list[dict[str, Any]] = []
    for p in passes:
        if p.NAME in disabled:
            continue
        before = len(graph.nodes)
        changed = p.run(graph, ctx) or {}
        record = {
            "name": p.NAME,
            "changed": dict(changed),
            "nodes_before": before,
            "nodes_after": len(graph.nodes),
        }
        records.append(record)
        if progress is not None:
            progress(record)
    return records
