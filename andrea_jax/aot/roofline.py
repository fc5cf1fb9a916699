"""A roofline bound on a compiled step, read from XLA's optimized HLO: for every kernel the program
launches (a fusion, a library call, an unfused op), its FLOPs and the bytes it must move, and the
time neither can beat, max(FLOPs / peak, bytes / bandwidth), at the target's datasheet figures.
Their sum is a lower bound on the step's time, and the model's FLOPs over it an upper bound on MFU:
a bound, never a measurement.

The compile-only GPU client offers no cost analysis, so the figures are counted from the HLO's
shapes, in the manner of XLA's HloCostAnalysis: a dot costs 2 x its output elements x its
contracted size, an elementwise op or reduction 1 FLOP per element it reads or writes, cuDNN's flash
attention 4 B H Tq Tk D forward and 2.5 times that backward (half of each under a causal mask); a
Pallas or Triton kernel counts 1 FLOP per output element. Bytes are each kernel's operands and
outputs once, except where a fusion touches only part of a buffer: a slice of an operand counts its
slice, an in-place update its update. A loop's body counts its known trip count times; the
branches of a conditional count nothing (either may not run). Every FLOP is priced at the dense
bf16 peak, so the bound stays a lower one for float32 dots. Every byte is priced at HBM's bandwidth:
an operand its producer left in L2 (50 MB on an H100 or H200) can come faster, so where kernels
pass small tensors to each other the bound is not strict.
"""
from __future__ import annotations

import dataclasses
import math
import re

DATASHEET = {  # dense bf16 FLOP/s and memory bytes/s per GPU
    "h200": (989e12, 4.8e12),
    "h100": (989e12, 3.35e12),
    "a100": (312e12, 2.039e12),
}
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 0.5, "u4": 0.5, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# no kernel of their own: they alias, name or sequence buffers, or hand work to a called computation
NO_KERNEL = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "while", "conditional", "call",
             "after-all", "partition-id", "replica-id", "add-dependency", "opt-barrier", "copy-start", "copy-done",
             "async-start", "async-update", "async-done", "send", "recv", "send-done", "recv-done"}
# move or name data without arithmetic
NO_FLOPS = NO_KERNEL | {"broadcast", "reshape", "transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
                        "concatenate", "pad", "gather", "iota", "convert", "reverse", "bitcast-convert"}
SLICES = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str
    args: str = ""      # the text between the opcode's parentheses (a parameter's index)
    root: bool = False


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    kind: str       # the fusion's kind, the custom call's target, or the opcode
    flops: float
    bytes: float
    count: int      # launches per step (a loop body's trip count)

    def seconds(self, peak: float, bandwidth: float) -> float:
        return self.count * max(self.flops / peak, self.bytes / bandwidth)

    def bound_by(self, peak: float, bandwidth: float) -> str:
        return "compute" if self.flops / peak >= self.bytes / bandwidth else "memory"


