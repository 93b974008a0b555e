"""A PyTorch model's eager training step captured without a GPU: every block the step's
CUDA run would ask PyTorch's caching allocator for and every free, in the order eager
PyTorch makes them, written as the history CSV `tch-memprof replay` reads
(`seq,action,addr,size,stream,frame,phase,reduction`). The replay runs it through the
model of the caching allocator and adds each thread's cuBLAS workspace and the
reductions' buffers as the GPU takes them:

    python3 scripts/eager_capture.py --model hf_gpt2 --out gpt2.csv
    tch-memprof replay gpt2.csv --memory h200
    # rank 7 of FSDP2 over 8 GPUs (PyTorch's fully_shard over its fake process group)
    python3 scripts/eager_capture.py --model hf_gpt2 --fsdp 8 --rank 7 --out r7.csv  # [--keep] [--bf16]
    # a rank of DDP over 8 GPUs (PyTorch's DistributedDataParallel, its own buckets)
    python3 scripts/eager_capture.py --model hf_gpt2 --ddp 8 --out ddp.csv  # [--bucket-view]

or from Python, for a model of one's own (the loop of `--model`'s cases, or any):

    import eager_capture
    with eager_capture.Capture("step.csv") as cap:
        model = cap.build(lambda: MyModel())          # parameters on the faked GPU
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):                            # the second step is the steady one
            x = cap.tensor(torch.randint(0, 1000, (4, 1024)))
            loss = loss_fn(model(x)); opt.zero_grad(set_to_none=True)
            loss.backward(); opt.step(); del loss, x

How: the step runs under PyTorch's FakeTensorMode (tensors with shapes, dtypes and
storages but no data: no memory, no arithmetic) and a dispatch mode that sees every op's
outputs: a storage not seen before is an allocation of its bytes, and a weak reference to
it tells when eager Python lets it go, which is the free. Eager keeps a module's locals
until its forward returns and takes the branches it takes: what a traced or exported file
does not show.

Fake tensors live on the CPU here (PyTorch 2.11's autograd engine does not run a fake
CUDA graph without a GPU), so the CPU's kernel choices would be taken where CUDA's differ
in memory; the two that do in the models measured are taken as CUDA takes them:
- dropout: CUDA's fused kernel keeps a bool mask (`native_dropout`); the CPU's a mask of
  the input's dtype;
- scaled dot-product attention: PyTorch's CUDA choice on compute capability 8.0 and later
  (`sdp_utils.cpp`): flash attention for f16 and bf16 without a mask and head sizes up to
  256, else memory-efficient attention, else (grouped-query attention, which the
  memory-efficient kernel does not take) the math path, which keeps the attention matrix.
  The CPU would take its own flash kernel or the math path.
- the safe softmax of the math attention path: CUDA runs its composite, whose -inf masks
  (a bool per element, one per row) and zero scalar live until it returns.
- optimizers: the foreach path CUDA takes when not told (the CPU and a fake tensor take
  the per-parameter loop, whose temporaries are one parameter's at a time).
- layer norm: CUDA keeps the mean and inverse deviation it saves for backward in float32
  for a 16-bit input; the CPU in the input's dtype.
- cuBLAS: an op that CUDA runs on cuBLAS (`is_cublas_op` in the project's
  `src/native/dryrun/trace.cpp`) writes a `workspace` row (`workspace_lt` where CUDA would
  run it on cuBLASLt: `uses_cublaslt` there), `phase` `backward` inside the autograd
  engine; the replay takes each thread's workspace once, at the GPU's size.
- FSDP2: its unsharded parameters freed and made again by resizing their storage (a free
  and an allocation on a GPU), and its buffers on the streams it asks for them on
  (torch.cpu's streams stand for CUDA's); a DTensor's memory is its local tensor's; the
  model sharded as a CPU-built one onto the GPU (each unit's parameters copied whole,
  sharded, the whole copies freed).
- sum and mean: a `reduce` row (the input's sizes, strides, offset and dtype, the
  output's dtype, the dims, keepdim in its `reduction` column); the replay sizes the
  staging buffer and semaphores CUDA's kernel takes when it splits the reduction across
  thread blocks, for the GPU's multiprocessors (the dry run's rule).
- DDP: its reducer's buckets as it makes them; the rebuild of the second step runs on
  real tensors (it reads a tensor's values), so its buckets take real host memory, which
  is virtual until written (nothing writes them here).
What the capture cannot see: other workspaces a CUDA kernel takes from the allocator
inside itself (the attention kernels' backward, cuDNN's convolutions), NCCL's buffers,
and any other op whose CUDA kernel allocates what its CPU one does not.

Run with the Python of the torch wheel `scripts/with-libtorch.sh` installs; `--model`
takes the corpus's models (scripts/gpu_truth.py; transformers from scripts/corpus-env.sh).
"""

