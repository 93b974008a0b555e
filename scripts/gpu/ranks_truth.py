"""Several GPUs' ranks measured on one GPU: PyTorch's FSDP2 (`fully_shard`) and DDP with
the fake process group, and a loop that copies its batches on a side stream. The truth
for the replay of multi-stream histories and for the sharded estimate.

    python3 ranks_truth.py cases [--quick]            # one case a line
    python3 ranks_truth.py measure CASE --out DIR     # one case, in this process: a CSV row,
                                                      # and DIR/CASE.pickle (its snapshot)
    python3 ranks_truth.py measure CASE --device cpu  # a smoke test: no memory figures

A case is `KIND.MODEL.wN.rK.PRECISION.RESHARD` (FSDP2), `ddp.MODEL.wN.r0.f32.view|copy`,
`single.MODEL` (the same step on one GPU, no wrapper) or `sidestream.MODEL`.

Why one GPU can measure a rank of N: the fake process group
(`torch.testing._internal.distributed.fake_pg`, backend "fake") runs no collective and
allocates nothing (its all-gather and reduce-scatter return at once), while FSDP2 and DDP
make every buffer of their own through the caching allocator, on their own streams, as on
N GPUs. So rank K's allocations, their streams and its peaks are those of a real rank K;
NCCL's own memory (outside the caching allocator) is not, and the collectives' timing is
not (on N GPUs a slow all-gather can hold a buffer longer; FSDP2 waits on events, so the
order of its allocations is the same).

The protocol, each case in a process of its own (a fresh CUDA context and allocator):
1. `torch.manual_seed(0)`; the model built on the CPU (scripts/gpu_truth.py's
   constructors: GPT-2, SmolLM2-135M, ViT-B/16 of transformers; torchvision's ResNet-18),
   wrapped so that forward(x) returns its first output; the allocator's history recorded
   from here (`_record_memory_history(stacks="python")`; frames only for the cases marked
   with frames in `cases`).
2. FSDP2: `init_device_mesh("cuda", (N,))` over the fake group at rank K; `fully_shard` on
   each block of the model's repeated module list, then on the root, with
   `reshard_after_forward` as the case says and, for bf16,
   `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`. DDP:
   `module.to(device)`, then `DistributedDataParallel(device_ids=[0], bucket_cap_mb=25,
   gradient_as_bucket_view=view)` with a comm hook that divides each bucket by N in place
   and returns it (the built-in hook's division, in the bucket; the fake group's
   all-reduce completes with no value, which DDP's reducer refuses). Single: `module.to(device)`.
3. `torch.cuda.synchronize()`, `torch.cuda.empty_cache()` (setup's transient full
   parameters leave no cached segment: as a rank that built its model on the meta device
   would start), `reset_peak_memory_stats()`; `weights_allocated` = `memory_allocated()`.
4. `torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)` (its default implementation:
   foreach for FSDP2's DTensors and for CUDA tensors), then 2 steps of: new input;
   forward and the loss of scripts/gpu/truth.py; `zero_grad(set_to_none=True)`;
   `backward()`; `step()`. The side-stream loop (ResNet-18, SGD with momentum) takes each
   batch from pinned host memory, copied on a stream of its own
   (`non_blocking=True`), the default stream waiting on it and the batch handed over with
   `record_stream`, as data prefetchers do; 4 steps.
5. `measured_allocated` = `max_memory_allocated()`, `measured_reserved` =
   `max_memory_reserved()` after a synchronize; `streams`: the number of streams the
   history's allocations were made on; `tracker_peak`: for FSDP2 cases, PyTorch's own
   `FSDPMemTracker` peak of 2 more steps under it (its "Total" at the peak, bytes), beside
   the measurement (empty where it fails; the reason on stderr).

Inputs: token ids `randint(0, 1000, (4, 1024))` (GPT-2, SmolLM2), pixels
`randn(32, 3, 224, 224)` (ViT-B/16, ResNet-18), as scripts/gpu_truth.py measures them.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# gpu_truth.py, truth.py and corpus.py: beside this file in the bundle, in the tree
# gpu_truth.py and corpus.py are one folder up.
sys.path[:0] = [HERE, os.path.dirname(HERE)]

COLUMNS = ("case,kind,model,world,rank,precision,reshard,input,weights_allocated,"
           "measured_allocated,measured_reserved,streams,tracker_peak,seconds")
# Where each model's repeated blocks are (FSDP2's units, as people wrap them).
BLOCKS = {
    "hf_gpt2": "m.transformer.h",
    "hf_smollm2_135m": "m.model.layers",
    "hf_vit_base": "m.vit.encoder.layer",
}


def cases(quick=False):
    """Every case, most telling first: a run cut short by its timeout keeps those."""
    out = []
    # (name, frames): frames for the pair whose difference the rank comparison shows.
    for model in ("hf_gpt2", "hf_vit_base", "hf_smollm2_135m"):
        out.append((f"single.{model}", False))
    for world in (2, 4, 8):
        for rank in sorted({0, world - 1}):
            out.append((f"fsdp2.hf_gpt2.w{world}.r{rank}.f32.reshard", world == 8))
    for world in (2, 8):
        for rank in (0, world - 1):
            out.append((f"fsdp2.hf_gpt2.w{world}.r{rank}.bf16.reshard", False))
    for rank in (0, 3):
        out.append((f"fsdp2.hf_gpt2.w4.r{rank}.f32.keep", False))
    for world in (2, 4, 8):
        for rank in (0, world - 1):
            out.append((f"fsdp2.hf_vit_base.w{world}.r{rank}.f32.reshard", False))
    for rank in (0, 3):
        out.append((f"fsdp2.hf_vit_base.w4.r{rank}.bf16.reshard", False))
    for world in (2, 8):
        for rank in (0, world - 1):
            out.append((f"fsdp2.hf_smollm2_135m.w{world}.r{rank}.f32.reshard", False))
    out.append(("ddp.hf_gpt2.w2.r0.f32.view", False))
    out.append(("ddp.hf_gpt2.w2.r0.f32.copy", False))
    out.append(("ddp.hf_vit_base.w4.r0.f32.copy", False))
    out.append(("sidestream.tv_resnet18", False))
    if quick:
        keep = {"single.hf_gpt2", "fsdp2.hf_gpt2.w8.r0.f32.reshard",
                "fsdp2.hf_gpt2.w8.r7.f32.reshard", "ddp.hf_gpt2.w2.r0.f32.copy",
                "sidestream.tv_resnet18"}
        out = [c for c in out if c[0] in keep]
    return out


def parse(case):
    parts = case.split(".")
    kind, model = parts[0], parts[1]
    if kind in ("single", "sidestream") and len(parts) == 2:
        return kind, model, 1, 0, "f32", "-"
    if kind in ("fsdp2", "ddp") and len(parts) == 6:
        world, rank = int(parts[2][1:]), int(parts[3][1:])
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} of a world of {world}")
        return kind, model, world, rank, parts[4], parts[5]
    raise ValueError(f"not a case: {case!r} (see `ranks_truth.py cases`)")


def attr(obj, path):
    for p in path.split("."):
        obj = getattr(obj, p)
    return obj


def init_fake_group(world, rank):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


def streams_of(snapshot):
    seen = set()
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e.get("action") == "alloc":
                seen.add(e.get("stream"))
    return len(seen)


def measure(case, device, out_dir, frames):
    import torch
    import gpu_truth
    import truth

    t0 = time.time()
    kind, model, world, rank, precision, reshard = parse(case)
    cuda = device.startswith("cuda")
    gpu_truth.hf_patch()
    build, ikind, shape = gpu_truth.ALL_MODELS[model]
    torch.manual_seed(0)
    wrapper = gpu_truth.First(build(), model.startswith("hf_"))
    if cuda:
        torch.cuda.set_device(0)
        # Frames of the Python code that asked for each block, for the cases that want
        # them (a larger file); the others keep sizes, streams and order alone.
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc" if frames else None, stacks="python",
            max_entries=2_000_000)
    if kind in ("fsdp2", "ddp"):
        init_fake_group(world, rank)
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.split(":")[0], (world,))
        shard(wrapper, model, mesh, reshard == "reshard", precision)
        module = wrapper
    elif kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapper.to(device)
        module = DDP(wrapper, device_ids=[0] if cuda else None, bucket_cap_mb=25,
                     gradient_as_bucket_view=reshard == "view")
        module.register_comm_hook(world, averaged_in_place)
    else:
        wrapper.to(device)
        module = wrapper
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        weights = torch.cuda.memory_allocated()
    else:
        weights = 0

    if not cuda:
        # The smoke test's inputs: one small sample (the CPU has no figure to give).
        shape = (1, 64) if ikind == "ids" else (1,) + tuple(shape[1:])

    def new_input():
        return torch.randint(0, 1000, shape) if ikind == "ids" else torch.randn(shape)

    module.train()
    if kind == "sidestream":
        run_side_stream(module, new_input, device, torch, truth)
    else:
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4, weight_decay=0.01)
        run_steps(module, opt, new_input, device, torch, truth, 2)
    if cuda:
        torch.cuda.synchronize()
        alloc, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        snapshot = torch.cuda.memory._snapshot()
        streams = streams_of(snapshot)
        if out_dir:
            torch.cuda.memory._dump_snapshot(os.path.join(out_dir, f"{case}.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    else:
        alloc = reserved = streams = 0
    tracker = ""
    if kind == "fsdp2":
        tracker = tracker_peak(module, opt, new_input, device, torch, truth)
    spec = gpu_truth.spec(ikind, shape)
    print(f"{case},{kind},{model},{world},{rank},{precision},{reshard},{spec},{weights},"
          f"{alloc},{reserved},{streams},{tracker},{time.time() - t0:.1f}", flush=True)


def shard(wrapper, model, mesh, reshard, precision):
    """FSDP2 as the cases wrap it: `fully_shard` on each block of the model's repeated
    module list, then on the root, `reshard_after_forward=reshard`, and for `precision`
    "bf16" `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if precision == "bf16" else MixedPrecisionPolicy())
    for block in attr(wrapper, BLOCKS[model]):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(wrapper, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)


def averaged_in_place(world, bucket):
    """DDP's default all-reduce as the fake group can run it: the bucket divided by the
    world size in place, as the reducer's built-in hook does before its all-reduce (which
    allocates nothing: it runs in the bucket). The fake group's own all-reduce completes
    with no value, which the reducer refuses."""
    import torch

    buf = bucket.buffer().div_(world)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def run_steps(module, opt, new_input, device, torch, truth, steps):
    for _ in range(steps):
        x = new_input().to(device)
        out = module(x)
        loss = truth.loss_of(out, torch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del loss, x, out


def run_side_stream(module, new_input, device, torch, truth):
    """The prefetcher's pattern: the next batch copied on a side stream while this one
    trains; the default stream waits for it and the batch is handed over with
    record_stream (its free deferred until the default stream's work on it is done)."""
    cuda = device.startswith("cuda")
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    side = torch.cuda.Stream() if cuda else None

    def fetch():
        host = new_input()
        if not cuda:
            return host
        host = host.pin_memory()
        with torch.cuda.stream(side):
            return host.to(device, non_blocking=True)

    nxt = fetch()
    for _ in range(4):
        if cuda:
            torch.cuda.current_stream().wait_stream(side)
            nxt.record_stream(torch.cuda.current_stream())
        x, nxt = nxt, fetch()
        out = module(x)
        loss = truth.loss_of(out, torch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del loss, x, out


def tracker_peak(module, opt, new_input, device, torch, truth):
    """PyTorch's FSDPMemTracker over 2 more steps: its peak "Total" on the device."""
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(module, opt)
        x = new_input().to(device)
        tracker.track_inputs((x,))
        with tracker:
            for i in range(2):
                run_steps(module, opt, new_input, device, torch, truth, 1)
                if i == 0:
                    # As torchtitan's estimation runs it: the first step's module
                    # statistics cleared (it tracks one iteration's).
                    tracker.reset_mod_stats()
        peak = tracker.get_tracker_snapshot("peak")
        dev = next((d for d in peak if str(d).startswith(device.split(":")[0])), None)
        return str(peak[dev]["Total"]) if dev is not None else ""
    except Exception as e:  # the measurement stands without it
        print(f"ranks_truth.py: FSDPMemTracker failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return ""


def main(argv):
    device = "cuda:0"
    if "--device" in argv:
        device = argv[argv.index("--device") + 1]
    if argv[:1] == ["cases"]:
        for name, frames in cases("--quick" in argv):
            print(name, "frames" if frames else "-")
        return 0
    if argv[:1] == ["columns"]:
        print(COLUMNS)
        return 0
    if argv[:1] == ["measure"] and len(argv) >= 2:
        out_dir = argv[argv.index("--out") + 1] if "--out" in argv else None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        try:
            parse(argv[1])
        except ValueError as e:
            print(f"ranks_truth.py: {e}", file=sys.stderr)
            return 2
        measure(argv[1], device, out_dir, "--frames" in argv)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
