"""Compile every ``triton`` backend kernel ahead of time for Hopper (sm_90) and Ampere (sm_80), no GPU needed.

    python benchmarks/triton_aot.py [--arch 90 80] [--hidden 64 128 256 512] [--jobs 2] [--out PATH]
    python benchmarks/triton_aot.py --subset ci --out -      # the CI test's subset, rows as JSON on stdout
    python benchmarks/triton_aot.py --sass-report benchmarks/results/triton_sass_report.json   # issue 55's report

For each configuration the backend's launcher (``ops.fwd_launch`` / ``ops.bwd_launch``) is asked
which kernel it would launch and with which arguments, strides and constexprs (block sizes,
``num_warps``, ``HAS_INIT``/``HAS_RESET``/``SAVE``, precision), on meta tensors of a representative
problem (E=1, N=256, T=64, F=H, bias on). That call is specialised as Triton's JIT would at launch
and compiled with ``triton.compile`` for a ``GPUTarget`` that need not be present; ptxas (shipped in
the Triton wheel) produces the cubin, and ``cuobjdump --dump-resource-usage`` reads registers per
thread and the local/stack bytes (spills). Shared memory is Triton's per-block allocation
(``metadata.shared``), which its launcher opts in above 48 KiB.

Grid: LSTM and GRU; forward and backward; H in {64, 128, 256, 512}; fp32 params (matmul
precision ``ieee``, ``tf32``, ``tf32x3``) and bf16 params; reset flags none / ``is_init`` /
``is_init`` + ``reset_state``, with saved gates, and the forward without them (``recompute="full"``).

Writes ``benchmarks/results/triton_aot_resources.json``: rows ``{"cell", "kernel", "variant", "H",
"dtype", "precision", "has_init", "has_reset", "save", "arch", "registers", "spills", "stack_bytes",
"shared_bytes", "num_warps", "occupancy_h100"}``. Runs in a child process without
``TRITON_INTERPRET`` when the caller has it set (the interpreter replaces ``triton.jit``).

``--sass-report OUT``: what each kernel's time loop does, counted from its SASS (``nvdisasm`` of the cubin), for
the kernel the launcher picks on an H100/H200 (132 SMs, sm_90) or an A100 (108 SMs, sm_80) at N=``--batch`` (512)
rows, T=64: LSTM and GRU, forward and backward, H in {64, 128, 256, 512}, fp32 at the default precision (TF32)
and at IEEE, bf16; every reset flag on, gates saved. One row per configuration: ``tensor_core_ops_in_loop``
(HGMMA + HMMA), ``ffma_in_loop``, ``fma_dots_in_loop`` (TTGIR dots lowered to FMA), ``weight_loads_in_loop``
(TTGIR loads whose pointer derives from ``W_hh``), ``global_loads_in_loop``, ``barriers_per_step`` (CTA
barriers, static count in the loop body), ``local_memory_ops_in_loop``, ``registers``, ``spill_bytes``,
``shared_bytes``, ``grid``, ``co_resident`` (the grid fits the SMs at the occupancy its resources allow),
``release_acquire_in_ptx``, ``default_precision`` and ``source_hash`` (what the rows depend on, checked by
``tests/backends/test_triton_sass.py`` against the committed report).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "triton_aot_resources.json"
SASS_REPORT = ROOT / "benchmarks" / "results" / "triton_sass_report.json"  # --sass-report's rows, read by the tests
HIDDEN = (64, 128, 256, 512)
ARCHS = (90, 80)
BATCH, T = 256, 64  # representative problem: strides and sizes as a training batch would have them
# (has_init, has_reset, save): every reset combination with saved gates (recompute="none", and the
# replay of recompute="full"), plus the forward of recompute="full" (no saved gates) with all resets
FWD_FLAGS = ((False, False, True), (True, False, True), (True, True, True), (True, True, False))
BWD_FLAGS = ((False, False, True), (True, False, True), (True, True, True))
# per-block shared memory with opt-in (bytes): sm_90 227 KiB, sm_80 163 KiB
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
# H100 SM: 64K 32-bit registers, 228 KiB shared (1 KiB of it reserved per block), 64 warps, 32 blocks;
# registers are allocated per warp in units of 256
H100 = dict(regs=65536, shared=228 * 1024, reserved_per_block=1024, warps=64, blocks=32, reg_unit=256)


def configs(subset: str, hidden, archs) -> list[dict]:
    """Every launch configuration to compile (``subset="ci"``: the CI test's representative part)."""
    out = []
    for cell, kernel, H, dtype, arch in itertools.product(("lstm", "gru"), ("fwd", "bwd"), hidden,
                                                          ("float32", "bfloat16"), archs):
        precisions = ("ieee", "tf32", "tf32x3") if dtype == "float32" else ("ieee",)
        flags = FWD_FLAGS if kernel == "fwd" else BWD_FLAGS
        if subset == "ci":  # the default fp32 precision (TF32, as cuDNN), all resets, gates saved
            precisions, flags = precisions[1:2] if dtype == "float32" else precisions, flags[2:3]
        for precision, (has_init, has_reset, save) in itertools.product(precisions, flags):
            out.append(dict(cell=cell, kernel=kernel, H=H, dtype=dtype, precision=precision, has_init=has_init,
                            has_reset=has_reset, save=save, arch=arch))
    return out


def launch(cfg: dict):
    """The kernel, arguments and constexprs the backend's launcher picks for ``cfg`` (meta tensors)."""
    import torch

    from rnn_functional.backends.triton import ops

    lstm, H, N = cfg["cell"] == "lstm", cfg["H"], cfg.get("N", BATCH)
    G = 4 if lstm else 3
    dtype = getattr(torch, cfg["dtype"])
    meta = dict(device="meta", dtype=dtype)
    w = torch.empty(1, G * H, H, **meta)
    b = torch.empty(1, G * H, **meta)
    is_init = torch.empty(1, N, T, device="meta", dtype=torch.bool) if cfg["has_init"] else None
    reset = [torch.empty(1, N, T, H, **meta) if cfg["has_reset"] else None for _ in range(2)]
    if not lstm:
        reset[1] = None
    if cfg["kernel"] == "fwd":
        gx = torch.empty(1, N, T, G * H, **meta)
        h0, c0 = torch.empty(1, N, H, **meta), torch.empty(1, N, H, **meta) if lstm else None
        hs, cs, gates = ops._fwd_outputs(gx, H, lstm, cfg["save"])
        return ops.fwd_launch(gx, w, b, h0, c0, is_init, *reset, hs, cs, gates, lstm, cfg["save"], cfg["dtype"],
                              cfg["precision"], sms=SMS[cfg["arch"]])
    acc = torch.float32
    hs = torch.empty(1, N, T + 1, H, device="meta", dtype=acc)
    cs = torch.empty(1, N, T + 1, H, device="meta", dtype=acc) if lstm else hs
    gates = torch.empty(1, N, T, 4 * H, device="meta", dtype=acc)
    outs = ops._bwd_outputs(gates, hs, lstm, cfg["has_reset"])
    return ops.bwd_launch(gates, hs, cs, w, is_init, *reset, hs.clone(), cs.clone(), outs, lstm, cfg["dtype"],
                          cfg["precision"], sms=SMS[cfg["arch"]])


def _resource_usage(cubin: bytes) -> dict:
    """``REG``, ``STACK``, ``LOCAL``, ``SHARED`` (static) of the single function in ``cubin``."""
    tool = Path(_ptxas_path()).with_name("cuobjdump")  # shipped next to ptxas
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], check=True, capture_output=True,
                              text=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", text))
    return {k: int(v) for k, v in fields.items()}


