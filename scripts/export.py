"""Exports a PyTorch model in the form tch-memprof estimates best, in one step: a `.pt2`
program (torch.export, a dynamic batch) and a TorchScript file (torch.jit.trace), with
the workarounds today's transformers and torch need. Run it with your own Python and
torch (the model's packages installed); it downloads nothing but what you name.

    python3 export.py torchvision:resnet50
    python3 export.py timm:vit_base_patch16_224 --train
    python3 export.py transformers:GPT2LMHeadModel --set n_layer=12 --input 8x1024:i64
    python3 export.py transformers:meta-llama/Llama-3.2-1B     # its config, random weights
    python3 export.py my_model.py:Net --set width=512 --input 32x3x64x64

MODEL is PACKAGE:NAME or FILE.py:NAME:
  torchvision:NAME   torchvision.models.get_model(NAME, weights=None, **SET)
  timm:NAME          timm.create_model(NAME, pretrained=False, **SET)
  transformers:CLASS a transformers model class (GPT2LMHeadModel, BertForMaskedLM, ...)
                     built from its config class's defaults, SET overriding them
  transformers:ID    a Hub id or a local folder: its config only (AutoConfig; no weights
                     are downloaded, memory does not depend on their values), the model
                     class from the config's `architectures` or --class
  FILE.py:NAME       NAME in your file: an nn.Module class or a function returning one,
                     called with SET as keyword arguments (an nn.Module instance as is)

Options:
  --input SHAPE[:DTYPE]  an input of the forward, in the order it takes them (repeat for
                         more); SHAPE as 8x3x224x224, DTYPE f32 (default), f16, bf16,
                         i64 (token ids: drawn below the config's vocab_size), i32, bool.
                         Defaults: 2x3xHxW images at the model's own size, 2x128:i64
                         tokens for transformers text models; FILE.py models need it.
  --set KEY=VALUE        a constructor argument or config field (a Python literal, else a
                         string); repeat for more
  --class CLASS          the transformers class for an ID (default: its architectures[0])
  --train                export the model in training mode (dropout, batch statistics):
                         what `estimate --train` should read
  --dynamic DIMS         the dimensions of every input left dynamic, comma-separated
                         (default 0, the batch; 0,1 also leaves a sequence length)
  --out DIR              where to write NAME.pt2 and NAME.pt (default: .)
  --name NAME            the files' name (default: from MODEL)
  --only pt2|pt          write one of the two

Exit status: 0 when both files (or the one --only asks for) are written, 1 when PyTorch
could not export or trace the model (its error is printed, in one line), 2 for a usage
error. What each file is, and what to run next, is printed on standard output.
"""

import argparse
import ast
import importlib
import importlib.util
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


class Usage(Exception):
    """A usage error: printed as `export: ...`, exit status 2."""


DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "i64": "int64", "i32": "int32", "bool": "bool"}


def parse_input(spec):
    shape, _, dtype = spec.partition(":")
    dtype = dtype or "f32"
    if dtype not in DTYPES:
        raise Usage(f"--input {spec!r}: the type {dtype!r} is not one of "
                    f"{', '.join(DTYPES)}")
    try:
        dims = [int(d) for d in shape.split("x")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims):
        raise Usage(f"--input {spec!r}: the shape must be sizes of at least 1 joined by "
                    "'x', as 8x3x224x224")
    return dims, dtype


def parse_set(items):
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise Usage(f"--set {item!r}: give KEY=VALUE, as n_layer=12")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = {"true": True, "false": False, "none": None}.get(value.lower(), value)
    return out


def need(package):
    try:
        return importlib.import_module(package)
    except ImportError:
        raise Usage(f"{package} is not installed in this Python ({sys.executable}): "
                    f"pip install {package}") from None


