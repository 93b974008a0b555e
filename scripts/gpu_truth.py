"""The GPU truth cases: real-world models from transformers, torchvision and timm, built
and traced exactly as they were when their CUDA peaks were measured on an NVIDIA H200
(tests/data/gpu-truth/h200-2026-11-26/README.md says how), so that `tch-memprof
estimate FILE --gpu h200` can be held to those peaks.

    python3 scripts/gpu_truth.py --list               # the cases, one a line
    python3 scripts/gpu_truth.py --out DIR [MODEL ...] # trace them into DIR
    python3 scripts/gpu_truth.py --cache ROOT          # all, held-out too, through a cache
    python3 scripts/gpu_truth.py --held-out --list     # the held-out models (HELD_OUT)
    python3 scripts/gpu_truth.py --device cuda:0 --out DIR MODEL  # traced on a GPU
    python3 scripts/gpu_truth.py --paced --out DIR     # all, held-out too, a model at a time

--device traces on that device: a file traced on the CPU keeps the tensors tracing
baked in as constants (transformers' attention masks and position indices, stochastic
depth's scale) on the CPU, and fails on CUDA whichever way it is loaded; traced on the
GPU it runs there.

With --cache the files are written into a folder under ROOT named by a hash of this
script, scripts/corpus.py, the Python and the versions of torch and the packages, reused
while that hash holds (the entry is marked complete last, so a killed run is redone;
older entries are removed), and that folder is printed on standard output.

With --paced, each model's lines are also printed on standard output as soon as its
files are written, and the next model waits for a line on standard input (the script
stops at its end): the reader estimates a model and removes its files while the next is
traced, so that the disk holds two models' files at most, not all of them (11.6 GB
with the held-out models; tests/gpu_truth.rs prints both figures).

For each model and each mode it was measured in (inference traced in eval() under
no_grad; training traced in train() with grad enabled), DIR/MODEL.MODE.pt and a line in
DIR/cases.jsonl: {"model", "mode", "file", "input"} (mode: infer or train; every
train-* measurement of a model uses its train file; input: the measured shape, which
the estimate is given).

The models are traced at batch 1 with the measured sequence length or image size: the
batch is an input size of the traced program, and the estimates of all 42 cases from
files traced at batch 1 and at the measured batch were byte-identical (weights, peak
allocated, peak reserved; checked with torch 2.11 on 2026-11-26), at 1m24s of tracing
instead of 3m37s on a 2-core machine (`time python3 scripts/gpu_truth.py --out A` and
`... --measured-batch --out B`). --measured-batch traces at the measured shape. To check
it again: run `tch-memprof estimate FILE --input INPUT --gpu h200 --csv` (with `--train
--optimizer adamw`, and `--autocast bf16` for train-bf16, as tests/gpu_truth.rs does) on
each case's file from A and from B, and compare the rows.

Run with the Python of the torch wheel that scripts/with-libtorch.sh installs, with the
packages of scripts/corpus-env.sh (transformers 4.57.6, torchvision 0.26.0 for torch
2.11, timm 1.0.31: the versions the measurements were made with).
"""

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import hf_patch  # noqa: E402  (the older SDPA mask functions, as measured)

IDS_DECODER = (4, 1024)
IDS_ENCODER = (8, 512)
PIXELS = (32, 3, 224, 224)


def hf(model_cls, config_cls, **cfg):
    def build():
        import transformers as tf

        return getattr(tf, model_cls)(getattr(tf, config_cls)(**cfg))

    return build


def tv(name):
    def build():
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None)

    return build


def timm_model(name):
    def build():
        import timm

        return timm.create_model(name, pretrained=False)

    return build


