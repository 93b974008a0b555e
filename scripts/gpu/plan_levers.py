"""The levers of `tch-memprof plan` that only a GPU can check, measured on `cuda:0` beside
what `tch-memprof estimate` predicts for them: the caching allocator's settings
(`PYTORCH_CUDA_ALLOC_CONF`: they change reserved, never allocated) and activation
checkpointing of every segment and of every 2nd segment, on GPT-2 trained with AdamW in
f32 at 8x1024 (builtin_mirrors.py's mirror of the built-in model).

Checkpointing runs as `tch_memprof::Checkpointed` does (src/optim.rs), written out here
in PyTorch: the segments are GPT-2's chain (the embeddings, each block, the head: the
`Chain` of src/models/gpt2.rs); a checkpointed segment runs under `no_grad` and
keeps only its output, a kept one runs with its graph from a detached input; the last
segment and the loss run with a graph and `backward()`; then, last to first, each
checkpointed segment is run again with a graph and `sum(out * g).backward()` pushes the
boundary gradient `g` through it (a kept segment uses its stored graph). The generator's
state is saved before each checkpointed segment as `Checkpointed` saves it (a CPU tensor:
no GPU memory). The loop is the estimate's: `zero_grad(set_to_none=True)`, the
checkpointed forward and backward, the optimizer step, 2 steps.

Each case runs in a process of its own with `PYTORCH_CUDA_ALLOC_CONF` set (a fresh
caching allocator), as does its estimate:

    python3 plan_levers.py --estimate ./tch-memprof [--out FILE]

Prints CSV: model,input,alloc_conf,checkpoint,measured_allocated,measured_reserved,
predicted_allocated,predicted_reserved,reserved_error,note (reserved_error: predicted /
measured - 1).
"""
import argparse
import csv
import io
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import builtin_mirrors as T  # noqa: E402  (the mirror of the built-in models)

MODEL, INPUT = "gpt2", "8x1024"
CASES = [(conf, "off") for conf in ("", "expandable_segments:True", "max_split_size_mb:128",
                                    "roundup_power2_divisions:4")]
CASES += [("", "1"), ("", "2")]
HEADER = ["model", "input", "alloc_conf", "checkpoint", "measured_allocated",
          "measured_reserved", "predicted_allocated", "predicted_reserved",
          "reserved_error", "note"]


def segments(model, train):
    """GPT-2's chain, as gpt2.rs's `Chain` runs it."""
    def embed(idx):
        _, t = idx.shape
        pos = torch.arange(t, dtype=torch.int64, device=idx.device)
        s = model.wte(idx) + model.wpe(pos)
        return F.dropout(s, 0.1, train)

    def head(x):
        y = model.ln_f(x)
        logits = y.matmul(model.wte.weight.t())
        return logits.view(-1, logits.size(2))

    return [embed] + [lambda x, b=b: b(x) for b in model.h] + [head]


