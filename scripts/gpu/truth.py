"""The GPU truth cases on a GPU machine: each real-world model of scripts/gpu_truth.py
measured in eager PyTorch on cuda:0 exactly as tests/data/gpu-truth/*/README.md says,
beside `tch-memprof estimate --gpu GPU` of the file traced the same way.

    python3 truth.py cases [--quick]              # model mode input, one case a line
    python3 truth.py cases --held-out             # the models the estimate was not built on
    python3 truth.py measure MODEL MODE           # one case, in this process: a CSV row
    python3 truth.py measure MODEL MODE --traced FILE  # the same, running the traced file
    python3 truth.py measure MODEL MODE --snapshot FILE  # and a memory snapshot of the run
    python3 truth.py table --measured CSV --estimates DIR [--reference CSV]

`measure` prints `model,mode,input,weights_allocated,measured_allocated,
measured_reserved`; run each case in a process of its own (a fresh CUDA context,
cuBLAS workspaces and caching allocator). `table` joins the measured rows with the
estimate CSVs written as DIR/MODEL.MODE.csv and prints the errors (predicted over
measured), and, with --reference, the measured peaks beside those of an earlier run.
`--device cpu` runs `measure` on the CPU (a smoke test: no memory figures).

`--traced FILE` runs the TorchScript file gpu_truth.py traced (torch.jit.load, moved
to the device) in place of the eager module, the rest alike: what a tch user loading
that file runs, and what `tch-memprof estimate FILE` predicts. Eager and traced differ
where tracing fixed a path eager picks at run time (transformers' grouped-query attention:
eager calls SDPA with enable_gqa, the trace repeats the key/value heads) or where the
interpreter frees values earlier than Python does.

`--snapshot FILE` records the allocator's history of the whole run, from before the
weights are moved to the device, and writes it as a PyTorch memory snapshot
(torch.cuda.memory._dump_snapshot: every allocation, free and segment, no stack frames)
once the peaks are read: what `tch-memprof replay FILE` takes, to set its peak beside
the one measured. Only on CUDA; elsewhere it is left out.
"""

import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# gpu_truth.py and corpus.py: beside this file in the bundle, one folder up in the tree.
sys.path[:0] = [HERE, os.path.dirname(HERE)]

MODES = ("infer", "train", "train-bf16", "train-foreach", "train-fused")
QUICK = [("hf_smollm2_135m", "train"), ("hf_gpt2", "train"), ("hf_vit_base", "infer"),
         ("tv_vgg16", "infer"), ("tv_resnet50", "train"), ("tv_regnet_y_400mf", "train")]


def cases(quick, held_out=False):
    import gpu_truth

    rows = []
    models = gpu_truth.HELD_OUT if held_out else gpu_truth.MODELS
    for model, (_, kind, shape) in models.items():
        for mode in ("infer", "train"):
            if quick and (model, mode) not in QUICK:
                continue
            rows.append((model, mode, gpu_truth.spec(kind, shape)))
    return rows


def loss_of(out, torch):
    if out.dim() == 3:
        out = out.reshape(-1, out.size(-1))
    if out.dim() == 2:
        logp = out.log_softmax(-1, dtype=torch.float32)
        return torch.nn.functional.nll_loss(
            logp, torch.zeros(out.size(0), dtype=torch.long, device=out.device))
    return out.mean()