# model -> (constructor, input kind, shape), as the measurement's README lists them.
MODELS = {
    "hf_gpt2": (hf("GPT2LMHeadModel", "GPT2Config", use_cache=False,
                   attn_implementation="sdpa"), "ids", IDS_DECODER),
    "hf_smollm2_135m": (hf("LlamaForCausalLM", "LlamaConfig", vocab_size=49152,
                           hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                           num_attention_heads=9, num_key_value_heads=3,
                           max_position_embeddings=2048, tie_word_embeddings=True,
                           use_cache=False, attn_implementation="sdpa"), "ids", IDS_DECODER),
    "hf_qwen2_tiny": (hf("Qwen2ForCausalLM", "Qwen2Config", vocab_size=32000, hidden_size=512,
                         intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=2, use_cache=False,
                         attn_implementation="sdpa"), "ids", IDS_DECODER),
    "hf_bert_base": (hf("BertForMaskedLM", "BertConfig", attn_implementation="sdpa"),
                     "ids", IDS_ENCODER),
    "hf_distilbert": (hf("DistilBertForMaskedLM", "DistilBertConfig",
                         attn_implementation="sdpa"), "ids", IDS_ENCODER),
    "hf_vit_base": (hf("ViTForImageClassification", "ViTConfig", attn_implementation="sdpa"),
                    "pixels", PIXELS),
    "timm_vit_small_patch16_224": (timm_model("vit_small_patch16_224"), "pixels", PIXELS),
    "timm_convnextv2_nano": (timm_model("convnextv2_nano"), "pixels", PIXELS),
}
for _name in ["resnet50", "convnext_tiny", "efficientnet_b0", "swin_t", "mobilenet_v3_large",
              "vgg16", "regnet_y_400mf"]:
    MODELS["tv_" + _name] = (tv(_name), "pixels", PIXELS)

# Models the estimate was not built on: measured on a GPU the same way (truth.py measure,
# inference and training), never used to fit a rule, to say how right the estimate is on
# code it was not given. truth.py and gpu_truth.py find them by name like the others;
# --list and the default set of --out leave them out unless --held-out is given; --cache
# traces them with the others.
HELD_OUT = {
    "hf_roberta_base": (hf("RobertaForMaskedLM", "RobertaConfig", max_position_embeddings=514,
                           attn_implementation="sdpa"), "ids", IDS_ENCODER),
    "hf_opt_125m": (hf("OPTForCausalLM", "OPTConfig", use_cache=False,
                       attn_implementation="sdpa"), "ids", IDS_DECODER),
    "hf_pythia_160m": (hf("GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=50304,
                          hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                          intermediate_size=3072, use_cache=False,
                          attn_implementation="sdpa"), "ids", IDS_DECODER),
    "hf_mistral_tiny": (hf("MistralForCausalLM", "MistralConfig", vocab_size=32000,
                           hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                           num_attention_heads=8, num_key_value_heads=2, use_cache=False,
                           attn_implementation="sdpa"), "ids", IDS_DECODER),
    "timm_deit_small_patch16_224": (timm_model("deit_small_patch16_224"), "pixels", PIXELS),
    "timm_mixer_b16_224": (timm_model("mixer_b16_224"), "pixels", PIXELS),
}
for _name in ["resnet18", "densenet121", "mobilenet_v2", "resnext50_32x4d",
              "shufflenet_v2_x1_0"]:
    HELD_OUT["tv_" + _name] = (tv(_name), "pixels", PIXELS)
# Every model by name, the held-out ones included.
ALL_MODELS = {**MODELS, **HELD_OUT}

MODES = ("infer", "train")


class First(torch.nn.Module):
    """forward(x) returns the model's first output, as measured: Hugging Face models
    called with return_dict=False; a dict gives `out` or its first value; a tuple or a
    list its first element."""

    def __init__(self, model, hf_model):
        super().__init__()
        self.m = model
        self.hf = hf_model

    def forward(self, x):
        out = self.m(x, return_dict=False) if self.hf else self.m(x)
        if isinstance(out, dict):
            out = out["out"] if "out" in out else next(iter(out.values()))
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out


