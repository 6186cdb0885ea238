"""Code sandbox throughput: candidates per second through bubblewrap against the in-process sandbox.

    python -m benchmarks.sandbox [--rounds 5]

Runs the same 50 stdin/stdout programs (10 contest-style families x 5 input sizes,
each checked against an answer computed here) through ``rlvr_core.rewards.sandbox``
in both modes, one after the other within each round (the order alternates between
rounds), on one core-sequential loop as the verifier runs them. Per mode and round:
candidates per second over the 50; per candidate: wall seconds. Writes the medians
side by side, with the machine's load, to benchmarks/results/sandbox/sandbox.json (``--out DIR``: the
results root, DIR/sandbox/sandbox.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from math import gcd
from pathlib import Path

from benchmarks.common import RESULTS, output_dir

# family -> (program, make_input(size, rng) -> str, answer(input) -> str)
SUM = "import sys\nd = sys.stdin.read().split()\nprint(sum(map(int, d[1:])))\n"
SORT = "import sys\nd = sys.stdin.read().split()\nprint(' '.join(map(str, sorted(map(int, d[1:])))))\n"
FIB = "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, (a + b) % 1000000007\nprint(a)\n"
SIEVE = (
    "n = int(input())\ns = bytearray([1]) * (n + 1)\ns[0:2] = b'\\x00\\x00'\n"
    "for i in range(2, int(n ** 0.5) + 1):\n    if s[i]:\n"
    "        s[i * i::i] = bytearray(len(s[i * i::i]))\nprint(sum(s))\n"
)
PALIN = "t = input().strip()\nprint('YES' if t == t[::-1] else 'NO', len(set(t)))\n"
BFS = (
    "from collections import deque\nimport sys\nr = sys.stdin.read().split()\n"
    "h, w = int(r[0]), int(r[1])\ng = r[2:2 + h]\n"
    "dist = [[-1] * w for _ in range(h)]\ndist[0][0] = 0\nq = deque([(0, 0)])\n"
    "while q:\n    y, x = q.popleft()\n    for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n"
    "        ny, nx = y + dy, x + dx\n"
    "        if 0 <= ny < h and 0 <= nx < w and g[ny][nx] == '.' and dist[ny][nx] < 0:\n"
    "            dist[ny][nx] = dist[y][x] + 1\n            q.append((ny, nx))\nprint(dist[h - 1][w - 1])\n"
)
KNAP = (
    "import sys\nr = list(map(int, sys.stdin.read().split()))\nn, cap = r[0], r[1]\nbest = [0] * (cap + 1)\n"
    "for i in range(n):\n    wt, val = r[2 + 2 * i], r[3 + 2 * i]\n    for c in range(cap, wt - 1, -1):\n"
    "        best[c] = max(best[c], best[c - wt] + val)\nprint(best[cap])\n"
)
GCD = (
    "import sys, math\nr = list(map(int, sys.stdin.read().split()))\n"
    "print(' '.join(str(math.gcd(r[1 + 2 * i], r[2 + 2 * i])) for i in range(r[0])))\n"
)
WORDS = (
    "import sys\nfrom collections import Counter\nc = Counter(sys.stdin.read().split())\n"
    "print(*[f'{w}:{k}' for w, k in sorted(c.items(), key=lambda t: (-t[1], t[0]))[:3]])\n"
)
MATMUL = (
    "import sys\nr = list(map(int, sys.stdin.read().split()))\nn = r[0]\n"
    "a = [r[1 + i * n:1 + (i + 1) * n] for i in range(n)]\n"
    "b = [[sum(a[i][k] * a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]\nprint(sum(map(sum, b)))\n"
)


def _grid(size: int, rng: random.Random) -> str:
    h = w = 5 + 3 * size
    rows = [["." if rng.random() > 0.2 else "#" for _ in range(w)] for _ in range(h)]
    for y in range(h):  # keep the border column and the last row open so a path exists
        rows[y][0] = "."
    rows[h - 1] = ["."] * w
    return f"{h} {w}\n" + "\n".join("".join(r) for r in rows) + "\n"


def _bfs_answer(text: str) -> str:
    r = text.split()
    h, w = int(r[0]), int(r[1])
    g = r[2:2 + h]
    dist = {(0, 0): 0}
    frontier = [(0, 0)]
    while frontier:
        nxt = []
        for y, x in frontier:
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                p = (y + dy, x + dx)
                if 0 <= p[0] < h and 0 <= p[1] < w and g[p[0]][p[1]] == "." and p not in dist:
                    dist[p] = dist[(y, x)] + 1
                    nxt.append(p)
        frontier = nxt
    return str(dist.get((h - 1, w - 1), -1))


def _knap_answer(text: str) -> str:
    r = list(map(int, text.split()))
    n, cap = r[0], r[1]
    items = [(r[2 + 2 * i], r[3 + 2 * i]) for i in range(n)]
    best = {0: 0}
    for wt, val in items:
        for used, v in list(best.items()):
            if used + wt <= cap and best.get(used + wt, -1) < v + val:
                best[used + wt] = v + val
    return str(max(best.values()))


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % 1000000007
    return a


def _primes(n: int) -> int:
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n + 1))


def _words_answer(text: str) -> str:
    counts: dict[str, int] = {}
    for w in text.split():
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.items(), key=lambda t: (-t[1], t[0]))[:3]
    return " ".join(f"{w}:{k}" for w, k in top)


def _matmul_answer(text: str) -> str:
    r = list(map(int, text.split()))
    n = r[0]
    a = [r[1 + i * n:1 + (i + 1) * n] for i in range(n)]
    return str(sum(a[i][k] * a[k][j] for i in range(n) for j in range(n) for k in range(n)))


FAMILIES = {
    "sum": (SUM, lambda s, g: f"{50 * s}\n" + " ".join(str(g.randint(-999, 999)) for _ in range(50 * s)) + "\n",
            lambda t: str(sum(map(int, t.split()[1:])))),
    "sort": (SORT, lambda s, g: f"{40 * s}\n" + " ".join(str(g.randint(0, 10**6)) for _ in range(40 * s)) + "\n",
             lambda t: " ".join(map(str, sorted(map(int, t.split()[1:]))))),
    "fib": (FIB, lambda s, g: f"{1000 * s}\n", lambda t: str(_fib(int(t)))),
    "sieve": (SIEVE, lambda s, g: f"{2000 * s}\n", lambda t: str(_primes(int(t)))),
    "palindrome": (PALIN, lambda s, g: (lambda h: h + h[::-1] if s % 2 else h + "x")(
        "".join(g.choice("abc") for _ in range(20 * s))) + "\n",
        lambda t: f"{'YES' if t.strip() == t.strip()[::-1] else 'NO'} {len(set(t.strip()))}"),
    "bfs": (BFS, _grid, _bfs_answer),
    "knapsack": (KNAP, lambda s, g: f"{4 * s} {30 * s}\n" + "\n".join(
        f"{g.randint(1, 20)} {g.randint(1, 100)}" for _ in range(4 * s)) + "\n", _knap_answer),
    "gcd": (GCD, lambda s, g: f"{20 * s}\n" + "\n".join(
        f"{g.randint(1, 10**9)} {g.randint(1, 10**9)}" for _ in range(20 * s)) + "\n",
        lambda t: " ".join(str(gcd(int(a), int(b))) for a, b in zip(t.split()[1::2], t.split()[2::2]))),
    "words": (WORDS, lambda s, g: " ".join(
        g.choice(["alpha", "beta", "gamma", "delta", "eps"]) for _ in range(60 * s)) + "\n",
              _words_answer),
    "matmul": (MATMUL, lambda s, g: f"{3 + s}\n" + " ".join(str(g.randint(-9, 9)) for _ in range((3 + s) ** 2)) + "\n",
               _matmul_answer),
}  # fmt: skip


def programs() -> list[tuple[str, str, str, str]]:
    """The 50 (name, program, stdin, expected stdout) cases, deterministic."""
    rng = random.Random(13)
    cases = []
    for family, (code, make, answer) in FAMILIES.items():
        for size in range(1, 6):
            text = make(size, rng)
            cases.append((f"{family}_{size}", code, text, answer(text)))
    return cases


def _round(cases, limits) -> tuple[float, list[float], int]:
    from rlvr_core.rewards.sandbox import OK, run_python

    walls, passed = [], 0
    t0 = time.perf_counter()
    for _, code, text, expected in cases:
        t = time.perf_counter()
        result = run_python(code, text, limits)
        walls.append(time.perf_counter() - t)
        passed += result.status == OK and result.stdout.strip() == expected
    return time.perf_counter() - t0, walls, passed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS, help="results root (default benchmarks/results)")
    a = ap.parse_args()
    from rlvr_core.rewards.sandbox import SandboxLimits, SandboxWarning, check_sandbox

    warnings.simplefilter("ignore", SandboxWarning)  # the in-process mode is measured on purpose
    modes = {"bwrap": SandboxLimits(), "inprocess": SandboxLimits(isolation="inprocess")}
    layers = {name: list(check_sandbox(limits)) for name, limits in modes.items()}
    cases = programs()
    for _name, limits in modes.items():  # warm-up (bwrap's self-test, the in-process probe, page cache)
        _round(cases[:5], limits)
    load_before = os.getloadavg()
    per_mode: dict[str, dict[str, list]] = {m: {"rate": [], "walls": [], "passed": []} for m in modes}
    for r in range(a.rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for name in order:
            seconds, walls, passed = _round(cases, modes[name])
            per_mode[name]["rate"].append(len(cases) / seconds)
            per_mode[name]["walls"] += walls
            per_mode[name]["passed"].append(passed)
            print(f"round {r + 1} {name:9s}: {len(cases) / seconds:6.2f} candidates/s, {passed}/{len(cases)} passed",
                  flush=True)
    load_after = os.getloadavg()
    bwrap_version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    out = {
        "programs": len(cases),
        "rounds": a.rounds,
        "families": sorted(FAMILIES),
        "candidates_per_s_median": {m: statistics.median(v["rate"]) for m, v in per_mode.items()},
        "candidates_per_s_rounds": {m: v["rate"] for m, v in per_mode.items()},
        "seconds_per_candidate_median": {m: statistics.median(v["walls"]) for m, v in per_mode.items()},
        "seconds_per_candidate_p90": {
            m: statistics.quantiles(v["walls"], n=10)[-1] for m, v in per_mode.items()
        },
        "passed_per_round": {m: v["passed"] for m, v in per_mode.items()},
        "bwrap_over_inprocess_time": statistics.median(per_mode["bwrap"]["walls"])
        / statistics.median(per_mode["inprocess"]["walls"]),
        "layers": layers,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "bwrap": bwrap_version,
            "euid": os.geteuid(),
        },
        "note": "sequential runs, one candidate at a time; medians over rounds (rate) and over all runs (latency)",
    }
    (output_dir(a.out, "sandbox") / "sandbox.json").write_text(json.dumps(out, indent=1) + "\n")
    headline = ("candidates_per_s_median", "seconds_per_candidate_median", "bwrap_over_inprocess_time")
    print(json.dumps({k: out[k] for k in headline}, indent=1))


if __name__ == "__main__":
    main()