def build(spec, sets, cls_name):
    """(model, name, default inputs, vocab_size or None) for MODEL."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name:
        raise Usage(f"{spec!r} is not PACKAGE:NAME or FILE.py:NAME (as torchvision:resnet50)")
    if where == "torchvision":
        tv = need("torchvision")
        try:
            model = tv.models.get_model(name, weights=None, **sets)
        except ValueError:
            raise Usage(f"torchvision has no model {name!r} "
                        "(torchvision.models.list_models() names them)") from None
        return model, name, [([2, 3, 224, 224], "f32")], None
    if where == "timm":
        timm = need("timm")
        if not timm.is_model(name):
            raise Usage(f"timm has no model {name!r} (timm.list_models() names them)")
        model = timm.create_model(name, pretrained=False, **sets)
        size = list(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224)))
        return model, name, [([2] + size, "f32")], None
    if where == "transformers":
        return build_transformers(name, sets, cls_name)
    if where.endswith(".py"):
        return build_file(where, name, sets)
    raise Usage(f"{where!r} is not torchvision, timm, transformers or a FILE.py")


def build_transformers(name, sets, cls_name):
    tf = need("transformers")
    # A model for memory: no KV cache is returned unless asked for.
    sets = {"use_cache": False, **sets}
    cls = getattr(tf, name, None)
    if isinstance(cls, type) and issubclass(cls, tf.PreTrainedModel):
        config = cls.config_class(**sets)
        label = name
    elif name[:1].isupper() and "/" not in name and not os.path.isdir(name):
        raise Usage(f"transformers {tf.__version__} has no model class {name!r} "
                    "(as GPT2LMHeadModel; a Hub id is lower-case or has a '/')")
    else:
        try:
            config = tf.AutoConfig.from_pretrained(name, **sets)
        except (OSError, ValueError) as e:
            raise Usage(f"transformers has no model class {name!r}, and no config for it "
                        f"as a Hub id or folder ({str(e).splitlines()[0]})") from None
        cls_name = cls_name or (config.architectures or [None])[0]
        if cls_name is None:
            raise Usage(f"{name}'s config names no architecture: give --class "
                        "(as --class LlamaForCausalLM)")
        cls = getattr(tf, cls_name, None)
        if cls is None:
            raise Usage(f"transformers has no class {cls_name!r}")
        label = name.rstrip("/").rsplit("/", 1)[-1]
    if hasattr(config, "attn_implementation") or hasattr(config, "_attn_implementation"):
        # SDPA, as transformers defaults to where it can: the estimate reads it as the
        # fused attention a GPU runs (--attention says which).
        try:
            config._attn_implementation = "sdpa"
        except Exception:  # noqa: BLE001 - a model without SDPA keeps its own
            pass
    try:
        model = cls._from_config(config)
    except ValueError:  # a model without SDPA
        config._attn_implementation = "eager"
        model = cls._from_config(config)
    vision = getattr(config, "image_size", None)
    if vision is not None and "pixel_values" in forward_args(model):
        size = vision if isinstance(vision, (list, tuple)) else (vision, vision)
        channels = getattr(config, "num_channels", 3)
        return model, label, [([2, channels, *size], "f32")], None
    tokens = min(128, getattr(config, "max_position_embeddings", None) or 128)
    return model, label, [([2, tokens], "i64")], getattr(config, "vocab_size", None)


def forward_args(model):
    import inspect

    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return []


def build_file(path, name, sets):
    import torch

    if not os.path.isfile(path):
        raise Usage(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location("_export_user_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    obj = getattr(module, name, None)
    if obj is None:
        raise Usage(f"{path} defines no {name!r}")
    model = obj if isinstance(obj, torch.nn.Module) else obj(**sets)
    if not isinstance(model, torch.nn.Module):
        raise Usage(f"{path}:{name} is a {type(model).__name__}, not an nn.Module")
    return model, name, None, None


def make_input(dims, dtype, vocab):
    import torch

    kind = getattr(torch, DTYPES[dtype])
    if dtype in ("i64", "i32"):
        return torch.randint(0, vocab or 100, dims, dtype=kind)
    if dtype == "bool":
        return torch.ones(dims, dtype=kind)
    return torch.randn(dims).to(kind)


def hf_trace_patch():
    """transformers >= 4.56 on torch >= 2.6 builds causal masks under vmap, which
    torch.jit.trace cannot trace ("RuntimeError: unordered_map::at"); its older mask
    functions trace. Only the TorchScript file needs it: torch.export reads both."""
    try:
        import transformers.masking_utils as mu
    except ImportError:
        return
    mu._is_torch_greater_or_equal_than_2_6 = False
    if hasattr(mu, "sdpa_mask_older_torch"):
        mu.sdpa_mask = mu.sdpa_mask_older_torch
        mapping = getattr(mu.AttentionMaskInterface, "_global_mapping", None)
        if mapping is not None and "sdpa" in mapping:
            mapping["sdpa"] = mu.sdpa_mask_older_torch


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def export_pt2(model, xs, dims, path):
    """torch.export.export with the chosen dimensions dynamic, saved with
    torch.export.save. Returns what was written, in words. A dimension the model fixes
    (a reshape to a constant, a check on the size) is exported as the model has it, and
    said: torch.export then keeps its size."""
    import torch
    from torch.export import Dim

    def shapes(hint):
        return tuple({d: hint(i, d) for d in dims if d < x.dim()} for i, x in enumerate(xs))

    def named(i, d):
        return Dim(f"batch{i}" if d == 0 else f"dim{i}_{d}", min=1)

    try:
        ep = torch.export.export(model, xs, dynamic_shapes=shapes(named), strict=False)
    except Exception as e:  # noqa: BLE001 - the model fixes a dimension: let export decide
        if "Constraint" not in type(e).__name__ and "constraint" not in str(e).lower() \
                and "specializ" not in str(e).lower():
            raise
        ep = torch.export.export(model, xs, dynamic_shapes=shapes(lambda i, d: Dim.AUTO),
                                 strict=False)
    try:
        torch.export.save(ep, path)
        form = "the training IR"
    except Exception:  # noqa: BLE001 - transformers' vmap masks: saved in core ATen
        # An empty decomposition table keeps SDPA as one op (the default table turns it
        # into bmm and softmax, which a GPU would not run).
        torch.export.save(ep.run_decompositions({}), path)
        form = "core ATen, SDPA kept"
    return form, dynamic_words(ep, xs, dims)


def dynamic_words(ep, xs, dims):
    """Which chosen dimensions stayed dynamic in the program, in words."""
    import torch

    user = [s.arg.name for s in ep.graph_signature.input_specs
            if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    words = []
    for i, name in enumerate(user[:len(xs)]):
        shape = getattr(vals.get(name), "shape", ())
        for d in dims:
            if d >= len(shape):
                continue
            what = "batch" if d == 0 else f"dimension {d}"
            size = shape[d]
            if isinstance(size, torch.SymInt):
                words.append(f"input {i}'s {what} dynamic")
            else:
                words.append(f"input {i}'s {what} fixed at {int(size)} by the model")
    return ", ".join(words) or "static sizes"


def trace_pt(model, xs, path):
    import torch

    hf_trace_patch()
    with torch.no_grad():
        traced = torch.jit.trace(model, xs, strict=False, check_trace=False)
    traced.save(path)


class Parser(argparse.ArgumentParser):
    """argparse, its errors in one line of this script's words."""

    def error(self, message):
        raise Usage(f"{message} (python3 export.py --help says how)")