def _close(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at text[start]."""
    depth, pairs = 0, {"(": ")", "{": "}", "[": "]"}
    opening = text[start]
    for i in range(start, len(text)):
        if text[i] == opening:
            depth += 1
        elif text[i] == pairs[opening]:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {opening!r} in {text[:120]!r}")


def parse_instruction(line: str) -> Instruction | None:
    head = re.match(r"\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*", line)
    if not head:
        return None
    rest = re.sub(r"/\*.*?\*/", "", line[head.end():])
    end = _close(rest, 0) if rest.startswith("(") else re.match(r"\S+", rest).end()
    shape, rest = rest[:end], rest[end:].lstrip()
    op = re.match(r"([a-z][\w\-]*)\(", rest)
    if not op:
        return None
    close = _close(rest, op.end() - 1)
    args = rest[op.end():close - 1]
    return Instruction(head.group(2), shape, op.group(1), tuple(re.findall(r"%([\w.\-]+)", args)), rest[close:],
                       args.strip(), bool(head.group(1)))


def computations(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
    """{computation name: its instructions} and the name of the entry computation."""
    comps, name, entry = {}, None, ""
    for line in hlo_text.splitlines():
        head = re.match(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if head:
            name, comps[head.group(2)] = head.group(2), []
            entry = head.group(2) if head.group(1) else entry
        elif line.startswith("}"):
            name = None
        elif name is not None and (inst := parse_instruction(line)):
            comps[name].append(inst)
    return comps, entry


def shape_bytes(shape: str) -> float:
    return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in re.findall(r"([a-z][a-z0-9]*)\[([0-9,]*)\]", shape))


def elements(shape: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([0-9,]*)\]", shape))


def _dims(shape: str) -> list[int]:
    found = re.search(r"\[([0-9,]*)\]", shape)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def _attr(attrs: str, key: str) -> str | None:
    found = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return found.group(1) if found else None


def _dot_flops(inst: Instruction, shapes: dict[str, str]) -> float:
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", inst.attrs)
    lhs = _dims(shapes.get(inst.operands[0], ""))
    k = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting and lhs else 1
    return 2.0 * elements(inst.shape) * k


def _attention_flops(inst: Instruction, shapes: dict[str, str], target: str) -> float:
    scores = re.search(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[([^\]]*)\]', inst.attrs)
    q = _dims(shapes.get(inst.operands[0], ""))
    if not scores or not q:
        return float(elements(inst.shape))
    b_h_tq_tk = [int(d.strip().strip('"')) for d in scores.group(1).split(",")]
    forward = 4.0 * math.prod(b_h_tq_tk) * q[-1]
    causal = 0.5 if re.search(r'"mask_type":\s*"CAUSAL"', inst.attrs) else 1.0
    return forward * causal * (2.5 if target.endswith("Backward") else 1.0)


def computation_flops(comps: dict, name: str) -> float:
    """FLOPs of one run of a computation (a fusion's body), fused calls within it included."""
    insts = comps.get(name, [])
    shapes = {i.name: i.shape for i in insts}
    total = 0.0
    for inst in insts:
        if inst.opcode == "dot":
            total += _dot_flops(inst, shapes)
        elif inst.opcode == "fusion":
            total += computation_flops(comps, _attr(inst.attrs, "calls"))
        elif inst.opcode == "reduce":
            total += sum(elements(shapes.get(o, "")) for o in inst.operands[:len(inst.operands) // 2])
        elif inst.opcode not in NO_FLOPS:
            total += elements(inst.shape)
    return total


def _users(insts: list[Instruction]) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = {}
    for inst in insts:
        for o in inst.operands:
            users.setdefault(o, []).append(inst)
    return users


def _touched(name: str, users: dict, full: float) -> float:
    """Bytes a fusion reads of its parameter `name`: its slices' where only slices read it (through
    bitcasts), nothing where it is only the buffer an in-place update writes into, else all of it."""
    frontier, read = [name], 0.0
    while frontier:
        current = frontier.pop()
        for user in users.get(current, []):
            if user.opcode == "bitcast":
                frontier.append(user.name)
            elif user.opcode in SLICES and user.operands[0] == current:
                read += shape_bytes(user.shape)
            elif user.opcode == "dynamic-update-slice" and user.operands[0] == current:
                continue
            else:
                return full
    return read


def fusion_bytes(inst: Instruction, comps: dict, shapes: dict[str, str]) -> float:
    """Bytes a fusion moves: what it reads of each operand (_touched) and what it writes, an in-place
    update's update only."""
    body = comps.get(_attr(inst.attrs, "calls"), [])
    if not body:
        return sum(shape_bytes(shapes.get(o, "")) for o in inst.operands) + shape_bytes(inst.shape)
    users, body_shapes = _users(body), {i.name: i.shape for i in body}
    params = {int(i.args): i.name for i in body if i.opcode == "parameter"}
    read = sum(_touched(params[k], users, shape_bytes(shapes.get(o, ""))) if k in params
               else shape_bytes(shapes.get(o, "")) for k, o in enumerate(inst.operands))
    root = next((i for i in body if i.root), body[-1])
    by_name = {i.name: i for i in body}
    outputs = [by_name[o] for o in root.operands if o in by_name] if root.opcode == "tuple" else [root]
    written = sum(shape_bytes(body_shapes.get(r.operands[1], "")) if r.opcode == "dynamic-update-slice"
                  else shape_bytes(r.shape) for r in outputs)
    return read + written


def _trip_count(inst: Instruction) -> int:
    found = re.search(r'"known_trip_count":\s*\{\s*"n":\s*"(\d+)"', inst.attrs)
    return int(found.group(1)) if found else 1


def kernel_of(inst: Instruction, comps: dict, shapes: dict[str, str], count: int) -> Kernel:
    operand_bytes = sum(shape_bytes(shapes.get(o, "")) for o in inst.operands)
    if inst.opcode == "fusion":
        kind = re.search(r"kind=(k\w+)", inst.attrs)
        return Kernel(inst.name, kind.group(1) if kind else "fusion",
                      computation_flops(comps, _attr(inst.attrs, "calls")), fusion_bytes(inst, comps, shapes), count)
    if inst.opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', inst.attrs).group(1)
        if target.startswith("__cudnn$fmha"):
            flops = _attention_flops(inst, shapes, target)
        elif target.startswith("__cublas"):
            contracting = re.search(r'"lhs_contracting_dimensions":\s*\[([^\]]*)\]', inst.attrs)
            lhs = _dims(shapes.get(inst.operands[0], ""))
            k = math.prod(lhs[int(d.strip().strip('"'))] for d in contracting.group(1).split(",") if d.strip()) \
                if contracting and lhs else 1
            flops = 2.0 * elements(re.match(r"\(?\s*([^,)]+)", inst.shape).group(1)) * k
        else:
            flops = float(elements(inst.shape))
        return Kernel(inst.name, target, flops, operand_bytes + shape_bytes(inst.shape), count)
    if inst.opcode == "dynamic-update-slice":
        update = shape_bytes(shapes.get(inst.operands[1], ""))
        return Kernel(inst.name, inst.opcode, 0.0, 2 * update, count)
    flops = _dot_flops(inst, shapes) if inst.opcode == "dot" else computation_flops({"one": [inst]}, "one")
    return Kernel(inst.name, inst.opcode, flops, operand_bytes + shape_bytes(inst.shape), count)


def kernels(hlo_text: str) -> list[Kernel]:
    """Every kernel one run of the program launches, with its launches per run."""
    comps, entry = computations(hlo_text)
    found: list[Kernel] = []

    def walk(name: str, count: int) -> None:
        shapes = {i.name: i.shape for i in comps.get(name, [])}
        for inst in comps.get(name, []):
            if inst.opcode == "while":
                walk(_attr(inst.attrs, "body"), count * _trip_count(inst))
            elif inst.opcode == "call":
                walk(_attr(inst.attrs, "to_apply"), count)
            elif inst.opcode not in NO_KERNEL:
                found.append(kernel_of(inst, comps, shapes, count))
    walk(entry, 1)
    return found


@dataclasses.dataclass(frozen=True)
class Roofline:
    target: str
    kernels: tuple[Kernel, ...]

    @property
    def peak(self) -> float:
        return DATASHEET[self.target][0]

    @property
    def bandwidth(self) -> float:
        return DATASHEET[self.target][1]

    @property
    def seconds(self) -> float:
        """The lower bound on one run of the program."""
        return sum(k.seconds(self.peak, self.bandwidth) for k in self.kernels)

    def max_mfu(self, model_flops: float) -> float:
        """The upper bound on MFU that the lower bound on time allows."""
        return model_flops / (self.seconds * self.peak) if self.seconds else math.nan

    def as_dict(self, model_flops: float) -> dict:
        flops = sum(k.count * k.flops for k in self.kernels)
        moved = sum(k.count * k.bytes for k in self.kernels)
        return {"bound_s": self.seconds, "max_mfu": self.max_mfu(model_flops), "flops": flops, "bytes": moved,
                "launches": sum(k.count for k in self.kernels),
                "memory_bound_s": sum(k.seconds(self.peak, self.bandwidth) for k in self.kernels
                                      if k.bound_by(self.peak, self.bandwidth) == "memory")}

    def lines(self, model_flops: float, top: int = 10) -> list[str]:
        d = self.as_dict(model_flops)
        peak, bw = self.peak, self.bandwidth
        lines = [f"roofline ({self.target}: {peak / 1e12:g} TFLOP/s bf16, {bw / 1e12:g} TB/s; a bound, not a "
                 f"measurement): {d['launches']} kernel launches, {d['flops']:.4g} FLOPs, {d['bytes'] / 2**30:.2f} GiB "
                 f"moved; step >= {d['bound_s'] * 1e3:.2f} ms ({d['memory_bound_s'] * 1e3:.2f} ms of it memory-bound), "
                 f"so MFU <= {100 * d['max_mfu']:.1f}%"]
        ranked = sorted(self.kernels, key=lambda k: -k.seconds(peak, bw))[:top]
        lines.append("  bound (all launches), bound by, launches, FLOPs and MiB per launch, kernel")
        for k in ranked:
            lines.append(f"  {k.seconds(peak, bw) * 1e3:8.3f} ms  {k.bound_by(peak, bw):7s}  x{k.count:<3d} "
                         f"{k.flops:.3g} FLOPs {k.bytes / 2**20:.1f} MiB  {k.kind} {k.name}")
        return lines


def roofline(hlo_text: str, target: str) -> Roofline:
    if target not in DATASHEET:
        raise ValueError(f"no datasheet figures for target {target!r}; known: {', '.join(DATASHEET)}")
    return Roofline(target, tuple(kernels(hlo_text)))