def _ptxas_path() -> str:
    from triton import knobs

    return knobs.nvidia.ptxas.path


def occupancy_h100(registers: int, shared: int, num_warps: int) -> dict:
    """Resident blocks and warps per H100 SM implied by registers, shared memory and warps per block."""
    regs_per_warp = -(-registers * 32 // H100["reg_unit"]) * H100["reg_unit"]
    by_regs = H100["regs"] // (regs_per_warp * num_warps)
    by_shared = H100["shared"] // (shared + H100["reserved_per_block"]) if shared else H100["blocks"]
    by_warps = H100["warps"] // num_warps
    blocks = min(by_regs, by_shared, by_warps, H100["blocks"])
    limiter = min((by_regs, "registers"), (by_shared, "shared"), (by_warps, "warps"))[1]
    return dict(blocks_per_sm=blocks, warps_per_sm=blocks * num_warps,
                occupancy=round(blocks * num_warps / H100["warps"], 4), limited_by=limiter)


def build(cfg: dict):
    """The launcher's kernel for ``cfg`` compiled by the wheel's ptxas for ``cfg["arch"]``, and its launch grid."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kernel, grid, args, constexprs = launch(cfg)
    if not isinstance(kernel, JITFunction):
        raise RuntimeError("the kernels were built by the Triton interpreter: run without TRITON_INTERPRET=1")
    target = GPUTarget("cuda", cfg["arch"], 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constexprs)
    options, signature, consts, attrs = kernel._pack_args(backend, dict(constexprs), bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, consts, attrs), target=target, options=options.__dict__)
    return kernel, tuple(grid), constexprs, compiled


def compile_one(cfg: dict) -> dict:
    """AOT-compile one configuration and return its resource row (with ``cfg["sass"]``: its SASS report row)."""
    kernel, grid, constexprs, compiled = build(cfg)
    usage = _resource_usage(compiled.asm["cubin"])
    shared = compiled.metadata.shared
    stack = usage.get("STACK", 0) + usage.get("LOCAL", 0)
    row = dict(cfg, variant=_variant_name(kernel.__name__),
               registers=usage["REG"], spills=stack // 4, stack_bytes=stack, shared_bytes=shared,
               num_warps=compiled.metadata.num_warps, shared_limit=SHARED_LIMIT[cfg["arch"]],
               block=constexprs.get("BLOCK_H", constexprs.get("BLOCK_T", constexprs.get("HS"))))
    row["occupancy_h100"] = occupancy_h100(row["registers"], shared, row["num_warps"])
    if cfg.get("sass"):
        row = sass_row(row, grid, compiled)
    return row


def _variant_name(kernel_name: str) -> str:
    return "streamed" if "tiled" in kernel_name else "persistent" if "persistent" in kernel_name else "resident"


# ----------------------------------------------------------------------------- SASS report
#
# The time loop is found twice: in the SASS (the backward branch spanning the most instructions: inner
# loops, the spin of a flag barrier, lie inside it) to count instructions, and in Triton's last IR
# (TTGIR: the outermost scf.for holding a dot) to attribute loads to the weight pointer, which the
# SASS's registers no longer name.

SASS_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^(\.L_x_\d+):")
SMS = {90: 132, 80: 108}  # SMs of an H100/H200 and of an A100: the co-residency bound of a grid
SM_LIMITS = {90: H100, 80: dict(H100, shared=164 * 1024)}  # A100: 164 KiB shared per SM, else as H100


def sass_of(cubin: bytes) -> str:
    tool = Path(_ptxas_path()).with_name("nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-c", f.name], check=True, capture_output=True, text=True).stdout


def time_loop(sass: str) -> list[str]:
    """The opcodes of the SASS's outermost loop: from the target of the widest backward branch to the branch."""
    labels, code = {}, []
    for line in sass.splitlines():
        if (m := LABEL.match(line.strip())):
            labels[m.group(1)] = len(code)
        elif (m := SASS_LINE.search(line)):
            code.append((m.group(2), m.group(3)))
    best = (0, 0)
    for i, (op, rest) in enumerate(code):
        target = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if target and labels.get(target.group(1), i + 1) <= i and i - labels[target.group(1)] > best[1] - best[0]:
            best = (labels[target.group(1)], i)
    return [op for op, _ in code[best[0]: best[1] + 1]]


def _ir_loop(ir: str) -> list[str]:
    """The lines of the outermost ``scf.for`` of ``ir`` (TTGIR) that contains a dot."""
    lines, out, depth, start = ir.splitlines(), [], 0, None
    for i, line in enumerate(lines):
        if start is None and "scf.for" in line:
            start, depth = i, 0
        if start is not None:
            depth += line.count("{") - line.count("}")
            if depth <= 0 and i > start:
                body = lines[start: i + 1]
                if any("dot" in ln for ln in body):
                    return body
                start = None
    return out


def weight_loads_in_loop(ir: str, weight_arg: str = "%w_ptr") -> int:
    """Loads inside the time loop whose pointer derives from the recurrent weight argument (TTGIR def-use; a
    printed name may be defined again in another region, so a use resolves to the nearest definition above it)."""
    lines = ir.splitlines()
    defs: dict = {}
    for i, line in enumerate(lines):
        if (m := re.match(r"\s*(%[\w.]+)(?::\d+)?\s*=\s*(.*)", line)):
            defs.setdefault(m.group(1), []).append((i, re.findall(r"%[\w.]+", m.group(2).split(" : ")[0])))

    def from_weights(name: str, at: int, seen: set) -> bool:
        if name == weight_arg:
            return True
        found = [(i, ops) for i, ops in defs.get(name, ()) if i <= at]
        if not found or (name, found[-1][0]) in seen:
            return False
        i, operands = found[-1]
        seen.add((name, i))
        return any(from_weights(d, i, seen) for d in operands)

    loop = _ir_loop(ir)
    start = lines.index(loop[0]) if loop else 0
    loads = 0
    for k, line in enumerate(loop):
        m = re.search(r"=\s*(tt\.load|ttg\.async_copy_global_to_local|tt\.descriptor_load)\s+(%[\w.]+)", line)
        loads += bool(m) and from_weights(m.group(2), start + k, set())
    return loads


def fma_dots_in_loop(ir: str) -> int:
    """``tt.dot`` ops of the time loop that Triton lowers to FMA (a blocked result layout, not an mma layout)."""
    return sum(1 for ln in _ir_loop(ir) if re.search(r"= tt\.dot .*-> tensor<[^>]*#blocked", ln))


def occupancy(arch: int, registers: int, shared: int, num_warps: int) -> int:
    """Blocks of this kernel one SM of ``arch`` holds at once (registers, shared memory, warps)."""
    sm = SM_LIMITS[arch]
    regs_per_warp = -(-registers * 32 // sm["reg_unit"]) * sm["reg_unit"]
    by_shared = sm["shared"] // (shared + sm["reserved_per_block"]) if shared else sm["blocks"]
    return min(sm["regs"] // (regs_per_warp * num_warps), by_shared, sm["warps"] // num_warps, sm["blocks"])


def sass_row(row: dict, grid: tuple, compiled) -> dict:
    """The issue-55 report row of a compiled kernel: what its time loop does, counted from its SASS."""
    from rnn_functional.precision import resolve_matmul_precision  # noqa: F401 - the rule the default follows

    ops = time_loop(sass_of(compiled.asm["cubin"]))
    ir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    count = lambda *prefixes: sum(op.startswith(prefixes) for op in ops)  # noqa: E731
    programs = 1
    for g in grid:
        programs *= g
    blocks = occupancy(row["arch"], row["registers"], row["shared_bytes"], row["num_warps"])
    return dict(
        cell=row["cell"], kernel=row["kernel"], variant=row["variant"], arch=f"sm_{row['arch']}", H=row["H"],
        N=row["N"], dtype=row["dtype"], precision=row["precision"],
        default_precision=row["dtype"] != "float32" or row["precision"] == DEFAULT_FP32[row["arch"]],
        tensor_core_ops_in_loop=count("HGMMA", "HMMA"), hgmma_in_loop=count("HGMMA"), hmma_in_loop=count("HMMA"),
        ffma_in_loop=count("FFMA"),
        fma_dots_in_loop=fma_dots_in_loop(ir), global_loads_in_loop=count("LDG", "LDGSTS", "UTMALDG"),
        weight_loads_in_loop=weight_loads_in_loop(ir), barriers_per_step=count("BAR."),
        local_memory_ops_in_loop=count("LDL", "STL"), registers=row["registers"], spill_bytes=row["stack_bytes"],
        shared_bytes=row["shared_bytes"], shared_limit=row["shared_limit"], num_warps=row["num_warps"],
        grid=list(grid), programs=programs, blocks_per_sm=blocks, co_resident=programs <= blocks * SMS[row["arch"]],
        release_acquire_in_ptx=bool(re.search(r"\.release\.", ptx)) and bool(re.search(r"\.acquire\.", ptx)),
        loop_instructions=len(ops), source_hash=source_hash(),
    )


def source_hash() -> str:
    """What the SASS report depends on: the kernels, their launcher, this script and the Triton version."""
    import hashlib

    import triton

    digest = hashlib.sha256(triton.__version__.encode())
    for name in ("kernels.py", "ops.py", "variant.py"):
        digest.update((ROOT / "rnn_functional" / "backends" / "triton" / name).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


# what an fp32 call gets without asking on each arch: cuDNN's rule, TF32 (rnn_functional.precision)
DEFAULT_FP32 = {90: "tf32", 80: "tf32"}


def sass_configs(hidden, archs, n: int) -> list[dict]:
    """The SASS report's configurations: both cells and directions, fp32 at the default (TF32) and IEEE precision,
    bf16, every reset flag on with saved gates (the training call)."""
    out = []
    for cell, kernel, H, (dtype, precision), arch in itertools.product(
            ("lstm", "gru"), ("fwd", "bwd"), hidden, (("float32", "tf32"), ("float32", "ieee"), ("bfloat16", "ieee")),
            archs):
        out.append(dict(cell=cell, kernel=kernel, H=H, dtype=dtype, precision=precision, has_init=True,
                        has_reset=True, save=True, arch=arch, N=n, sass=True))
    return out


def _worker(config_file: str) -> None:
    """Compile the configurations listed in ``config_file``, one JSON row per line on stdout."""
    for cfg in json.loads(Path(config_file).read_text()):
        print(json.dumps(compile_one(cfg)), flush=True)


def _run_shard(cfgs: list[dict]) -> list[dict]:
    """Compile ``cfgs`` in child processes. A compiler crash (an LLVM assertion aborts the process)
    becomes a row with ``"error"`` and a fresh child goes on with the next configuration."""
    rows: list[dict] = []
    while len(rows) < len(cfgs):
        todo = cfgs[len(rows):]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(todo, f)
        try:
            done = subprocess.run([sys.executable, __file__, "--worker", f.name], capture_output=True, text=True)
        finally:
            os.unlink(f.name)
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 and len(rows) < len(cfgs):
            failed = cfgs[len(rows)]
            message = [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]
            rows.append(dict(failed, error=" | ".join(message)[-600:]))
            print(f"triton_aot: compiling {failed} failed: {rows[-1]['error']}", file=sys.stderr)
    return rows


def run(cfgs: list[dict], jobs: int) -> list[dict]:
    """Rows for ``cfgs``, in order, compiled by ``jobs`` child processes side by side."""
    from concurrent.futures import ThreadPoolExecutor

    shards = [cfgs[i::jobs] for i in range(jobs)]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(_run_shard, shards))
    rows = [None] * len(cfgs)
    for i, shard in enumerate(results):
        rows[i::jobs] = shard
    return rows


def markdown_table(rows: list[dict]) -> str:
    """One line per (cell, kernel, H, dtype): the worst case over reset flags and precisions, both archs."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["cell"], r["kernel"], r["H"], r["dtype"]), []).append(r)
    lines = ["| cell | kernel | H | operands | variant | warps | sm_90 regs / spill B / shared KiB "
             "| sm_80 regs / spill B / shared KiB | H100 blocks/SM (occupancy, limit) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (cell, kernel, H, dtype), group in groups.items():
        cols = []
        for arch in (90, 80):
            arch_rows = [r for r in group if r["arch"] == arch]
            if any("error" in r for r in arch_rows) or not arch_rows:
                cols.append("compile error" if arch_rows else "-")
                continue
            cols.append(f"{max(r['registers'] for r in arch_rows)} / {max(r['stack_bytes'] for r in arch_rows)} / "
                        f"{max(r['shared_bytes'] for r in arch_rows) / 1024:.0f}")
        ok = [r for r in group if r["arch"] == 90 and "error" not in r]
        worst = min(ok, key=lambda r: r["occupancy_h100"]["occupancy"]) if ok else None
        occ = (f"{worst['occupancy_h100']['blocks_per_sm']} ({worst['occupancy_h100']['occupancy']:.1%}, "
               f"{worst['occupancy_h100']['limited_by']})") if worst else "-"
        variant = ok[0]["variant"] if ok else "-"
        warps = "/".join(sorted({str(r["num_warps"]) for r in ok}, key=int)) if ok else "-"
        lines.append(f"| {cell} | {kernel} | {H} | {dtype} | {variant} | {warps} | {cols[0]} | {cols[1]} | {occ} |")
    return "\n".join(lines)


def sass_table(rows: list[dict]) -> str:
    """The SASS report as a markdown table (one line per row)."""
    cols = ("cell", "kernel", "variant", "arch", "H", "dtype", "precision", "default_precision",
            "tensor_core_ops_in_loop", "ffma_in_loop", "fma_dots_in_loop", "weight_loads_in_loop",
            "global_loads_in_loop", "barriers_per_step", "registers", "spill_bytes", "shared_bytes", "grid",
            "co_resident", "release_acquire_in_ptx")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r.get("error", "")[:60] if c == "variant" and "error" in r else r.get(c, "-") for c in cols]
        lines.append("| " + " | ".join("x".join(map(str, v)) if isinstance(v, list) else str(v) for v in cells) + " |")
    return "\n".join(lines)


def ptxas_available() -> str | None:
    """``None`` when Triton's bundled ptxas runs here, else the reason it does not."""
    try:
        path = _ptxas_path()
        subprocess.run([path, "--version"], check=True, capture_output=True)
        subprocess.run([str(Path(path).with_name("cuobjdump")), "--version"], check=True, capture_output=True)
    except Exception as exc:  # missing, not executable, wrong platform
        return f"no usable ptxas/cuobjdump in the installed triton for this platform ({type(exc).__name__}: {exc})"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS))
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    parser.add_argument("--subset", choices=("all", "ci"), default="all")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS), help="output JSON path, '-' for stdout")
    parser.add_argument("--markdown", metavar="JSON", help="print the docs table of a results file and exit")
    parser.add_argument("--sass-report", metavar="OUT", help="write the SASS report of the time loops (issue 55) "
                        "as JSON rows to OUT ('-' for stdout) and exit")
    parser.add_argument("--batch", type=int, default=512, help="batch rows N of the SASS report's grids")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: compile the configs in this file
    args = parser.parse_args()

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):  # re-run without the interpreter
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (silences its warning)
    sys.path.insert(0, str(ROOT))
    if args.worker:
        _worker(args.worker)
        return
    if args.markdown:
        print(markdown_table(json.loads(Path(args.markdown).read_text())))
        return
    reason = ptxas_available()
    if reason:
        sys.exit(f"triton_aot: {reason}")
    if args.sass_report:
        rows = run(sass_configs(args.hidden, args.arch, args.batch), args.jobs)
        text = json.dumps(rows, indent=1)
        print(text) if args.sass_report == "-" else Path(args.sass_report).write_text(text + "\n")
        print(sass_table(rows), file=sys.stderr)
        sys.exit(1 if any("error" in r for r in rows) else 0)
    rows = run(configs(args.subset, args.hidden, args.arch), args.jobs)
    text = json.dumps(rows, indent=1)
    if args.out == "-":
        print(text)
        return
    Path(args.out).write_text(text + "\n")
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    for r in rows:
        what = f"{r['cell']} {r['kernel']} H={r['H']} {r['dtype']}/{r['precision']} init={r['has_init']} " \
               f"reset={r['has_reset']} save={r['save']} sm_{r['arch']}"
        if "error" in r:
            print(f"{what}: FAILED {r['error']}", file=sys.stderr)
            continue
        print(f"{what} {r['variant']}: regs={r['registers']} spills={r['spills']} shared={r['shared_bytes']} "
              f"warps={r['num_warps']} occupancy={r['occupancy_h100']['occupancy']}", file=sys.stderr)

if __name__ == "__main__":
    main()