def main(argv):
    parser = Parser(prog="export.py", add_help=False)
    parser.add_argument("model")
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--class", dest="cls", default=None)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--dynamic", default="0")
    parser.add_argument("--out", default=".")
    parser.add_argument("--name", default=None)
    parser.add_argument("--only", choices=("pt2", "pt"), default=None)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    args = parser.parse_args(argv)
    try:
        dims = sorted({int(d) for d in args.dynamic.split(",") if d.strip()})
    except ValueError:
        raise Usage(f"--dynamic {args.dynamic!r}: give dimensions as 0 or 0,1") from None
    inputs = [parse_input(s) for s in args.input]
    sets = parse_set(args.set)

    import torch

    torch.manual_seed(0)
    model, label, defaults, vocab = build(args.model, sets, args.cls)
    if not inputs:
        if defaults is None:
            raise Usage(f"{args.model}: give its forward's inputs with --input "
                        "(as --input 32x3x64x64)")
        inputs = defaults
    model.train(args.train)
    name = args.name or label.replace("/", "-")
    os.makedirs(args.out, exist_ok=True)
    # A size-1 dimension is fixed by torch.export whatever it is told: the example
    # inputs are 2 where the user's shape says 1 on a dynamic dimension.
    xs = tuple(make_input([2 if (d in dims and s == 1) else s for d, s in enumerate(shape)],
                          dtype, vocab) for shape, dtype in inputs)
    mode = "training" if args.train else "eval"
    failed = 0
    written = []
    if args.only in (None, "pt2"):
        path = os.path.join(args.out, name + ".pt2")
        try:
            form, dynamic = export_pt2(model, xs, dims, path)
            written.append(path)
            print(f"{path}: torch.export, {mode} mode, {form}; {dynamic}")
        except Exception as e:  # noqa: BLE001 - PyTorch's refusal, in one line
            failed += 1
            print(f"export: torch.export could not export {args.model}: {first_line(e)}",
                  file=sys.stderr)
    if args.only in (None, "pt"):
        path = os.path.join(args.out, name + ".pt")
        try:
            trace_pt(model, xs, path)
            written.append(path)
            print(f"{path}: torch.jit.trace, {mode} mode (TorchScript takes other sizes)")
        except Exception as e:  # noqa: BLE001 - PyTorch's refusal, in one line
            failed += 1
            print(f"export: torch.jit.trace could not trace {args.model}: {first_line(e)}",
                  file=sys.stderr)
    if written:
        shape = " ".join("--input " + "x".join(map(str, s)) + ("" if t == "f32" else ":" + t)
                         for s, t in inputs)
        train = " --train --optimizer adamw" if args.train else ""
        print(f"next: tch-memprof estimate {written[0]} {shape}{train} --memory h100")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Usage as e:
        print(f"export: {e}", file=sys.stderr)
        sys.exit(2)