def measure(model, mode, device, traced=None, snapshot=None):
    import torch
    import gpu_truth

    gpu_truth.hf_patch()
    build, kind, shape = gpu_truth.ALL_MODELS[model]
    torch.manual_seed(0)
    if traced:
        # Loaded onto the device, as tch's CModule::load_on_device does: every tensor of
        # the file moves, the constants tracing on the CPU baked in (an attention mask,
        # stochastic depth's scale) too, which .to(device) would leave on the CPU.
        wrapper = torch.jit.load(traced, map_location=device)
    else:
        wrapper = gpu_truth.First(build(), model.startswith("hf_"))

    def new_input():
        x = torch.randint(0, 1000, shape) if kind == "ids" else torch.randn(shape)
        return x.to(device)

    cuda = device.startswith("cuda")
    if snapshot and not cuda:
        print(f"truth.py: no snapshot on {device}: CUDA only", file=sys.stderr)
        snapshot = None
    if snapshot:
        # Before the weights move, so the history holds every segment of the run. It is
        # bookkeeping beside the allocator, not a change to what it allocates or caches:
        # the peaks measured are those of a run without it. No stack frames (context=None):
        # small files, and no Python unwinding on each allocation.
        torch.cuda.memory._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=2_000_000)
    wrapper.to(device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        weights = torch.cuda.memory_allocated()
    else:
        weights = 0
    if mode == "infer":
        wrapper.eval()
        with torch.no_grad():
            wrapper(new_input())
    else:
        wrapper.train()
        # train-foreach and train-fused: AdamW's other implementations.
        impl = ({"fused": True} if mode == "train-fused" else
                {"foreach": mode == "train-foreach"})
        opt = torch.optim.AdamW(wrapper.parameters(), lr=1e-4, weight_decay=0.01, **impl)
        for _ in range(2):
            x = new_input()
            # The output is held through backward and the optimizer step, as the
            # measurements of the reference were made (`out = model(x)`): an H100 run
            # that let it go measured the transformers' fp32 training peaks lower by
            # exactly one fp32 logits tensor.
            if mode == "train-bf16":
                with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                    out = wrapper(x)
                    loss = loss_of(out, torch)
            else:
                out = wrapper(x)
                loss = loss_of(out, torch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del loss, x, out
    if cuda:
        torch.cuda.synchronize()
        alloc, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    else:
        alloc = reserved = 0
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(f"{model},{mode},{gpu_truth.spec(kind, shape)},{weights},{alloc},{reserved}")


def table(measured, estimates, reference):
    ref = {}
    if reference:
        for r in csv.DictReader(open(reference)):
            ref[(r["model"], r["mode"])] = r
    print(f"{'model':<28}{'mode':<12}{'alloc err %':>12}{'resv err %':>12}"
          f"{'meas vs earlier %':>19}  attention")
    bad = 0
    for r in csv.DictReader(open(measured)):
        path = os.path.join(estimates, f"{r['model']}.{r['mode']}.csv")
        if not os.path.exists(path):
            print(f"{r['model']:<28}{r['mode']:<12} no estimate")
            bad += 1
            continue
        e = next(csv.DictReader(open(path)))
        ea = 100 * (int(e["peak_allocated_bytes"]) / int(r["measured_allocated"]) - 1)
        er = 100 * (int(e["peak_reserved_bytes"]) / int(r["measured_reserved"]) - 1)
        earlier = ref.get((r["model"], r["mode"]))
        drift = (f"{100 * (int(r['measured_allocated']) / int(earlier['measured_allocated']) - 1):+.2f}"
                 if earlier else "-")
        print(f"{r['model']:<28}{r['mode']:<12}{ea:>+12.2f}{er:>+12.2f}{drift:>19}  "
              f"{e.get('attention', '')}")
    return 1 if bad else 0


def main(argv):
    device = "cuda:0"
    if "--device" in argv:
        device = argv[argv.index("--device") + 1]
    if argv[:1] == ["cases"]:
        for c in cases("--quick" in argv, "--held-out" in argv):
            print(*c)
        return 0
    if argv[:1] == ["measure"] and len(argv) >= 3:
        if argv[2] not in MODES:
            print(f"truth.py: unknown mode {argv[2]!r}: {', '.join(MODES)}", file=sys.stderr)
            return 2
        opt = lambda k: argv[argv.index(k) + 1] if k in argv else None  # noqa: E731
        measure(argv[1], argv[2], device, opt("--traced"), opt("--snapshot"))
        return 0
    if argv[:1] == ["table"]:
        opt = lambda k: argv[argv.index(k) + 1] if k in argv else None  # noqa: E731
        return table(opt("--measured"), opt("--estimates"), opt("--reference"))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