import os
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

# src/native/dryrun/trace.cpp's is_cublas_op: the ops CUDA runs on cuBLAS (a test holds
# the two lists equal).
CUBLAS_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::vdot",
    "aten::_addmm_activation",
)
DEVICE = "cpu"
HALF = (torch.float16, torch.bfloat16)
# The reductions whose CUDA kernel (Reduce.cuh's gpu_reduce_kernel) takes a staging
# buffer from the caching allocator: sum and mean, as the dry run sizes them.
REDUCTIONS = ("aten::sum", "aten::mean")


def uses_cublaslt(name, args, kwargs):
    """trace.cpp's uses_cublaslt: an addmm CUDA runs on cuBLASLt (a 1-D contiguous bias
    of length N, beta 1, every matrix size above 1)."""
    if name not in ("aten::addmm", "aten::_addmm_activation") or len(args) < 3:
        return False
    bias, m1, m2 = args[:3]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if not all(isinstance(t, torch.Tensor) for t in (bias, m1, m2)) or beta != 1:
        return False
    return (bias.dim() == 1 and bias.is_contiguous() and m1.dim() == 2 and m2.dim() == 2
            and bias.size(0) == m2.size(1) and min(m1.shape) > 1 and min(m2.shape) > 1)


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """F.scaled_dot_product_attention as PyTorch's CUDA build chooses its kernel on
    compute capability 8.0 and later."""
    gqa = enable_gqa and k.size(-3) != q.size(-3)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    half = q.dtype in (torch.float16, torch.bfloat16)
    if half and attn_mask is None and q.size(-1) <= 256 and q.size(-1) % 8 == 0:
        # Flash attention takes grouped-query attention as it is (fewer key and value
        # heads).
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if not gqa:
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, grad, dropout_p, is_causal, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=True)[0]


_dropout = torch.nn.functional.dropout


def dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA runs it: the fused kernel, a bool mask."""
    if training and 0 < p < 1 and input.numel() > 0 and not inplace:
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return _dropout(input, p, training, inplace)


class _Recorder(TorchDispatchMode):
    def __init__(self, out):
        super().__init__()
        self.out = out
        self.live = {}
        self.watched = set()
        self.next_addr = 1 << 40
        self.seq = 0
        self.closed = False
        self.paused = False
        # The stream blocks are asked on: 0 the default, then each stream FSDP2 makes
        # (torch.cpu's streams stand for CUDA's here), numbered as first entered.
        self.stream = 0
        self.streams = {}

    def emit(self, action, addr, size, phase="", frame=""):
        if not self.closed:
            self.out.write(f"{self.seq},{action},{addr},{size},{self.stream},{frame},{phase}\n")
            self.seq += 1

    def note(self, t, op="", itemsize=None):
        """An allocation, if `t`'s storage is new (or was resized from nothing); its free
        when eager lets it go (or resizes it to nothing)."""
        if not isinstance(t, torch.Tensor):
            return
        if is_traceable_wrapper_subclass(t):
            # A wrapper (DTensor: FSDP2's parameters, AdamW's states of them) holds no
            # memory of its own; its inner tensors do (the ops that made them ran inside
            # the subclass's dispatch, where this mode is not).
            for name in t.__tensor_flatten__()[0]:
                self.note(getattr(t, name), op, itemsize)
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        size = st.nbytes() if itemsize is None else t.numel() * itemsize
        if size == 0:
            return
        addr = self.next_addr
        self.next_addr += (size + 1023) // 512 * 512
        self.live[key] = (addr, size)
        self.emit("alloc", addr, size, frame=op)
        if key not in self.watched:
            self.watched.add(key)
            weakref.finalize(st, self.freed, key, True)

    def freed(self, key, dead=False):
        if dead:
            self.watched.discard(key)
        if key in self.live:
            addr, size = self.live.pop(key)
            self.emit("free_requested", addr, size)
            self.emit("free_completed", addr, size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused:
            return out
        name = "aten::" + func._schema.name.split("::")[-1]
        if name == "aten::native_layer_norm" and args[0].dtype in HALF:
            # CUDA's layer_norm keeps the mean and inverse deviation in float32 for a
            # 16-bit input (the dry run's layer_norm_meta); the CPU's in the input's dtype.
            self.note(out[0], name)
            for t in out[1:3]:
                self.note(t, name, itemsize=4)
        for t in tree_flatten(out)[0]:
            self.note(t, name)
        if name in CUBLAS_OPS:
            phase = "backward" if torch._C._current_autograd_node() is not None else ""
            lt = uses_cublaslt(name, args, kwargs)
            self.emit("workspace_lt" if lt else "workspace", 0, 0, phase)
        elif name in REDUCTIONS and isinstance(out, torch.Tensor):
            self.reduction(func, args, kwargs, out)
        elif name == "aten::_safe_softmax" and isinstance(out, torch.Tensor):
            # CUDA runs the composite (softmax, then the rows that are all -inf set to
            # zero): beside its output, the input's -inf mask (a bool per element), the
            # rows' (a bool per row) and a zero scalar, freed before it returns (an
            # H200's histories of SmolLM2-135M: 36 MiB, 36 KiB and 4 B after each
            # attention's softmax). The fake tensor's kernel makes the output alone.
            x, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", -1)
            self.transients(x.numel(), x.numel() // max(x.size(dim), 1), out.element_size(),
                            frame=name)
        return out

    def transients(self, *sizes, frame=""):
        """Blocks a kernel takes after its output, in this order, and frees before it
        returns, last first."""
        self.transient_end(self.transient_begin(sizes, frame))

    def transient_begin(self, sizes, frame=""):
        """Blocks of `sizes` allocated (none of 0 bytes); freed by `transient_end`."""
        taken = []
        for size in sizes:
            if size > 0:
                addr = self.next_addr
                self.next_addr += (size + 1023) // 512 * 512
                self.emit("alloc", addr, size, frame=frame)
                taken.append((addr, size))
        return taken

    def transient_end(self, taken):
        """The blocks `transient_begin` took freed, in that order."""
        for addr, size in taken:
            self.emit("free_requested", addr, size)
            self.emit("free_completed", addr, size)

    def reduction(self, func, args, kwargs, out):
        """A `reduce` row: a sum's or mean's input and output, from which the replay sizes
        the staging buffer and semaphores CUDA's kernel takes when it splits the
        reduction across thread blocks (the dry run's rule, `src/native/dryrun/reduce.cpp`)."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or is_traceable_wrapper_subclass(x):
            return
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if func._overloadname == "default":
            dims = None
        if isinstance(dims, int):
            dims = [dims]
        geometry = ";".join([
            "x".join(str(n) for n in x.shape),
            "x".join(str(n) for n in x.stride()),
            str(x.storage_offset()),
            str(x.dtype).removeprefix("torch."),
            str(out.dtype).removeprefix("torch."),
            "-" if dims is None else ":".join(str(int(d)) for d in dims),
            "1" if keepdim else "0",
        ])
        phase = "backward" if torch._C._current_autograd_node() is not None else ""
        if not self.closed:
            self.out.write(f"{self.seq},reduce,0,0,{self.stream},{func._schema.name},{phase},"
                           f"{geometry}\n")
            self.seq += 1


class Capture:
    """A context: the code inside runs on fake tensors, and every allocation and free
    of its tensors is written to `path` as the replay's history CSV."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "w")
        self.file.write("seq,action,addr,size,stream,frame,phase,reduction\n")
        self.saved = (torch.nn.functional.scaled_dot_product_attention,
                      torch.nn.functional.dropout)
        torch.nn.functional.scaled_dot_product_attention = sdpa
        torch.nn.functional.dropout = dropout
        self.recorder = _Recorder(self.file)
        self._patch_fsdp()
        self._patch_foreach()
        self.fake = FakeTensorMode()
        self.fake.__enter__()
        self.recorder.__enter__()
        return self

    def _patch_foreach(self):
        """PyTorch's optimizers take their foreach path on CUDA when not told (one list op
        over every parameter: its temporaries a parameter-sized set at once), their
        per-parameter loop on the CPU and for a type it does not list (a fake tensor):
        the fake tensors here stand for CUDA ones (`_default_to_fused_or_foreach`, which
        each optimizer's module imports by name; an explicit `foreach=` or `fused=`
        still decides)."""
        import importlib
        import pkgutil

        import torch.optim

        def as_on_cuda(params, differentiable, use_fused=False):
            return False, not (differentiable or torch.jit.is_scripting())

        for info in pkgutil.iter_modules(torch.optim.__path__):
            module = importlib.import_module(f"torch.optim.{info.name}")
            f = getattr(module, "_default_to_fused_or_foreach", None)
            if f is not None:
                self.patched.append((module, "_default_to_fused_or_foreach", f))
                module._default_to_fused_or_foreach = as_on_cuda

    def _patch_fsdp(self):
        """FSDP2 frees an unsharded parameter by resizing its storage to nothing and
        allocates it again by resizing it back (`_fsdp_param.py`'s free_storage and
        alloc_storage): on a GPU, a free and an allocation; the storage object stays."""
        self.patched = []
        try:
            from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
        except ImportError:
            return
        recorder = lambda: self.recorder  # noqa: E731

        def alloc_storage(tensor, _alloc=_fsdp_param.alloc_storage):
            _alloc(tensor)
            recorder().note(tensor, "fsdp::alloc_storage")

        def free_storage(tensor, _free=_fsdp_param.free_storage):
            recorder().freed(tensor.untyped_storage()._cdata)
            _free(tensor)

        # FSDP2's buffers on its own streams (the all-gather copy-in and all-gather
        # streams, the reduce-scatter stream): the caching allocator keeps each
        # stream's freed blocks for that stream.
        class StreamContext:
            def __init__(ctx, stream):
                ctx.stream = stream

            def __enter__(ctx):
                r = recorder()
                ctx.saved = r.stream
                if ctx.stream is not None:
                    r.stream = r.streams.setdefault(id(ctx.stream), len(r.streams))

            def __exit__(ctx, *exc):
                recorder().stream = ctx.saved
                return False

        default = torch.cpu.current_stream()
        self.recorder.streams[id(default)] = 0
        self.patched.append((torch.cpu, "stream", torch.cpu.stream))
        self.patched.append((torch.cpu, "current_stream", torch.cpu.current_stream))
        torch.cpu.stream = StreamContext
        torch.cpu.current_stream = lambda device=None: default
        for module, name, f in ((_fsdp_param, "alloc_storage", alloc_storage),
                                (_fsdp_param_group, "alloc_storage", alloc_storage),
                                (_fsdp_param, "free_storage", free_storage)):
            self.patched.append((module, name, getattr(module, name)))
            setattr(module, name, f)

    def build_sharded(self, make, shard):
        """`make()`'s module sharded by `shard(module)` (FSDP2's `fully_shard`), on the
        faked device, as a model built on the CPU and sharded onto the GPU: at each
        `fully_shard` call, in the order `shard` makes them, the unit's own parameters
        copied to the GPU whole, then its padded shards allocated, then the whole copies
        freed (what an H200's histories of such ranks start with); the buffers last."""
        import torch.distributed.fsdp as fsdp
        from torch.distributed.tensor import DTensor

        recorder = self.recorder
        unsharded = fsdp.fully_shard

        def fully_shard(module, *args, **kwargs):
            # The unit's own parameters: those no inner unit has sharded yet.
            own = [p for p in module.parameters() if not isinstance(p, DTensor)]
            result = unsharded(module, *args, **kwargs)
            recorder.paused = False
            try:
                whole = recorder.transient_begin(
                    [p.numel() * p.element_size() for p in own], "fully_shard")
                for p in module.parameters():
                    recorder.note(p, "fully_shard")
                recorder.transient_end(whole)
            finally:
                recorder.paused = True
            return result

        self.recorder.paused = True
        fsdp.fully_shard = fully_shard
        try:
            with torch.device(DEVICE):
                module = make()
            shard(module)
        finally:
            fsdp.fully_shard = unsharded
            self.recorder.paused = False
        for p in module.parameters():
            self.recorder.note(p, "fully_shard")
        for b in module.buffers():
            self.recorder.note(b, "fully_shard")
        return module

    def build(self, make):
        """`make()`'s module on the faked device, its parameters and buffers allocated
        as `module.to("cuda")` allocates them (children first, each module's parameters
        then its buffers; a tied weight once): the step of a model built on the CPU (or
        the meta device) and moved, not the initialisation's temporaries."""
        self.recorder.paused = True
        try:
            with torch.device(DEVICE):
                module = make()
        finally:
            self.recorder.paused = False

        def apply_order(m):
            for c in m.children():
                yield from apply_order(c)
            yield from (t for t in m._parameters.values() if t is not None)
            yield from (t for t in m._buffers.values() if t is not None)

        for t in apply_order(module):
            self.recorder.note(t)
        return module

    def replicate(self, module, world, bucket_view=False):
        """`module` wrapped in PyTorch's own `DistributedDataParallel` over the fake process
        group of `world` ranks (as scripts/gpu/ranks_truth.py's cases: 25 MiB buckets,
        `gradient_as_bucket_view=bucket_view`, the all-reduce the bucket divided in place).
        Its buckets are its reducer's own: one of every parameter at construction, rebuilt
        in the second step's forward from the order the gradients became ready. That
        rebuild syncs the new buckets' indices through a tensor whose values it reads, which
        a fake tensor does not have: it runs on real tensors (the new buckets are real,
        untouched host memory, recorded as any block; the fake tensors' ops read them as
        fake ones)."""
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils._python_dispatch import _disable_current_modes

        import ranks_truth

        self.fake.allow_non_fake_inputs = True
        ddp = DistributedDataParallel(module, bucket_cap_mb=25, init_sync=False,
                                      gradient_as_bucket_view=bucket_view)
        recorder = self.recorder

        class Reducer:
            def __init__(self, reducer):
                self.reducer = reducer

            def __getattr__(self, name):
                return getattr(self.reducer, name)

            def _rebuild_buckets(self):
                with _disable_current_modes(), recorder:
                    return self.reducer._rebuild_buckets()

        ddp.reducer = Reducer(ddp.reducer)
        ddp.register_comm_hook(world, ranks_truth.averaged_in_place)
        return ddp

    def tensor(self, t):
        """`t` (a real tensor or a fake one) on the faked device: an allocation."""
        return self.fake.from_tensor(t) if not isinstance(t, torch._subclasses.FakeTensor) \
            else t

    def __exit__(self, *exc):
        self.recorder.__exit__(*exc)
        self.fake.__exit__(*exc)
        (torch.nn.functional.scaled_dot_product_attention,
         torch.nn.functional.dropout) = self.saved
        for module, name, f in self.patched:
            setattr(module, name, f)
        self.recorder.closed = True
        self.file.close()
        return False


def capture_case(model, path, steps=2, fsdp=None, rank=0, reshard=True, precision="f32",
                 ddp=None, bucket_view=False):
    """One of the corpus's models (scripts/gpu_truth.py), its training step as the GPU
    truth measured it (scripts/gpu/ranks_truth.py's loop: AdamW, the loss of
    scripts/gpu/truth.py, gradients set to none after the loss), `steps` steps. With
    `fsdp` (a world size), rank `rank` of FSDP2 over PyTorch's fake process group, wrapped
    as ranks_truth.py's cases are (`shard`); with `ddp` (a world size), a rank of DDP over
    it (`Capture.replicate`)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "gpu")]
    import gpu_truth
    import ranks_truth
    import truth

    gpu_truth.hf_patch()
    build, ikind, shape = gpu_truth.ALL_MODELS[model]
    torch.manual_seed(0)
    mesh = None
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        ranks_truth.init_fake_group(fsdp, rank)
        # Made before the fake tensors: the mesh reads real values.
        mesh = init_device_mesh(DEVICE, (fsdp,))
    elif ddp:
        ranks_truth.init_fake_group(ddp, rank)
    with Capture(path) as cap:
        make = lambda: gpu_truth.First(build(), model.startswith("hf_"))  # noqa: E731
        if mesh is None:
            module = cap.build(make)
            if ddp:
                module = cap.replicate(module, ddp, bucket_view)
        else:
            module = cap.build_sharded(
                make, lambda m: ranks_truth.shard(m, model, mesh, reshard, precision))
        module.train()
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4, weight_decay=0.01)

        def new_input():
            return cap.tensor(torch.randint(0, 1000, shape) if ikind == "ids"
                              else torch.randn(shape))

        ranks_truth.run_steps(module, opt, new_input, DEVICE, torch, truth, steps)


def main(argv):
    """`--model NAME --out FILE [--steps N] [--fsdp N --rank K [--keep] [--bf16]]
    [--ddp N [--bucket-view]]`."""
    def value(flag, default=None):
        if flag not in argv:
            return default
        i = argv.index(flag) + 1
        if i >= len(argv):
            raise ValueError(f"{flag} needs a value")
        return argv[i]

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "gpu")]
    try:
        import gpu_truth

        model, out = value("--model"), value("--out")
        if model is None or out is None:
            raise ValueError("--model NAME and --out FILE are needed (see the top of this file)")
        if model not in gpu_truth.ALL_MODELS:
            raise ValueError(f"--model {model}: not a model of scripts/gpu_truth.py (known: "
                             f"{', '.join(gpu_truth.ALL_MODELS)})")
        def number(flag, default):
            v = value(flag, default)
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"{flag} {v}: not a whole number") from None

        steps, fsdp, rank = number("--steps", 2), number("--fsdp", 0), number("--rank", 0)
        ddp = number("--ddp", 0)
        if steps < 1:
            raise ValueError(f"--steps {steps}: at least 1")
        if fsdp and ddp:
            raise ValueError("--fsdp and --ddp: one sharding at a time")
        if ddp < 0:
            raise ValueError(f"--ddp {ddp}: not a number of ranks")
        if "--bucket-view" in argv and not ddp:
            raise ValueError("--bucket-view is DDP's gradient_as_bucket_view: give --ddp N")
        import ranks_truth

        if fsdp and model not in ranks_truth.BLOCKS:
            raise ValueError(f"--fsdp with --model {model}: its units are not known (FSDP2's "
                             f"models: {', '.join(ranks_truth.BLOCKS)})")
        if fsdp < 0:
            raise ValueError(f"--fsdp {fsdp}: not a number of ranks")
        if not 0 <= rank < max(fsdp, ddp, 1):
            flag = "--ddp" if ddp else "--fsdp"
            raise ValueError(f"--rank {rank}: not a rank of {flag} {fsdp or ddp or 1}")
    except ValueError as e:
        print(f"eager_capture.py: {e}", file=sys.stderr)
        return 2
    from torch._subclasses import fake_tensor

    try:
        capture_case(model, out, steps, fsdp=fsdp or None, rank=rank,
                     reshard="--keep" not in argv,
                     precision="bf16" if "--bf16" in argv else "f32",
                     ddp=ddp or None, bucket_view="--bucket-view" in argv)
    except (fake_tensor.DataDependentOutputException,
            fake_tensor.DynamicOutputShapeException) as e:
        # The innermost frame outside PyTorch: the model's code that asked.
        import traceback

        here = os.path.abspath(__file__)
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if "/torch/" not in f.filename and os.path.abspath(f.filename) != here]
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        print(f"eager_capture.py: --model {model}: the step reads a tensor's values "
              f"({e.func}{at}), which a capture on fake tensors (shapes, no data) cannot "
              f"give; estimate its traced or exported file instead (tch-memprof estimate)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
