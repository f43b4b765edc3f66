#!/usr/bin/env python3
"""Issue 11's scaling model, from bench/probes/profile.sh's split of each step into GEMM, other (non-GEMM) work and
waits at 1 and 2 threads (bench/results/profile.jsonl). GEMM and other work are each given Amdahl's form
t(p) = t(1)·(σ + (1 − σ)/p), with the serial share σ fitted to that part's own 2-thread time:
σ = 2·t(2)/t(1) − 1 (clamped to [0, 1]); the waits measured at 2 threads (the calling thread in libgomp or the
kernel: barriers, wake-ups) are kept as a constant at every p > 1, which is pessimistic. Two points fit
one parameter per part, nothing more: the model ignores memory bandwidth (which caps elementwise kernels
long before 64 cores: on the 2-vCPU Zen 5 machine a streaming kernel on cold [2048,1024] tensors takes
0.63-0.93x its one-thread time at 2 threads, bench/probes/README.md), OpenBLAS's and ATen's grain
sizes and the shrinking per-thread GEMM blocks, so its 16- and 64-core figures are upper bounds on the
speedup for this step size.

  bench/probes/scaling_model.py bench/results/profile.jsonl
"""
import json
import sys


def serial_share(one, two):
    return min(1.0, max(0.0, 2.0 * two / one - 1.0)) if one > 0 else 0.0


def main():
    rows = {}
    for line in open(sys.argv[1]):
        r = json.loads(line)
        rows[(r["workload"], r["impl"], r["threads"])] = r["split"]
    print("| workload | implementation | 1 thread ms (GEMM + other + waits) | GEMM share | 2 threads ms (same split) "
          "| σ GEMM | σ other | speedup 2 (profile run) | 16 (model) | 64 (model) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (w, impl, t), one in sorted(rows.items()):
        if t != 1 or (w, impl, 2) not in rows:
            continue
        two = rows[(w, impl, 2)]
        g1, n1, w1 = one["gemm_ms"], one["other_ms"], one["wait_ms"]
        g2, n2, w2 = two["gemm_ms"], two["other_ms"], two["wait_ms"]
        sg, sn = serial_share(g1, g2), serial_share(n1, n2)

        def model(p):
            return g1 * (sg + (1 - sg) / p) + n1 * (sn + (1 - sn) / p) + w2

        t1, t2 = g1 + n1 + w1, g2 + n2 + w2
        print(f"| {w} | {impl} | {t1:.0f} ({g1:.0f} + {n1:.0f} + {w1:.0f}) | {g1 / t1:.1%} "
              f"| {t2:.0f} ({g2:.0f} + {n2:.0f} + {w2:.0f}) | {sg:.3f} | {sn:.3f} | {t1 / t2:.2f} "
              f"| {t1 / model(16):.1f} | {t1 / model(64):.1f} |")


if __name__ == "__main__":
    main()
