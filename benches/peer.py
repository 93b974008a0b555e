"""Peer bench: the same CPU ResNet-18 training step (batch 8x3x64x64, Adam, 10 classes) for N
steps under plain tch, tch-memprof (default settings, and with the step timeline), plain
PyTorch, and PyTorch with torch.profiler(profile_memory=True, record_shapes=True), including
building its table. Each run is a child process; the order of the modes rotates every round.

    scripts/peer-bench.sh [--steps N] [--rounds N]

Reported per mode: the median step time and its ratio to the same runtime's plain run
(tch for tch-memprof, PyTorch for torch.profiler), the whole run (from process start to exit,
the profiler's table included) and its ratio, and the child's peak resident memory
(ru_maxrss from wait4).

The Rust children are the overhead bench's own (benches/overhead.rs, child mode); the Python
children are this file with --child. Run by scripts/peer-bench.sh with the pinned wheel's
Python, which has torch and nothing else: ResNet-18 is defined here as torchvision defines it.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

WARMUP = 5


def python_child(mode, steps):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, inp, out, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out)
            self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out)
            self.downsample = None
            if stride != 1 or inp != out:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out)
                )

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            short = x if self.downsample is None else self.downsample(x)
            return F.relu(y + short)

    class ResNet18(nn.Module):
        def __init__(self, classes):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            layers, inp = [], 64
            for out, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                layers.append(nn.Sequential(BasicBlock(inp, out, stride), BasicBlock(out, out, 1)))
                inp = out
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            x = self.layers(x)
            x = F.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.fc(x)

    net = ResNet18(10)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        x = torch.randn(8, 3, 64, 64)
        y = torch.randint(0, 10, (8,))
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def loop(after_step=None):
        for i in range(WARMUP + steps):
            t0 = time.perf_counter()
            step()
            if after_step:
                after_step()
            us = (time.perf_counter() - t0) * 1e6
            if i >= WARMUP:
                print(int(us), flush=True)

    if mode == "torch":
        loop()
    elif mode == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True
        ) as prof:
            loop()
        t0 = time.perf_counter()
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_memory_usage", row_limit=20
        )
        print(f"# table {time.perf_counter() - t0:.3f} s, {len(table)} characters", flush=True)
    else:
        sys.exit(f"peer.py: unknown child mode {mode!r}")


def run_child(cmd, env):
    """Runs a child; returns (step times in ms, whole-run seconds, peak RSS bytes, notes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    whole = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"peer.py: {' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    steps, notes = [], []
    for line in out.decode().splitlines():
        line = line.strip()
        if line.startswith("#"):
            notes.append(line[1:].strip())
        elif line.isdigit():
            steps.append(int(line) / 1000.0)
    return steps, whole, usage.ru_maxrss * 1024, notes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rust-bench", help="the overhead bench binary (benches/overhead.rs)")
    a = ap.parse_args()
    if a.child:
        python_child(a.child, a.steps)
        return
    if not a.rust_bench:
        sys.exit("peer.py: --rust-bench BINARY is needed (scripts/peer-bench.sh passes it)")

    base_env = dict(os.environ)
    modes = [
        ("tch", "tch", [a.rust_bench, "--steps", str(a.steps)],
         {"TCH_MEMPROF_BENCH_MODE": "baseline", "TCH_MEMPROF_DISABLE": "1"}),
        ("tch-memprof (default)", "tch", [a.rust_bench, "--steps", str(a.steps)],
         {"TCH_MEMPROF_BENCH_MODE": "profiled"}),
        ("tch-memprof + timeline", "tch", [a.rust_bench, "--steps", str(a.steps)],
         {"TCH_MEMPROF_BENCH_MODE": "timeline"}),
        ("torch", "torch", [sys.executable, __file__, "--child", "torch", "--steps", str(a.steps)], {}),
        ("torch.profiler", "torch",
         [sys.executable, __file__, "--child", "torch.profiler", "--steps", str(a.steps)], {}),
    ]
    results = {name: {"steps": [], "whole": [], "rss": [], "notes": []} for name, *_ in modes}
    for r in range(a.rounds):
        for k in range(len(modes)):
            name, _, cmd, env = modes[(k + r) % len(modes)]
            steps, whole, rss, notes = run_child(cmd, {**base_env, **env})
            res = results[name]
            res["steps"] += steps
            res["whole"].append(whole)
            res["rss"].append(rss)
            res["notes"] += notes
            print(f"round {r + 1} {name:<24} median step {statistics.median(steps):8.2f} ms, "
                  f"whole run {whole:6.2f} s, peak RSS {rss / 2**20:7.1f} MiB", file=sys.stderr)

    med = {n: statistics.median(v["steps"]) for n, v in results.items()}
    whole = {n: statistics.median(v["whole"]) for n, v in results.items()}
    rss = {n: max(v["rss"]) for n, v in results.items()}
    print(f"CPU ResNet-18 training step, batch 8x3x64x64, Adam: {a.steps} steps per run, "
          f"{a.rounds} rounds, {os.cpu_count()} cores")
    print()
    print("| run | median step | step ratio | whole run | whole-run ratio | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, base, *_ in modes:
        print(f"| {name} | {med[name]:.2f} ms | {med[name] / med[base]:.3f} | "
              f"{whole[name]:.2f} s | {whole[name] / whole[base]:.3f} | {rss[name] / 2**20:.0f} MiB |")
    notes = results["torch.profiler"]["notes"]
    if notes:
        print()
        print(f"torch.profiler's table (key_averages by input shape, top 20): {notes[-1]}")


if __name__ == "__main__":
    main()
