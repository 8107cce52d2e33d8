"""``make test-numerics``: the numerics tests once per CPU kernel path this machine can reach.

A CPU computes with the widest instructions it has: PyTorch's own kernels pick their ISA at start-up
(``torch.backends.cpu.get_cpu_capability()``), oneDNN its own (bf16 matmuls where the CPU has AVX-512-BF16 or
AMX). A user's machine may have less than this one, so each pass caps both below this machine's own ISA, lowest
first: ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``) and ``ONEDNN_MAX_CPU_ISA`` (``SSE41``, ``AVX2``,
``AVX512_CORE``, ``AVX512_CORE_VNNI``, ``AVX512_CORE_BF16``, ``AVX512_CORE_AMX``), each oneDNN level with the
ATen level of its vector width. Passes then run the dtype-generic tests in bf16 (``SLEA_TEST_DTYPE=bfloat16``,
:func:`slea.testing.numerics.numerics_dtype`) on the emulated bf16 path (AVX2) and on this machine's own. Every
pass reports the ISAs its process reached (what torch and oneDNN say, not what was asked)::

    python -m slea.testing.isa_matrix tests/alignment/test_objectives.py ...   # = make test-numerics
    python -m slea.testing.isa_matrix --list                                    # the passes, without running

A cap above what the CPU has is ignored by both libraries, so passes above this machine's level are not run: an
AMX machine runs one pass more than an AVX-512-BF16 one, an AVX2 machine two fewer.

On a 2-core AMD EPYC with AVX-512-BF16 and no AMX every pass reached what it asked (torch DEFAULT,
AVX2, AVX512; oneDNN SSE4.1, AVX2, AVX-512, AVX-512 with DL Boost, AVX-512 with bf16): 7 passes, all passed, 236 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# oneDNN's ISA caps, lowest first: the CPU flags (as /proc/cpuinfo names them) each needs, and the ATen
# capability of the same vector width
LEVELS = (
    ("SSE41", ("sse4_1",), "default"),
    ("AVX2", ("avx2", "fma"), "avx2"),
    ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx512"),
    ("AVX512_CORE_VNNI", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"), "avx512"),
    ("AVX512_CORE_BF16", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"), "avx512"),
    ("AVX512_CORE_AMX", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile",
                         "amx_bf16"), "avx512"),
)
BF16_AT = ("AVX2",)  # bf16 passes below this machine's own level: the emulated bf16 GEMM an AVX2 CPU runs

PROBE = """
import torch
torch.relu(torch.randn(2, 8, 16, 16).to_mkldnn())  # a oneDNN primitive, whatever the cap: oneDNN names its ISA
print("ATEN", torch.backends.cpu.get_cpu_capability())
print("BF16NATIVE", bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
"""


@dataclass
class Pass:
    name: str
    aten: str
    onednn: str
    dtype: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "ATEN_CPU_CAPABILITY": self.aten, "ONEDNN_MAX_CPU_ISA": self.onednn,
                "SLEA_TEST_DTYPE": self.dtype}


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def reachable(flags: set[str]) -> list[tuple[str, str]]:
    """The (oneDNN level, ATen level) pairs this CPU can run, lowest first."""
    return [(level, aten) for level, need, aten in LEVELS if set(need) <= flags]


def passes(flags: set[str]) -> list[Pass]:
    levels = reachable(flags)
    out = [Pass(level, aten, level, "float32") for level, aten in levels]
    if levels:
        for level, aten in levels:
            if level in BF16_AT and level != levels[-1][0]:
                out.append(Pass(f"{level} bf16", aten, level, "bfloat16"))
        own, aten = levels[-1]
        out.append(Pass(f"{own} bf16", aten, own, "bfloat16"))
    return out


def reached(p: Pass) -> dict[str, str]:
    """What torch and oneDNN chose in a process started with ``p``'s caps."""
    env = {**p.env(), "ONEDNN_VERBOSE": "1"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False,
                       timeout=300)
    out = {"aten": "?", "onednn": "?", "bf16_native": "?"}
    for line in r.stdout.splitlines():
        if line.startswith("ATEN "):
            out["aten"] = line.split(" ", 1)[1]
        elif line.startswith("BF16NATIVE "):
            out["bf16_native"] = line.split(" ", 1)[1]
        elif ",info,cpu,isa:" in line:
            out["onednn"] = line.split("isa:", 1)[1].strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the passes and the ISAs each reaches; run no tests")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per pass (0: one process)")
    ap.add_argument("tests", nargs="*", help="test files or node ids")
    args = ap.parse_args(argv)
    flags = cpu_flags()
    plan = passes(flags)
    if not plan:
        print("isa_matrix: no x86 ISA level recognised on this CPU; nothing to run")
        return 0
    print(f"this CPU's own level: {plan[0].name if len(plan) == 1 else reachable(flags)[-1][0]}; "
          f"{len(plan)} passes")
    rows, failed, t_all = [], 0, time.perf_counter()
    for p in plan:
        got = reached(p)
        rc, secs = 0, 0.0
        if not args.list:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests]
            if args.workers:
                cmd[4:4] = ["-n", str(args.workers), "--dist", "loadfile"]
            t0 = time.perf_counter()
            print(f"\n== {p.name}: ATEN_CPU_CAPABILITY={p.aten} ONEDNN_MAX_CPU_ISA={p.onednn} "
                  f"SLEA_TEST_DTYPE={p.dtype}", flush=True)
            rc = subprocess.run(cmd, env=p.env(), check=False).returncode
            secs = time.perf_counter() - t0
            failed += rc != 0
        rows.append((p, got, rc, secs))
    print("\n| pass | asked (ATen / oneDNN) | reached: torch | reached: oneDNN | bf16 native | dtype | result | s |")
    print("|---|---|---|---|---|---|---|---:|")
    for p, got, rc, secs in rows:
        result = "listed" if args.list else ("passed" if rc == 0 else f"FAILED ({rc})")
        print(f"| {p.name} | {p.aten} / {p.onednn} | {got['aten']} | {got['onednn']} | {got['bf16_native']} | "
              f"{p.dtype} | {result} | {secs:.0f} |")
    print(f"total {time.perf_counter() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
