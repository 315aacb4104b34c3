"""Compile every ``triton`` backend kernel ahead of time for Hopper (sm_90) and Ampere (sm_80), no GPU needed.

    python benchmarks/triton_aot.py [--arch 90 80] [--hidden 64 128 256 512] [--jobs 2] [--out PATH]
    python benchmarks/triton_aot.py --subset ci --out -      # the CI test's subset, rows as JSON on stdout

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
HIDDEN = (64, 128, 256, 512)
ARCHS = (90, 80)
N, T = 256, 64  # representative problem: strides and sizes as a training batch would have them
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
        if subset == "ci":  # the default fp32 precision, all resets, gates saved
            precisions, flags = precisions[:1], flags[2:3]
        for precision, (has_init, has_reset, save) in itertools.product(precisions, flags):
            out.append(dict(cell=cell, kernel=kernel, H=H, dtype=dtype, precision=precision, has_init=has_init,
                            has_reset=has_reset, save=save, arch=arch))
    return out


def launch(cfg: dict):
    """The kernel, arguments and constexprs the backend's launcher picks for ``cfg`` (meta tensors)."""
    import torch

    from rnn_functional.backends.triton import ops

    lstm, H = cfg["cell"] == "lstm", cfg["H"]
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
                              cfg["precision"])
    acc = torch.float32
    hs = torch.empty(1, N, T + 1, H, device="meta", dtype=acc)
    cs = torch.empty(1, N, T + 1, H, device="meta", dtype=acc) if lstm else hs
    gates = torch.empty(1, N, T, 4 * H, device="meta", dtype=acc)
    outs = ops._bwd_outputs(gates, hs, lstm, cfg["has_reset"])
    return ops.bwd_launch(gates, hs, cs, w, is_init, *reset, hs.clone(), cs.clone(), outs, lstm, cfg["dtype"],
                          cfg["precision"])


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


def compile_one(cfg: dict) -> dict:
    """AOT-compile one configuration and return its resource row."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kernel, _grid, args, constexprs = launch(cfg)
    if not isinstance(kernel, JITFunction):
        raise RuntimeError("the kernels were built by the Triton interpreter: run without TRITON_INTERPRET=1")
    target = GPUTarget("cuda", cfg["arch"], 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constexprs)
    options, signature, consts, attrs = kernel._pack_args(backend, dict(constexprs), bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, consts, attrs), target=target, options=options.__dict__)
    usage = _resource_usage(compiled.asm["cubin"])
    shared = compiled.metadata.shared
    stack = usage.get("STACK", 0) + usage.get("LOCAL", 0)
    row = dict(cfg, variant="streamed" if "tiled" in kernel.__name__ else "resident",
               registers=usage["REG"], spills=stack // 4, stack_bytes=stack, shared_bytes=shared,
               num_warps=compiled.metadata.num_warps, shared_limit=SHARED_LIMIT[cfg["arch"]],
               block=constexprs.get("BLOCK_H", constexprs.get("BLOCK_T")))
    row["occupancy_h100"] = occupancy_h100(row["registers"], shared, row["num_warps"])
    return row


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
