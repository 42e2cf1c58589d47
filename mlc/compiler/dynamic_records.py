"""Tuning records for kernels over symbolic dims (issue #23): a `--dynamic` build's kernel takes the record of
its static twin, the same kernel at a length `mlc tune --dynamic` tuned.

MetaSchedule keys records by the kernel's structure, constants included, so a kernel over `seq` never matches
the record tuned at seq=128. Here the symbolic dims are bound to each tuned length (PrimFunc.specialize), the
record is looked up by that static kernel, and its trace is replayed on the symbolic kernel. A trace cannot be
replayed as it is: SamplePerfectTile cannot sample a symbolic extent (TVM 0.27 fails with "old_rv != nullptr"),
so those samples become literal factors that leave the symbolic loop untiled (see open_tiles); the other loops
keep their tuned tiles, vectorization and unrolling.

Measured on bert-tiny (benchmarks/dynamic-tuning), every replayed kernel but one ran slower than mlc's default
schedule of the symbolic kernel, so replays are opt-in (REPLAY_ENV); by default the build names the twins found.

The lengths tuned are kept next to the database (LENGTHS_FILE); this module reads it without tvm."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LENGTHS_FILE = "dynamic_lengths.json"
REPLAY_ENV = "MLC_DYNAMIC_RECORDS"
_SAMPLING = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation", "SamplePartitionedTile")


def read_lengths(db_dir: str | Path) -> dict[str, list[int]]:
    """{dim: [lengths tuned, first = the preferred one]} from a database folder; {} when none were recorded."""
    path = Path(db_dir) / LENGTHS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return {str(k): [int(v) for v in vs] for k, vs in data.get("dims", {}).items()}


def add_lengths(db_dir: str | Path, lengths: dict[str, int]) -> dict[str, list[int]]:
    """Record that the database holds kernels tuned at `lengths` ({dim: length}); earlier lengths stay first."""
    known = read_lengths(db_dir)
    for dim, value in lengths.items():
        if int(value) not in known.setdefault(dim, []):
            known[dim].append(int(value))
    path = Path(db_dir) / LENGTHS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dims": known}, indent=1) + "\n")
    tmp.replace(path)
    return known


def _shape(param):
    try:
        return list(param.shape)
    except AttributeError:  # a scalar parameter (a symbolic dim passed by value)
        return None


def symbolic_dims(func) -> dict[str, Any]:
    """{name: tirx Var} of the symbolic dims in `func`'s parameters (buffer shapes, scalar params)."""
    from tvm import tirx

    found: dict[str, Any] = {}
    for param in func.params:
        shape = _shape(param)
        if shape is None:
            if str(param.ty).startswith("int"):
                found[param.name] = param
            continue
        for dim in shape:
            if isinstance(dim, tirx.Var):
                found[dim.name] = dim
            elif not isinstance(dim, tirx.IntImm):
                for var in tirx.analysis.undefined_vars(dim):
                    found[var.name] = var
    return found


def specialize(func, values: dict[str, int]):
    """`func` with the named symbolic dims bound to `values` (the static twin's form)."""
    from tvm import tirx

    for param in func.params:
        shape = _shape(param)
        if shape is None:
            if param.name in values:
                return specialize(func.specialize({param: tirx.IntImm(str(param.ty), values[param.name])}), values)
            continue
        if any(isinstance(d, tirx.Var) and d.name in values for d in shape):
            static = [tirx.IntImm(str(d.ty), values[d.name]) if isinstance(d, tirx.Var) and d.name in values else d
                      for d in shape]
            return specialize(func.specialize({param: tirx.decl_buffer(static, param.dtype, param.name)}), values)
    return func


def searched(trace) -> bool:
    """Whether a record's trace came from MetaSchedule's search; the default schedule `mlc tune` seeds the
    database with samples nothing. Where that seed won, mlc's default rule schedules the symbolic kernel
    itself (it handles symbolic rows better than a replay of its static trace)."""
    return any(inst.kind.name in _SAMPLING for inst in trace.insts)


