"""int8 dense layers and convolutions on AVX512-VNNI: u8 x s8 -> int32 register tiles on vpdpbusd, the int8
analogue of schedule_rules' bf16 path (vdpbf16ps). One vpdpbusd adds, to each of 16 int32 lanes, the dot
product of 4 uint8 values broadcast from A (the activations) with that lane's 4 int8 values of B (the
weights), so the weights are packed in quads, [J/width, .., K/4, width, 4], and the innermost reduction is
split by 4 with the quad innermost. A depth that is no multiple of 4 is zero-padded (dense layers).
Imports tvm."""

from __future__ import annotations

QUAD = 4  # K values per lane per vpdpbusd
VNNI_DOT = "mlc_vnni_dot_16x4"  # C[16] (int32) += A[4] (uint8) . B[16, 4] (int8)
VNNI_LLVM = "llvm.x86.avx512.vpdpbusd.512"


def vnni_intrinsic() -> str:
    """Register the tensor intrinsic. TVM 0.27 ships one (tvm.s_tir.tensor_intrin.x86 "dot_16x4_vnni") whose
    accumulator is a "global" buffer, so it does not match the register tile's "local" accumulator; importing
    that module also parses every TVM intrinsic (minutes here). Same operation, same LLVM call."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    if TensorIntrin.get(VNNI_DOT, allow_missing=True) is not None:
        return VNNI_DOT

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (16, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i, k in T.grid(16, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (16, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            # The LLVM 22 that TVM 0.27 links declares (<16 x i32>, <64 x i8>, <64 x i8>) -> <16 x i32> (checked in
            # the emitted IR); older LLVMs took three <16 x i32>, which is what TVM's own intrinsic passes
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                "int32x16", T.llvm_lookup_intrinsic_id(VNNI_LLVM), C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16),
                              dtype="int8x64"),
                B.vload([0, 0], dtype="int8x64"))

    TensorIntrin.register(VNNI_DOT, desc, impl)
    return VNNI_DOT


def _int8_operands(stmt) -> bool:
    """An int32 accumulator over a uint8 and an int8 operand (after legalisation: cast(a) * cast(b))."""
    if str(stmt.writes[0].source.dtype) != "int32" or len(stmt.reads) < 2:
        return False
    dtypes = [str(r.source.dtype) for r in stmt.reads]
    return "uint8" in dtypes and "int8" in dtypes


def vnni_dot_block(sch, block, target, lanes: int) -> bool:
    """Whether a register-tile block can run on vpdpbusd: int32 output from uint8 activations and int8 weights,
    16 lanes, and a target with AVX512-VNNI. The depth is checked by the caller (`depth_padding`)."""
    return lanes == 16 and _int8_operands(sch.get(block)) and has_vnni(target)


def has_vnni(target) -> bool:
    from tvm.target import codegen

    try:
        return bool(codegen.target_has_features("avx512vnni", target))
    except Exception:  # not an LLVM x86 target
        return False


def depth_padding(sch, reduction) -> int:
    """The multiple the innermost reduction must be padded to for the quads: 1 if it is one already, 0 if it
    cannot be known (a symbolic depth)."""
    value = sch.get(reduction[-1]).extent
    depth = int(value.value) if hasattr(value, "value") else None
    if depth is None:
        return 0
    return 1 if depth % QUAD == 0 else QUAD


def constant_params(sch) -> list:
    """The kernel's parameters that hold constants (its `layout_free_buffers`: the weights, which the build may
    repack and pad at compile time), in parameter order."""
    attrs = sch.mod["main"].attrs
    params = list(sch.mod["main"].params)
    return [params[i] for i in sorted({int(i) for i in (attrs.get("layout_free_buffers", []) if attrs else [])})]


def input_pads(sch, block) -> list:
    """The blocks that `pad_einsum` put before `block` to copy a computed (not constant) input into its padded
    shape: the activations, whose padding runs at inference (the weights' is folded at compile time)."""
    constant = constant_params(sch)
    return [p for p in sch.get_producers(block)
            if not any(r.source.same_as(c) for r in sch.get(p).reads for c in constant)]
