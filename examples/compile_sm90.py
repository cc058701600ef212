"""Compile every example kernel, and every planted bug's, for sm_90 on this machine (no GPU
needed): a compile error shows here before a GPU run. Prints a table: kernel, variant,
seconds, result; exits 1 on any error.

    python examples/compile_sm90.py        # from the checkout's root, TRITON_INTERPRET unset
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("unset TRITON_INTERPRET: the interpreter's triton.jit cannot be compiled")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 64)
POINTER = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "fp8": "*fp8e4nv"}


def compile_kernel(kernel, pointers: dict[str, str], constexprs: dict, num_warps: int = 4) -> float:
    """Compile ``kernel`` with ``pointers`` (argument -> element type), every other runtime
    argument an i32, and ``constexprs``; the seconds it took."""
    signature = {}
    for p in kernel.params:
        name = p.name
        signature[name] = "constexpr" if name in constexprs else POINTER.get(pointers.get(name), "i32")
    start = time.perf_counter()
    triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=TARGET,
                   options={"num_warps": num_warps})
    return time.perf_counter() - start


def jobs(package: str, k):
    """(label, kernel, pointers, constexprs, num_warps) for every kernel of ``k``, the kernel
    module of the example ``package`` or one of its planted bugs."""
    out = []
    if package == "matmul":
        for dt in ("fp32", "fp16", "bf16"):
            for out_dt in (dt, "fp32"):  # the output itself, or split-K's fp32 workspace
                out.append((f"_matmul_kernel {dt} -> {out_dt}", k._matmul_kernel, {"A": dt, "B": dt, "C": out_dt},
                            dict(BLOCK_M=k.BLOCK_M, BLOCK_N=k.BLOCK_N, BLOCK_K=k.BLOCK_K, GROUP_M=k.GROUP_M,
                                 UPCAST=False), 4))
            out.append((f"_sum_splits_kernel -> {dt}", k._sum_splits_kernel, {"WS": "fp32", "C": dt},
                        dict(BLOCK_M=k.BLOCK_M, BLOCK_N=k.BLOCK_N), 4))
    elif package == "bias_gelu":
        for dt in ("fp32", "fp16", "bf16"):
            for tanh in (False, True):
                out.append((f"_bias_gelu_kernel {dt} tanh={tanh}", k._bias_gelu_kernel,
                            {"X": dt, "BIAS": dt, "Y": dt},
                            dict(TANH=tanh, BLOCK=k.BLOCK, SQRT1_2=k.SQRT1_2, SQRT_2_OVER_PI=k.SQRT_2_OVER_PI), 4))
    elif package == "fp8_quant":
        for dt in ("fp32", "fp16", "bf16"):
            out.append((f"_quantize_kernel {dt}", k._quantize_kernel, {"X": dt, "Q": "fp8", "S": "fp32"},
                        dict(BLOCK_M=k.QUANT_ROWS, QBLOCK=k.QBLOCK, E4M3_MAX=k.E4M3_MAX,
                             SCALE_FLOOR=k.SCALE_FLOOR), 8))
        out.append(("_dequantize_kernel", k._dequantize_kernel, {"Q": "fp8", "S": "fp32", "X": "fp32"},
                    dict(BLOCK_M=k.DEQUANT_ROWS, QBLOCK=k.QBLOCK), 4))
    return out


def main() -> int:
    import importlib

    from tritoncheck.mutation import Mutant
    failed = 0
    print(f"{'module':44} {'kernel':36} {'s':>6}  result")
    for package in ("matmul", "bias_gelu", "fp8_quant"):
        planted = importlib.import_module(f"{package}.mutants")
        modules = [importlib.import_module(f"{package}.kernels")]
        modules += [sys.modules[m.fn.__module__] for m in vars(planted).values() if isinstance(m, Mutant)]
        for module in modules:
            label = module.__name__.replace("_mutant_", "")[:44]
            todo = jobs(package, module)
            if module is not modules[0]:  # a planted bug: one variant of each of its kernels
                todo = list({id(job[1]): job for job in reversed(todo)}.values())
            for what, kernel, pointers, constexprs, warps in todo:
                try:
                    seconds = compile_kernel(kernel, pointers, constexprs, warps)
                    print(f"{label:44} {what:36} {seconds:6.1f}  ok", flush=True)
                except Exception as exc:  # noqa: BLE001 - every error is reported, the exit status says so
                    failed += 1
                    print(f"{label:44} {what:36} {'':>6}  ERROR {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
                    traceback.print_exc(limit=3)
    print(f"{failed} error(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