def spec(kind, shape):
    return "x".join(map(str, shape)) + (":i64" if kind == "ids" else "")


def trace(model, out_dir, measured_batch=False, device="cpu"):
    build, kind, shape = ALL_MODELS[model]
    traced_shape = shape if measured_batch else (1,) + shape[1:]
    rows = []
    for mode in MODES:
        torch.manual_seed(0)
        wrapper = First(build(), model.startswith("hf_")).to(device)
        x = (torch.randint(0, 1000, traced_shape) if kind == "ids"
             else torch.randn(traced_shape)).to(device)
        path = os.path.join(out_dir, f"{model}.{mode}.pt")
        if mode == "infer":
            wrapper.eval()
            with torch.no_grad():
                traced = torch.jit.trace(wrapper, (x,), check_trace=False, strict=False)
        else:
            wrapper.train()
            traced = torch.jit.trace(wrapper, (x,), check_trace=False, strict=False)
        traced.save(path)
        rows.append({"model": model, "mode": mode, "file": path, "input": spec(kind, shape)})
    return rows


def cache_key():
    import hashlib
    from importlib import metadata

    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for script in ("gpu_truth.py", "corpus.py"):
        with open(os.path.join(here, script), "rb") as f:
            h.update(f.read())
    parts = [sys.version, torch.__version__]
    for package in ("transformers", "timm", "torchvision"):
        try:
            parts.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{package} missing")
    h.update("\0".join(parts).encode())
    return h.hexdigest()[:16]


def cached(root):
    import fcntl
    import shutil

    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    prefix = f"gpu-truth-torch{torch.__version__}"
    entry = os.path.join(root, f"{prefix}-{cache_key()}")
    with open(os.path.join(root, "gpu-truth.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(entry, "complete")):
            for other in os.listdir(root):
                if other.startswith("gpu-truth-torch"):
                    shutil.rmtree(os.path.join(root, other), ignore_errors=True)
            code = trace_all(entry, list(ALL_MODELS))
            if code != 0:
                return code
            open(os.path.join(entry, "complete"), "w").close()
        else:
            print(f"gpu_truth: the traced cases from the cache, {entry}", file=sys.stderr)
    print(entry)
    return 0


def trace_all(out_dir, names, measured_batch=False, device="cpu", paced=False):
    os.makedirs(out_dir, exist_ok=True)
    hf_patch()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with open(os.path.join(out_dir, "cases.jsonl"), "w") as f:
        for i, name in enumerate(names):
            if paced and i > 0 and not sys.stdin.readline():
                break
            for row in trace(name, out_dir, measured_batch, device):
                f.write(json.dumps(row) + "\n")
                f.flush()
                if paced:
                    print(json.dumps(row), flush=True)
                print(f"{row['model']} {row['mode']}: traced", file=sys.stderr)
            if paced:
                print(flush=True)
    return 0


def main(argv):
    if "--cache" in argv:
        return cached(argv[argv.index("--cache") + 1])
    models = HELD_OUT if "--held-out" in argv else MODELS
    if "--list" in argv:
        for m in models:
            print(m)
        return 0
    if "--out" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    i = argv.index("--out")
    out_dir = argv[i + 1]
    rest = argv[:i] + argv[i + 2:]
    if "--device" in rest:
        j = rest.index("--device")
        rest = rest[:j] + rest[j + 2:]
    names = [a for a in rest if not a.startswith("--")] or list(
        ALL_MODELS if "--paced" in argv and "--held-out" not in argv else models)
    unknown = [n for n in names if n not in ALL_MODELS]
    if unknown:
        print(f"gpu_truth.py: unknown model(s) {', '.join(unknown)}; known: "
              f"{', '.join(ALL_MODELS)}", file=sys.stderr)
        return 2
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    return trace_all(out_dir, names, "--measured-batch" in argv, device, "--paced" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