def open_tiles(trace, symbolic: set[int]):
    """`trace` with the SamplePerfectTile instructions at indices `symbolic` (those over a symbolic extent) replaced
    by literal split factors [None, 1, ...]: the symbolic loop is left untiled, without a predicate. Keeping the
    tuned factors instead (ceildiv(extent, tile) with a predicated tail) ran 1.2-80x slower and gave wrong outputs
    on bert-tiny at seq 8 and 200 (max abs diff 0.087; benchmarks/dynamic-tuning)."""
    from tvm import tirx
    from tvm.s_tir.schedule import Instruction, Trace

    decisions = dict(trace.decisions.items())
    factors: dict = {}
    insts, kept_decisions = [], {}
    for index, inst in enumerate(trace.insts):
        if index in symbolic:
            for position, rv in enumerate(inst.outputs):
                factors[rv] = None if position == 0 else tirx.IntImm("int64", 1)
            continue
        if any(x in factors for x in inst.inputs if x is not None and not isinstance(x, (int, float, str))):
            inst = Instruction(inst.kind, [factors.get(x, x) if x is not None and not isinstance(
                x, (int, float, str)) else x for x in inst.inputs], list(inst.attrs), list(inst.outputs))
        elif inst in decisions:
            kept_decisions[inst] = decisions[inst]
        insts.append(inst)
    return Trace(insts, kept_decisions)


class _SymbolicSample(Exception):
    pass


def replay(func, trace):
    """`func` (symbolic) scheduled by `trace` (from its static twin); raises where TVM cannot apply it.
    SamplePerfectTile cannot sample a symbolic extent (TVM 0.27 fails with "old_rv != nullptr"): each such
    sample is found by replaying up to it (the decision provider sees the loop), then written as fixed factors."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import schedule as tsch

    symbolic: set[int] = set()
    originals = list(trace.insts)
    while True:
        rewritten = open_tiles(trace, symbolic)
        sch = tsch.Schedule(tvm.IRModule({"main": func}))
        found: list[int] = []

        def provider(inst, inputs, _attrs, decision, sch=sch, found=found):
            if inst.kind.name == "SamplePerfectTile" and not isinstance(sch.get(inputs[0]).extent, tirx.IntImm):
                found.append(next(i for i, x in enumerate(originals) if x.same_as(inst)))
                raise _SymbolicSample()
            return decision

        try:
            rewritten.apply_to_schedule(sch, remove_postproc=False, decision_provider=provider)
            return sch.mod["main"]
        except Exception:
            if not found or found[0] in symbolic:
                raise
            symbolic.add(found[0])


def replay_requested() -> bool:
    """Replays are opt-in (REPLAY_ENV=replay): on bert-tiny every replayed kernel ran slower than mlc's default
    schedule of the symbolic kernel, 1.1-3x the whole model (benchmarks/dynamic-tuning)."""
    return os.environ.get(REPLAY_ENV, "") == "replay"


def apply(mod, database, target, lengths: dict[str, list[int]], scheduled_attr: str, replay_records: bool):
    """Find the static twin's record of each unscheduled kernel of `mod` over symbolic dims; with
    `replay_records`, schedule the kernel with it.

    Returns (mod, applied {kernel: "seq=128"}, withheld {kernel: "seq=128"}: twins with a searched record not
    applied, failed {kernel: why}: twins whose record did not replay (the kernel keeps the default schedule))."""
    import tvm

    from mlc.compiler.log import summarize

    applied: dict[str, str] = {}
    withheld: dict[str, str] = {}
    failed: dict[str, str] = {}
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs and func.attrs.get(scheduled_attr, False)):
            continue
        dims = symbolic_dims(func)
        if not dims or any(d not in lengths for d in dims):
            continue
        for values in _candidates({d: lengths[d] for d in dims}):
            # keyed as MetaSchedule's task extraction keys it: a public "main"
            twin = tvm.IRModule({"main": specialize(func, values).with_attr("global_symbol", "main")})
            record = database.query_tuning_record(twin, target, "main") if database.has_workload(twin) else None
            if record is None:
                continue
            at = ", ".join(f"{k}={v}" for k, v in values.items())
            if not searched(record.trace):
                break  # tuning kept mlc's default schedule for this kernel: the default rule schedules it
            if not replay_records:
                withheld[gv.name_hint] = at
                break
            try:
                updates[gv] = replay(func, record.trace).with_attr(scheduled_attr, True)
                applied[gv.name_hint] = at
            except Exception as e:  # TVM rejects the trace on this kernel: the default schedule
                failed[gv.name_hint] = f"the record tuned at {at} did not replay ({summarize(e)})"
            break
    for gv, func in updates.items():
        mod[gv] = func
    return mod, applied, withheld, failed


def _candidates(lengths: dict[str, list[int]]):
    """Assignments of the tuned lengths to the kernel's dims, the preferred (first recorded) lengths first."""
    import itertools

    names = sorted(lengths)
    for combo in itertools.product(*(lengths[n] for n in names)):
        yield dict(zip(names, combo))
