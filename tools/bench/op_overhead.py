"""Python twin of tools/bench/op-overhead.ts: microseconds per call of a tiny mx.add.

Usage:
  python op_overhead.py            # standalone: min/median/max per variant
  python op_overhead.py --serve    # driven by op-overhead.ts: reads "VARIANT N" lines,
                                   # answers one line with the microseconds per call

Variants: "graph" builds the lazy add of two 1-element arrays and drops it;
"shape" also reads the new array's shape; "eval" also evaluates it.
"""
import statistics
import sys
import time

import mlx.core as mx

a = mx.array([1.0])
b = mx.array([2.0])
mx.eval(a, b)


def graph(n: int) -> float:
    add = mx.add
    t = time.perf_counter_ns()
    for _ in range(n):
        c = add(a, b)
        del c
    return (time.perf_counter_ns() - t) / n / 1e3


def shaped(n: int) -> float:
    add = mx.add
    d = 0
    t = time.perf_counter_ns()
    for _ in range(n):
        c = add(a, b)
        d += c.shape[0]
        del c
    assert d == n
    return (time.perf_counter_ns() - t) / n / 1e3


def evaluated(n: int) -> float:
    add, ev = mx.add, mx.eval
    t = time.perf_counter_ns()
    for _ in range(n):
        c = add(a, b)
        ev(c)
        del c
    return (time.perf_counter_ns() - t) / n / 1e3


VARIANTS = {"graph": graph, "shape": shaped, "eval": evaluated}


def main() -> None:
    if "--serve" in sys.argv:
        print("ready", flush=True)
        for line in sys.stdin:
            name, n = line.split()
            print(f"{VARIANTS[name](int(n)):.4f}", flush=True)
        return
    for name, fn in VARIANTS.items():
        n = 5000 if name == "eval" else 20000
        fn(n)
        xs = [fn(n) for _ in range(15)]
        print(f"{name}: min {min(xs):.3f} median {statistics.median(xs):.3f} max {max(xs):.3f} us/call")


if __name__ == "__main__":
    main()
