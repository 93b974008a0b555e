"""Exported programs (.pt2) for the reader's behaviour tests (tests/exported.rs), made
by PyTorch's own torch.export.export and torch.export.save:

    python3 scripts/export-cases.py DIR

DIR/resnet18.pt2 and DIR/resnet18-core.pt2: torchvision's ResNet-18 (10 classes) at
    2x3x64x64, as the training IR and after run_decompositions() (core ATen);
DIR/resnet18-dynamic.pt2: the same model exported with a dynamic batch, Dim("batch");
DIR/resnet18.pt: the same model (the same weights) traced with torch.jit.trace;
DIR/bert.pt2 and DIR/bert-core.pt2: a small transformers BERT at 2x32 tokens, both forms;
DIR/dynamic.pt2: a small CNN exported with a dynamic batch, Dim("batch", min=2, max=16);
DIR/static.pt2: the same CNN exported at batch 4;
DIR/cond.pt2: a module branching with torch.cond;
DIR/custom.pt2: a module calling a custom op (torch.library.custom_op "memprof_test::twice");
DIR/autocast.pt2: a module that turns autocast on inside its forward;
DIR/causal.pt2: attention with a causal mask filled with -inf (the float the schema
    writes as the string "-Infinity");
DIR/views.pt2: buffers that view one storage: a slice at an offset and a transpose;
DIR/lora.pt2: a linear layer with a low-rank adapter beside it, the layer frozen
    (requires_grad False, as a fine-tune freezes its base weights); DIR/lora-trained.pt2
    the same module with nothing frozen; DIR/lora.json: the bytes of its trainable and
    frozen parameters (shape and bytes), as PyTorch gives them; DIR/lora-inference.pt2 the
    same module with every parameter frozen (as a module exported for inference);
DIR/lora-stack.pt2: three such blocks in a module list (layers.0 .. layers.2), each
    block's linear layer frozen and block 1's adapter too (a unit with nothing to train);
    DIR/lora-stack.json its trainable and frozen parameters (shape and bytes).
Run with the Python of the torch wheel that scripts/with-libtorch.sh installs, with the
packages of scripts/corpus-env.sh.
"""

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(x.mean(dim=(2, 3)))


class Branching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.fc(x), lambda x: self.fc(-x), (x,))


@torch.library.custom_op("memprof_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Custom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return twice(self.fc(x))


class Autocasting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.fc(x)


class Causal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 4.0
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Views(torch.nn.Module):
    def __init__(self):
        super().__init__()
        table = torch.randn(100, 8)
        self.register_buffer("table", table)
        self.register_buffer("tail", table[50:])
        self.register_buffer("table_t", table.t())
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x @ self.table_t[:, :8]) + self.tail.sum()


class Lora(torch.nn.Module):
    """A linear layer and a rank-8 adapter beside it (LoRA's shape, without its scaling)."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(256, 256)
        self.lora_a = torch.nn.Linear(256, 8, bias=False)
        self.lora_b = torch.nn.Linear(8, 256, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoraStack(torch.nn.Module):
    """Three `Lora` blocks one after another, in a module list."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Lora() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def save(ep, path, core=False):
    torch.export.save(ep.run_decompositions({}) if core else ep, path)


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[0]
    os.makedirs(out, exist_ok=True)

    import torchvision

    resnet = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    ep = torch.export.export(resnet, (x,))
    save(ep, os.path.join(out, "resnet18.pt2"))
    save(ep, os.path.join(out, "resnet18-core.pt2"), core=True)
    # As the estimate's docs say to export it: the batch dynamic, no bound given.
    ep = torch.export.export(resnet, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    save(ep, os.path.join(out, "resnet18-dynamic.pt2"))
    with torch.no_grad():
        torch.jit.trace(resnet, (x,)).save(os.path.join(out, "resnet18.pt"))

    import transformers

    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128)
    bert = transformers.BertModel(cfg).eval()
    ids = torch.randint(3, 900, (2, 32))
    ep = torch.export.export(bert, (ids,), strict=False)
    save(ep, os.path.join(out, "bert.pt2"))
    save(ep, os.path.join(out, "bert-core.pt2"), core=True)

    cnn = SmallCnn().eval()
    batch = torch.export.Dim("batch", min=2, max=16)
    ep = torch.export.export(cnn, (torch.randn(4, 3, 32, 32),), dynamic_shapes=({0: batch},))
    save(ep, os.path.join(out, "dynamic.pt2"))
    save(torch.export.export(cnn, (torch.randn(4, 3, 32, 32),)), os.path.join(out, "static.pt2"))

    for name, module in (("cond", Branching()), ("custom", Custom()), ("autocast", Autocasting()),
                         ("views", Views())):
        ep = torch.export.export(module.eval(), (torch.randn(4, 8),))
        save(ep, os.path.join(out, name + ".pt2"))
    ep = torch.export.export(Causal().eval(), (torch.randn(2, 10, 16),))
    save(ep, os.path.join(out, "causal.pt2"))

    lora = Lora()
    x = torch.randn(4, 256)
    save(torch.export.export(lora, (x,)), os.path.join(out, "lora-trained.pt2"))
    lora.base.requires_grad_(False)
    save(torch.export.export(lora, (x,)), os.path.join(out, "lora.pt2"))
    def described(trains, module=None):
        return [{"shape": list(p.shape), "bytes": p.numel() * p.element_size()}
                for p in (lora if module is None else module).parameters()
                if p.requires_grad == trains]
    with open(os.path.join(out, "lora.json"), "w") as f:
        json.dump({"trainable": described(True), "frozen": described(False)}, f)
    lora.requires_grad_(False)
    save(torch.export.export(lora, (x,)), os.path.join(out, "lora-inference.pt2"))
    stack = LoraStack()
    for block in stack.layers:
        block.base.requires_grad_(False)
    stack.layers[1].requires_grad_(False)
    save(torch.export.export(stack, (x,)), os.path.join(out, "lora-stack.pt2"))
    with open(os.path.join(out, "lora-stack.json"), "w") as f:
        json.dump({"trainable": described(True, stack), "frozen": described(False, stack)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
