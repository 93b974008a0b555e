"""What the TorchScript executor's optimized graph keeps for backward, against the
unoptimized run of the same traced file, on the CPU.

From its second call on, the profiling graph executor runs a training forward as
autodiff subgraphs (prim::DifferentiableGraph). Inside them `aten::dropout` becomes
`native_dropout`, which makes a new output and a bool mask kept for backward even at
p=0 (eagerly a no-op), and under autocast the JIT's autocast pass adds casts whose
outputs are kept too. This measures the bytes still held after the forward (what is
saved for backward, and the output) at each step, with glibc's mallinfo2:

    python3 scripts/jit-executor-memory.py FILE.train.pt [--batch 2] [--bf16] [--noopt]
    python3 scripts/jit-executor-memory.py --dropout P     # a traced Linear-GELU-Dropout(P)-Linear

FILE: a training file of scripts/gpu_truth.py's cache (tv_swin_t.train.pt, ...).
--noopt: torch._C._set_graph_executor_optimize(False), what tch's
tch::jit::set_graph_executor_optimize(false) sets. --no-jit-autocast:
torch._C._jit_set_autocast_mode(False), no JIT autocast pass (with --bf16: ConvNeXt-T's
training then fails in backward on the CPU, a float/bf16 mismatch in its autodiff graph). Run with the Python of the torch wheel
scripts/with-libtorch.sh installs.
"""

import argparse
import collections
import ctypes
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

libc = ctypes.CDLL("libc.so.6")


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                .split()]


libc.mallinfo2.restype = MallInfo2


def in_use():
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def loss_of(out):
    if out.dim() == 3:
        out = out.reshape(-1, out.size(-1))
    logp = out.log_softmax(-1, dtype=torch.float32)
    return torch.nn.functional.nll_loss(logp, torch.zeros(out.size(0), dtype=torch.long))


def subgraphs(g):
    counts = collections.Counter()

    def walk(block):
        for n in block.nodes():
            counts[n.kind()] += 1
            for b in n.blocks():
                walk(b)
            if n.hasAttribute("Subgraph"):
                walk(n.g("Subgraph"))
    walk(g)
    return counts["prim::DifferentiableGraph"], counts["aten::native_dropout"]


def dropout_model(p):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(1024, 1024)
            self.l2 = torch.nn.Linear(1024, 1024)
            self.d = torch.nn.Dropout(p)

        def forward(self, x):
            return self.l2(self.d(torch.nn.functional.gelu(self.l1(x))))
    return torch.jit.trace(M().train(), torch.randn(8, 1024), check_trace=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?")
    ap.add_argument("--dropout", type=float)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--noopt", action="store_true")
    ap.add_argument("--no-jit-autocast", action="store_true",
                    help="torch._C._jit_set_autocast_mode(False): no JIT autocast pass")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    if a.noopt:
        torch._C._set_graph_executor_optimize(False)
    if a.no_jit_autocast:
        torch._C._jit_set_autocast_mode(False)
    if a.dropout is not None:
        m = dropout_model(a.dropout)
        new_input = lambda: torch.randn(4096, 1024)  # noqa: E731
        loss_fn = lambda out: out.sum()  # noqa: E731
    else:
        m = torch.jit.load(a.file)
        new_input = lambda: torch.randn(a.batch, 3, 224, 224)  # noqa: E731
        loss_fn = loss_of
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01, foreach=False)
    for step in range(a.steps):
        x = new_input()
        base = in_use()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            out = m(x)
            graph = torch.jit.last_executed_optimized_graph()
            loss = loss_fn(out)
        held = in_use() - base
        dg, nd = subgraphs(graph)
        print(f"step {step}: held after the forward {held / 2**20:.2f} MiB "
              f"({dg} autodiff subgraphs, {nd} native_dropout)", flush=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del loss, x, out


if __name__ == "__main__":
    main()
