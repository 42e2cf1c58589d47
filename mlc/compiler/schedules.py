"""Relax -> executable with schedules: tuned ones from a MetaSchedule database, rule-based defaults
for the rest. Imports tvm (used by the compile and tuning workers only).

The pipeline is TVM's CPU pipeline split in two: legalize + fuse (the same preparation MetaSchedule's
task extraction does, so database keys match), then the database, then default rules for kernels
the database does not cover, then lowering (TIR through mlc.compiler.tir_pipeline: TVM's, with tile
accumulators on the stack)."""

from __future__ import annotations

from typing import Any, Optional

from mlc.compiler import dynamic_records
from mlc.compiler.contract import Note, NoteKind
from mlc.compiler.schedule_rules import SCHEDULED
from mlc.compiler.mutators import rewrite_functions


# conv2d in NHWC with HWIO weights: output channels become the contiguous axis that the default
# rule vectorizes and tiles in registers (in NCHW it vectorized the width: resnet18 kernels 13x slower).
# Weights are constants, so FoldConstant transposes them at compile time.
CONV_LAYOUT = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def _positive_squeeze_axes(mod):
    """`mod` with squeeze axes counted from the front: TVM 0.27's ConvertLayout runs out of memory
    (std::bad_alloc) on a squeeze with a negative axis, which torch's dynamo exporter emits for
    nn.MultiheadAttention."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    squeeze = tvm.ir.Op.get("relax.squeeze")

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(squeeze) or call.attrs.axis is None:
                return call
            axes = [int(a) for a in call.attrs.axis]
            ndim = getattr(call.args[0].ty, "ndim", -1)
            if ndim < 0 or all(a >= 0 for a in axes):
                return call
            return relax.op.squeeze(call.args[0], [a + ndim if a < 0 else a for a in axes])

    return rewrite_functions(Rewrite(mod), mod)


def _convert_layout(mod, notes: list[Note]):
    """conv2d to NHWC/HWIO, an optimisation: where TVM's ConvertLayout fails on a model (e.g.
    "Invalid SLayout: can't find S in source layout ABC" on ONNX Max, which imports as stack + max), the
    model builds in its own layout and a note says so."""
    from tvm import relax

    from mlc.compiler.layout_cleanup import after_convert_layout, before_convert_layout
    from mlc.compiler.relax_passes import quantize_as_elementwise

    mod = before_convert_layout(mod)
    try:
        converted = relax.transform.ConvertLayout(CONV_LAYOUT)(quantize_as_elementwise(_positive_squeeze_axes(mod)))
    except Exception as e:  # TVM raises InternalError/ValueError/bad_alloc; the step is optional
        from mlc.compiler.log import summarize

        notes.append(Note(NoteKind.FALLBACK, f"layout conversion (conv2d to NHWC) skipped: TVM's ConvertLayout "
                                             f"failed on this model: {summarize(e)}"))
        return after_convert_layout(mod)
    return after_convert_layout(converted)


def _legalize_and_fuse(mod, target, notes: Optional[list[Note]] = None):
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from mlc.compiler.grouped_conv import pad_group_channels
    from mlc.compiler.sorting import portable_argsort, portable_topk
    from mlc.compiler.relax_passes import int8_conv_rows, convs_as_rows, nan_preserving_legalizations, sink_crops
    from mlc.compiler.unit_reductions import fold_unit_reductions

    with target, portable_argsort(target):
        mod = portable_topk(_convert_layout(mod, notes if notes is not None else []), target)
        mod = pad_group_channels(mod, target)  # groups no multiple of the vector: padded to whole vectors
        mod = sink_crops(int8_conv_rows(convs_as_rows(mod, target), target))
        # relu/clip/max/min that keep NaN first; TVM's LegalizeOps then handles the other ops. Reductions over unit
        # axes (a 1x1 pool) become elementwise blocks, before a rule inlines an epilogue into their init.
        return tvm.transform.Sequential(cpu.library_dispatch_passes(target)
                                        + [relax.transform.LegalizeOps(nan_preserving_legalizations())]
                                        + cpu.legalize_passes(target) + [fold_unit_reductions()])(mod)


def extract_tasks(mod, target):
    """The kernels to tune, as `build` will see them (so database keys match), and kernel name ->
    the parameters every call passes a constant (the weights the default rule repacks)."""
    from tvm.s_tir import meta_schedule as ms

    from mlc.compiler import schedule_rules as rules

    fused = _legalize_and_fuse(mod, target)
    tasks = ms.relax_integration.extract_tasks(fused, target, module_equality="structural")
    tasks = [t for t in tasks if not t.dispatched[0]["main"].attrs or
             not t.dispatched[0]["main"].attrs.get(SCHEDULED, False)]
    constant_inputs = {gv.name_hint: [int(i) for i in f.attrs["layout_free_buffers"]]
                       for gv, f in rules.mark_constant_inputs(fused).functions_items()
                       if f.attrs and "layout_free_buffers" in f.attrs}
    return tasks, constant_inputs


def _kernels(mod) -> dict[str, bool]:
    import tvm

    return {gv.name_hint: bool(f.attrs and f.attrs.get(SCHEDULED, False))
            for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def _dynamic_notes(notes: list[Note], withheld: dict[str, str], failed: dict[str, str]) -> None:
    if withheld:
        at = "; ".join(sorted(set(withheld.values())))
        notes.append(Note(NoteKind.RECORDS,
                          f"{len(withheld)} kernels over symbolic dims have tuning records of their static twins "
                          f"({at}), not applied: replayed on symbolic extents such records ran slower than mlc's "
                          f"default schedules (benchmarks/dynamic-tuning); {dynamic_records.REPLAY_ENV}=replay "
                          "applies them: " + ", ".join(sorted(withheld))))
    for name, why in sorted(failed.items()):
        notes.append(Note(NoteKind.RECORDS, f"kernel {name} keeps the default schedule: {why}"))


def build(mod, target_json: dict[str, Any], db_dir: Optional[str], default: bool,
          notes: Optional[list[Note]] = None, lifted: Optional[list] = None) -> tuple[Any, dict[str, list[str]]]:
    """Compile `mod`; returns the executable and which kernels were {tuned, default, unscheduled}, and with a
    database of `mlc tune --dynamic` "tuned_at": ["kernel: seq=128"], the symbolic kernels among the tuned ones
    and the length of the static twin whose record each took. Given `lifted`, the weights are lifted out of the
    executable into it: `main` takes them after its inputs (mlc.compiler.weights).
    Optional steps skipped because TVM failed on them are appended to `notes`."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from mlc.compiler import inplace, records, tir_pipeline, weights
    from mlc.compiler import schedule_rules as rules

    target = tvm.target.Target(target_json)
    notes = [] if notes is None else notes
    report: dict[str, list[str]] = {"tuned": [], "default": [], "unscheduled": []}
    lengths = dynamic_records.read_lengths(db_dir) if db_dir else {}

    @tvm.transform.module_pass(opt_level=0)
    def pipeline(mod, _ctx):
        with target:
            mod = _legalize_and_fuse(mod, target, notes)
            before = _kernels(mod)
            if db_dir:
                said: list[str] = []  # records' notes: all about the records it skipped or moved
                database = records.open_readable(db_dir, said)
                notes.extend(Note(NoteKind.RECORDS, text) for text in said)
                with database:
                    mod = relax.transform.MetaScheduleApplyDatabase()(mod)
                if lengths:  # kernels over symbolic dims: the records of their static twins
                    mod, replayed, withheld, failed = dynamic_records.apply(
                        mod, database, target, lengths, SCHEDULED, dynamic_records.replay_requested())
                    report["tuned_at"] = [f"{k}: {v}" for k, v in sorted(replayed.items())]
                    _dynamic_notes(notes, withheld, failed)
            tuned = {k for k, v in _kernels(mod).items() if v and not before.get(k, False)}
            if default:
                said = []  # its one note: the kernels its rules failed on
                mod = rules.apply_default_schedules(mod, target, said)
                notes.extend(Note(NoteKind.UNSCHEDULED, text) for text in said)
            after = _kernels(mod)
            for name, scheduled in sorted(after.items()):
                kind = "tuned" if name in tuned else ("default" if scheduled else "unscheduled")
                report[kind].append(name)
            mod = rules.fold_weight_packing(mod, target, notes)
            mod = inplace.write_over_dead_inputs(mod)
            lift = [weights.lift_constants(lifted)] if lifted is not None else []
            return tvm.transform.Sequential(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target)
                                            + lift)(mod)

    rules.vectorizable_intrinsics()  # tuned kernels too, and builds without the default schedules
    executable = tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=tir_pipeline.register())
    return executable, report
