"""What a compiled program holds, read from XLA's optimized HLO text (andrea_jax.aot prints these):
the kernels by kind, the kernels that only convert a dtype, the matmuls by operand dtypes and the
operands of the cuDNN attention calls."""
from __future__ import annotations

import re

# custom-call targets in the optimized HLO -> what they are
KERNEL_CALLS = {
    "pallas_triton": ("__gpu$xla.gpu.triton",),       # Pallas kernels lowered through Triton
    "jax_triton": ("triton_kernel_call",),            # jax_triton.triton_call
    "cudnn_fmha": ("__cudnn$fmha",),                  # cuDNN flash attention, forward and backward
}


def kernel_counts(hlo_text: str) -> dict[str, int]:
    """How many custom calls of each kind of KERNEL_CALLS the optimized HLO holds."""
    targets = re.findall(r'custom_call_target="([^"]+)"', hlo_text)
    return {kind: sum(any(t.startswith(p) for p in prefixes) for t in targets)
            for kind, prefixes in KERNEL_CALLS.items()}


def cudnn_attention_operands(hlo_text: str) -> dict[str, list[str]]:
    """The forward cuDNN attention calls by target, each with its operands' shapes: q, k, v, and a
    fourth, [B, 1, T, T], where a mask (data.document_mask's) is folded into an additive bias
    (the target then names a Bias)."""
    calls = {}
    for target, operands in re.findall(r'custom_call_target="(__cudnn\$fmha[A-Za-z]*)", '
                                       r'operand_layout_constraints=\{((?:[^{}]|\{[^{}]*\})*)\}', hlo_text):
        if not target.endswith("Backward"):
            calls.setdefault(target, re.findall(r"[a-z0-9]+\[[0-9,]*\]", operands))
    return calls


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """name -> the instruction lines of each computation of an HLO module's text."""
    comps, name = {}, None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if head:
            name, comps[head.group(1)] = head.group(1), []
        elif line.startswith("}"):
            name = None
        elif name is not None and " = " in line:
            comps[name].append(line)
    return comps


def _opcode(line: str) -> str:
    rhs = re.sub(r"/\*.*?\*/", "", line.split(" = ", 1)[1])
    found = re.search(r"(?:^|\s)([a-z][\w\-]*)\(", rhs)
    return found.group(1) if found else ""


def convert_fusions(hlo_text: str) -> int:
    """Kernels of the optimized program that only convert a dtype (a fusion of converts, bitcasts,
    copies): a separate pass over memory that a producer writing the right dtype would spare."""
    comps = _computations(hlo_text)
    only_converts = {name for name, lines in comps.items()
                     if any(_opcode(l) == "convert" for l in lines)
                     and all(_opcode(l) in ("parameter", "convert", "bitcast", "copy") for l in lines)}
    calls = re.findall(r"\sfusion\([^\n]*?calls=%([\w.\-]+)", hlo_text)
    return sum(c in only_converts for c in calls)


def matmul_dtypes(hlo_text: str) -> dict[str, int]:
    """The matmuls of the optimized program (dots inside GEMM fusions, cuBLAS calls) by operand and
    result dtypes: {'bf16 x bf16 -> f32': count}."""
    counts: dict[str, int] = {}
    for lines in _computations(hlo_text).values():
        dtype_of = {}
        for line in lines:
            name, rhs = line.split(" = ", 1)
            dtype_of[name.split()[-1].lstrip("%")] = re.match(r"\(?([a-z0-9]+)\[", rhs.strip())
            op = _opcode(line)
            if op == "dot" or (op == "custom-call" and "__cublas$" in line):
                args = re.sub(r"/\*.*?\*/", "", rhs).split(f"{op}(", 1)[1]
                operands = re.findall(r"%([\w.\-]+)", args)[:2]
                kinds = [dtype_of.get(o) for o in operands]
                out = re.match(r"\(?([a-z0-9]+)\[", rhs.strip())
                if len(kinds) == 2 and all(kinds) and out:
                    key = f"{kinds[0].group(1)} x {kinds[1].group(1)} -> {out.group(1)}"
                    counts[key] = counts.get(key, 0) + 1
    return counts