def get_rng(device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_rng(state, device):
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def check_cpu():
    """The mirror of `Checkpointed` against a plain step on the CPU (GPT-2's tiny config,
    dropout on): the same loss and every gradient within 1e-5 relative."""
    device = torch.device("cpu")
    torch.manual_seed(0)
    vs = T.Vars(device)
    model = T.TINY[MODEL](vs)
    model.train()
    x = T.make_input(MODEL, "2x16", T.vocab_of(model), device)

    def loss_fn(out):
        target = torch.zeros(out.shape[0], dtype=torch.int64, device=device)
        return torch.ops.aten.nll_loss(
            out.log_softmax(-1, dtype=torch.float32), target, None, 1, -100)

    def grads():
        g = [q.grad.clone() for q in vs.params]
        for q in vs.params:
            q.grad = None
        return g

    state = torch.get_rng_state()
    plain_loss = loss_fn(model(x))
    plain_loss.backward()
    plain = grads()
    for every in (1, 2):
        torch.set_rng_state(state)
        loss = checkpointed_step(segments(model, True), every, x, loss_fn, device)
        assert torch.equal(loss, plain_loss.detach()), (every, loss, plain_loss)
        for a, b in zip(plain, grads()):
            scale = a.abs().max().item() or 1.0
            assert (a - b).abs().max().item() <= 1e-5 * scale, every
        print(f"checkpoint every {every}: loss and {len(plain)} gradients equal the plain step's")


def checkpointed_step(segs, every, x, loss_fn, device):
    """`Checkpointed::forward_backward` with every `every`-th segment checkpointed."""
    n = len(segs)
    kept_flags = [i % every != 0 for i in range(n)]
    bounds, rng, kept = [x], [], []
    for i in range(n - 1):
        if kept_flags[i]:
            rng.append(None)
            inp = x if i == 0 else bounds[i].detach().requires_grad_(True)
            y = segs[i](inp)
            bounds.append(y.detach())
            kept.append((inp, y))
            continue
        rng.append(get_rng(device))
        with torch.no_grad():
            bounds.append(segs[i](bounds[i]))
        kept.append(None)
    last_in = x if n == 1 else bounds[n - 1].detach().requires_grad_(True)
    loss = loss_fn(segs[n - 1](last_in))
    loss.backward()
    rng_after = get_rng(device) if n > 1 else None
    g = last_in.grad
    del last_in
    del bounds[n - 1:]
    for i in range(n - 2, -1, -1):
        if g is None:
            break
        if kept[i] is not None:
            inp, out = kept[i]
            kept[i] = None
        else:
            set_rng(rng[i], device)
            inp = x if i == 0 else bounds[i].detach().requires_grad_(True)
            out = segs[i](inp)
        del bounds[i:]
        if out.requires_grad:
            (out * g).sum(dtype=g.dtype).backward()
        g = inp.grad if i > 0 else None
        del inp, out
    if rng_after is not None:
        set_rng(rng_after, device)
    return loss.detach()


def measure(conf, checkpoint, device):
    """Peak allocated and reserved of the case, in this process."""
    torch.manual_seed(0)
    vs = T.Vars(device)
    model = T.FULL[MODEL](vs)
    vocab = T.vocab_of(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model.train()
    opt = torch.optim.AdamW(vs.params, lr=1e-3, weight_decay=0.01, foreach=False)

    def loss_fn(out):
        target = torch.zeros(out.shape[0], dtype=torch.int64, device=device)
        return torch.ops.aten.nll_loss(
            out.log_softmax(-1, dtype=torch.float32), target, None, 1, -100)

    for _ in range(2):
        x = T.make_input(MODEL, INPUT, vocab, device)
        if checkpoint == "off":
            out = model(x)
            loss = loss_fn(out)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del loss, out, x
        else:
            opt.zero_grad(set_to_none=True)
            loss = checkpointed_step(segments(model, True), int(checkpoint), x, loss_fn,
                                     device)
            opt.step()
            del loss, x
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def estimate(binary, conf, checkpoint, gpu):
    args = [binary, "estimate", "--model", MODEL, "--input", INPUT + ":i64", "--train",
            "--optimizer", "adamw", "--csv"]
    args += [] if checkpoint == "off" else ["--checkpoint", checkpoint]
    args += ["--gpu", gpu] if gpu else []
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env)
    if r.returncode != 0:
        return "", "", "estimate failed: " + r.stderr.strip().splitlines()[-1]
    row = next(csv.DictReader(io.StringIO(r.stdout)))
    return int(row["peak_allocated_bytes"]), int(row["peak_reserved_bytes"]), ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--estimate", metavar="TCH_MEMPROF", help="the tch-memprof binary")
    p.add_argument("--gpu", help="--gpu of the estimate (default: the GPU's name)")
    p.add_argument("--case", help=argparse.SUPPRESS)  # alloc_conf|checkpoint
    p.add_argument("--out")
    p.add_argument("--check-cpu", action="store_true",
                   help="check the Checkpointed mirror against a plain step on the CPU")
    args = p.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    device = torch.device(args.device)
    if args.case:
        conf, checkpoint = args.case.split("|")
        print(*measure(conf, checkpoint, device))
        return
    out = open(args.out, "w") if args.out else None
    w = csv.writer(sys.stdout, lineterminator="\n")
    rows = [HEADER]
    failed = 0
    for conf, checkpoint in CASES:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--device",
                            args.device, "--case", f"{conf}|{checkpoint}"],
                           stdout=subprocess.PIPE, text=True, env=env)
        if r.returncode != 0 or not r.stdout.strip():
            rows.append([MODEL, INPUT, conf, checkpoint, "", "", "", "", "",
                         f"failed (exit {r.returncode})"])
            failed += 1
            continue
        ma, mr = (int(v) for v in r.stdout.split()[-2:])
        pa, pr, note = ("", "", "not estimated")
        if args.estimate:
            pa, pr, note = estimate(args.estimate, conf, checkpoint, args.gpu)
        err = f"{pr / mr - 1:+.4f}" if pr != "" else ""
        rows.append([MODEL, INPUT, conf, checkpoint, ma, mr, pa, pr, err, note or "ok"])
        failed += bool(note) and note != "not estimated"
    for row in rows:
        w.writerow(row)
        if out:
            csv.writer(out, lineterminator="\n").writerow(row)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
