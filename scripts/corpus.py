"""The model corpus: real-world models from the transformers, torchvision and timm
packages, random-initialised from small configurations (nothing is downloaded) and
traced with torch.jit.trace at the shape they are estimated at, as their users trace
them.

    python3 scripts/corpus.py --list                 # the models, one a line
    python3 scripts/corpus.py --out DIR [NAME ...]   # trace them into DIR
    python3 scripts/corpus.py --held-out ...         # the same for the held-out set
    python3 scripts/corpus.py --full-size ...        # and for full-size decoders
    python3 scripts/corpus.py --pt2 [--held-out] --out DIR [NAME ...]
                                                     # exported as .pt2 programs
    python3 scripts/corpus.py [--pt2] [--held-out] --cache ROOT --out DIR [NAME ...]
                                                     # through a cache under ROOT

For each model, DIR/NAME.pt (DIR/NAME.pt2 with --pt2) and a line in DIR/corpus.jsonl:
  {"name", "package", "file", "inputs": ["2x64:i64", ...], "param_bytes", "buffer_bytes",
   "data_bytes", "constant_bytes", "ops", "error"}
where param_bytes and buffer_bytes are what PyTorch counts of the model
(`named_parameters()` and `named_buffers()`, each storage once), data_bytes and
constant_bytes the sizes of the file's variable and graph-constant records, ops the aten
ops its forward graph calls (`aten::name.overload`), and error is
set when PyTorch itself could not trace the model (the model then has no file).
With --pt2, data_bytes is the size of the archive's weight and constant records,
constant_bytes 0, ops empty, and "ir" says which form was saved ("training" or
"core-aten").

With --cache ROOT the files are written under ROOT (one folder for each set and format,
named by a hash of this script, the Python, and the versions of torch and the corpus's
packages) and reused while that hash holds; the files are hard-linked (else copied) into
DIR, and DIR/corpus.jsonl names them there.

Models run in a worker process: a model whose tracer or exporter crashes PyTorch (an
abort or a fatal signal) is tried once more in a new worker, then reported with the
error "Crash: ...", and the models after it still run.

A full disk ends the run with one line that names the folder and its free space (exit
status 2), not as a crash of PyTorch's writer.

Run with the Python of the torch wheel that scripts/with-libtorch.sh installs, with
the packages of scripts/corpus-env.sh.
"""

import json
import os
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)

TEXT = (2, 64)
IMAGE = (1, 3, 224, 224)
SMALL_IMAGE = (2, 3, 64, 64)

# A small transformer: every transformers config takes these under one of its names.
SMALL = dict(
    vocab_size=1000,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=128,
    use_cache=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def hf_patch():
    """transformers >= 4.56 on torch >= 2.6 builds causal masks under vmap, which
    torch.jit.trace cannot trace; its older mask functions trace."""
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


def hf(config_cls, model_cls, shape=TEXT, **over):
    def build():
        import transformers

        kw = dict(SMALL)
        kw.update(over)
        cfg = getattr(transformers, config_cls)(**kw)
        return getattr(transformers, model_cls)(cfg).eval()

    return build, [shape_spec(shape, "i64")], "transformers"


def hf_image(config_cls, model_cls, shape=SMALL_IMAGE, **over):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(**over)
        return getattr(transformers, model_cls)(cfg).eval()

    return build, [shape_spec(shape, "f32")], "transformers"


def tv(name, shape=IMAGE, **kw):
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kw).eval()

    return build, [shape_spec(shape, "f32")], "torchvision"


def tv_class(path, shape, **kw):
    def build():
        import importlib

        mod, cls = path.rsplit(".", 1)
        return getattr(importlib.import_module(mod), cls)(**kw).eval()

    return build, [shape_spec(shape, "f32")], "torchvision"


def tm(name, shape=IMAGE, **kw):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw).eval()

    return build, [shape_spec(shape, "f32")], "timm"


def shape_spec(shape, dtype):
    return "x".join(str(s) for s in shape) + ":" + dtype


DEC = dict(tie_word_embeddings=False)

MODELS = {
    # transformers: decoder LLMs (causal LM heads), sdpa attention as they default to.
    "hf-gpt2": hf("GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "hf-llama": hf("LlamaConfig", "LlamaForCausalLM"),
    "hf-mistral": hf("MistralConfig", "MistralForCausalLM", sliding_window=None),
    "hf-qwen2": hf("Qwen2Config", "Qwen2ForCausalLM"),
    "hf-qwen3": hf("Qwen3Config", "Qwen3ForCausalLM", head_dim=16),
    "hf-phi3": hf("Phi3Config", "Phi3ForCausalLM"),
    "hf-phi": hf("PhiConfig", "PhiForCausalLM"),
    "hf-gemma": hf("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "hf-gemma2": hf("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=32),
    "hf-olmo": hf("OlmoConfig", "OlmoForCausalLM"),
    "hf-olmo2": hf("Olmo2Config", "Olmo2ForCausalLM"),
    "hf-stablelm": hf("StableLmConfig", "StableLmForCausalLM"),
    "hf-gpt-neox": hf("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "hf-opt": hf("OPTConfig", "OPTForCausalLM", ffn_dim=128, word_embed_proj_dim=64),
    "hf-bloom": hf("BloomConfig", "BloomForCausalLM", n_layer=2, n_head=4),
    "hf-falcon": hf("FalconConfig", "FalconForCausalLM", new_decoder_architecture=False),
    "hf-gptj": hf("GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128),
    "hf-codegen": hf("CodeGenConfig", "CodeGenForCausalLM", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128, n_ctx=128),
    "hf-gpt-bigcode": hf("GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "hf-starcoder2": hf("Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=None),
    "hf-cohere": hf("CohereConfig", "CohereForCausalLM"),
    "hf-granite": hf("GraniteConfig", "GraniteForCausalLM"),
    "hf-xglm": hf("XGLMConfig", "XGLMForCausalLM", d_model=64, num_layers=2, attention_heads=4, ffn_dim=128),
    "hf-biogpt": hf("BioGptConfig", "BioGptForCausalLM"),
    "hf-mixtral": hf("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    # transformers: encoders.
    "hf-bert": hf("BertConfig", "BertForMaskedLM"),
    "hf-bert-eager": hf("BertConfig", "BertModel", attn_implementation="eager"),
    "hf-roberta": hf("RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=130),
    "hf-distilbert": hf("DistilBertConfig", "DistilBertForMaskedLM", dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "hf-albert": hf("AlbertConfig", "AlbertForMaskedLM", embedding_size=32),
    "hf-electra": hf("ElectraConfig", "ElectraForMaskedLM", embedding_size=64),
    "hf-deberta-v2": hf("DebertaV2Config", "DebertaV2ForMaskedLM"),
    "hf-mpnet": hf("MPNetConfig", "MPNetForMaskedLM"),
    "hf-xlm-roberta": hf("XLMRobertaConfig", "XLMRobertaForMaskedLM", max_position_embeddings=130),
    "hf-mobilebert": hf("MobileBertConfig", "MobileBertForMaskedLM", embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2),
    "hf-t5-encoder": hf("T5Config", "T5EncoderModel", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
    # transformers: vision and audio.
    "hf-vit": hf_image("ViTConfig", "ViTForImageClassification", image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "hf-swin": hf_image("SwinConfig", "SwinForImageClassification", image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4),
    "hf-convnext": hf_image("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "hf-resnet": hf_image("ResNetConfig", "ResNetForImageClassification", hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], embedding_size=16),
    "hf-segformer": hf_image("SegformerConfig", "SegformerForSemanticSegmentation", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], decoder_hidden_size=64, num_attention_heads=[1, 2, 4, 8]),
    "hf-wav2vec2": (
        *hf_image("Wav2Vec2Config", "Wav2Vec2Model", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)[:1],
        [shape_spec((2, 4000), "f32")],
        "transformers",
    ),
    # torchvision.
    "tv-resnet18": tv("resnet18", num_classes=10),
    "tv-resnet50": tv("resnet50", num_classes=10),
    "tv-mobilenet-v2": tv("mobilenet_v2", num_classes=10),
    "tv-mobilenet-v3-small": tv("mobilenet_v3_small", num_classes=10),
    "tv-efficientnet-b0": tv("efficientnet_b0", num_classes=10),
    "tv-squeezenet": tv("squeezenet1_1", num_classes=10),
    "tv-shufflenet": tv("shufflenet_v2_x0_5", num_classes=10),
    "tv-mnasnet": tv("mnasnet0_5", num_classes=10),
    "tv-regnet": tv("regnet_y_400mf", num_classes=10),
    "tv-densenet121": tv("densenet121", num_classes=10),
    "tv-convnext-tiny": tv("convnext_tiny", num_classes=10),
    "tv-googlenet": tv("googlenet", num_classes=10, aux_logits=False, init_weights=False),
    "tv-vit": tv_class("torchvision.models.vision_transformer.VisionTransformer", (2, 3, 64, 64), image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10),
    "tv-swin": tv_class("torchvision.models.swin_transformer.SwinTransformer", (2, 3, 64, 64), patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=10),
    # timm.
    "timm-resnet10t": tm("resnet10t"),
    "timm-efficientnet-b0": tm("efficientnet_b0"),
    "timm-mobilenetv3": tm("mobilenetv3_small_050"),
    "timm-vit-tiny": tm("vit_tiny_patch16_224"),
    "timm-deit-tiny": tm("deit_tiny_patch16_224"),
    "timm-convnext-atto": tm("convnext_atto"),
    "timm-swin": tm("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1)),
    "timm-levit": tm("levit_128s"),
    "timm-poolformer": tm("poolformer_s12"),
    "timm-edgenext": tm("edgenext_xx_small"),
    "timm-mobilevit": tm("mobilevit_xxs", shape=(1, 3, 256, 256)),
    "timm-regnetx": tm("regnetx_002"),
    "timm-ghostnet": tm("ghostnet_100"),
    "timm-mixer": tm("mixer_s32_224"),
    "timm-resmlp": tm("resmlp_12_224"),
    "timm-repvgg": tm("repvgg_a0"),
    "timm-dla": tm("dla34"),
    "timm-lcnet": tm("lcnet_050"),
    "timm-fastvit": tm("fastvit_t8"),
    "timm-efficientformer": tm("efficientformer_l1"),
    "timm-pit": tm("pit_ti_224"),
    "timm-xcit": tm("xcit_nano_12_p16_224", depth=2),
    "timm-maxvit": tm("maxvit_nano_rw_256", shape=(1, 3, 256, 256)),
    "timm-nfnet": tm("nf_resnet26", shape=(1, 3, 128, 128)),
    "timm-coat": tm("coat_lite_tiny"),
    "timm-eva02": tm("eva02_tiny_patch14_224", depth=2),
}


# A held-out set of the same kind (other models and configurations), kept apart from the
# corpus the dry run was developed on: what the coverage is measured on.
HELD_OUT = {
    # transformers: other decoders and configs
    "hf-llama-eager": hf("LlamaConfig", "LlamaForCausalLM", attn_implementation="eager"),
    "hf-gpt2-eager": hf("GPT2Config", "GPT2LMHeadModel", n_embd=96, n_layer=3, n_head=6, n_positions=128, attn_implementation="eager"),
    "hf-qwen2-moe": hf("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "hf-persimmon": hf("PersimmonConfig", "PersimmonForCausalLM"),
    "hf-mpt": hf("MptConfig", "MptForCausalLM", d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128),
    "hf-ctrl": hf("CTRLConfig", "CTRLLMHeadModel", n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=128),
    "hf-gpt-neo": hf("GPTNeoConfig", "GPTNeoForCausalLM", num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=16),
    "hf-glm": hf("GlmConfig", "GlmForCausalLM", head_dim=16),
    "hf-helium": hf("HeliumConfig", "HeliumForCausalLM", head_dim=16),
    "hf-smollm3": hf("SmolLM3Config", "SmolLM3ForCausalLM"),
    "hf-exaone4": hf("Exaone4Config", "Exaone4ForCausalLM"),
    "hf-nemotron": hf("NemotronConfig", "NemotronForCausalLM", head_dim=16),
    # transformers: other encoders
    "hf-bert-big": hf("BertConfig", "BertForSequenceClassification", hidden_size=128, num_hidden_layers=3, intermediate_size=256),
    "hf-squeezebert": hf("SqueezeBertConfig", "SqueezeBertModel", embedding_size=64),
    "hf-ernie": hf("ErnieConfig", "ErnieModel"),
    "hf-roformer": hf("RoFormerConfig", "RoFormerModel", embedding_size=64),
    "hf-modernbert": hf("ModernBertConfig", "ModernBertModel", global_attn_every_n_layers=2, local_attention=16),
    # transformers: other vision
    "hf-beit": hf_image("BeitConfig", "BeitModel", image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "hf-dinov2": hf_image("Dinov2Config", "Dinov2Model", image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
    "hf-convnextv2": hf_image("ConvNextV2Config", "ConvNextV2Model", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "hf-mobilevit": hf_image("MobileViTConfig", "MobileViTModel", image_size=64),
    "hf-poolformer": hf_image("PoolFormerConfig", "PoolFormerModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "hf-regnet": hf_image("RegNetConfig", "RegNetModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], groups_width=8),
    # torchvision
    "tv-resnext50": tv("resnext50_32x4d", num_classes=10),
    "tv-wide-resnet50": tv("wide_resnet50_2", num_classes=10),
    "tv-mobilenet-v3-large": tv("mobilenet_v3_large", num_classes=10),
    "tv-efficientnet-v2-s": tv("efficientnet_v2_s", num_classes=10),
    "tv-regnet-x": tv("regnet_x_400mf", num_classes=10),
    "tv-inception-v3": tv("inception_v3", shape=(1, 3, 299, 299), num_classes=10, aux_logits=False, init_weights=False),
    "tv-maxvit": tv("maxvit_t", num_classes=10),
    "tv-swin-v2": tv("swin_v2_t", num_classes=10),
    "tv-alexnet": tv("alexnet", num_classes=10),
    # timm
    "timm-resnet50d": tm("resnet50d"),
    "timm-seresnext": tm("seresnext26d_32x4d"),
    "timm-mobilenetv2": tm("mobilenetv2_100"),
    "timm-convnextv2": tm("convnextv2_atto"),
    "timm-tiny-vit": tm("tiny_vit_5m_224"),
    "timm-cait": tm("cait_xxs24_224", depth=2),
    "timm-pvt-v2": tm("pvt_v2_b0"),
    "timm-twins": tm("twins_svt_small", depths=(1, 1, 1, 1)),
    "timm-rexnet": tm("rexnet_100"),
    "timm-hrnet": tm("hrnet_w18_small"),
    "timm-res2net": tm("res2net50_26w_4s"),
    "timm-gcvit": tm("gcvit_xxtiny"),
    "timm-mobilevitv2": tm("mobilevitv2_050", shape=(1, 3, 256, 256)),
    "timm-vovnet": tm("ese_vovnet19b_dw"),
    "timm-crossvit": tm("crossvit_tiny_240", shape=(1, 3, 240, 240)),
    "timm-efficientvit": tm("efficientvit_b0"),
    # Added with exported programs (.pt2), kept apart as the rest of this set.
    "hf-gemma3": hf("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, sliding_window=16),
    "hf-megatron-bert": hf("MegatronBertConfig", "MegatronBertModel"),
    "hf-camembert": hf("CamembertConfig", "CamembertModel"),
    "hf-deit": hf_image("DeiTConfig", "DeiTModel", image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "hf-swinv2": hf_image("Swinv2Config", "Swinv2Model", image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4),
    "hf-levit": hf_image("LevitConfig", "LevitModel", image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8]),
    "hf-mobilenet-v1": hf_image("MobileNetV1Config", "MobileNetV1Model", image_size=64, depth_multiplier=0.25),
    "hf-mobilenet-v2": hf_image("MobileNetV2Config", "MobileNetV2Model", image_size=64, depth_multiplier=0.35),
    "tv-resnet34": tv("resnet34", num_classes=10),
    "tv-vgg11": tv("vgg11", num_classes=10),
    "tv-efficientnet-b3": tv("efficientnet_b3", num_classes=10),
    "timm-mobileone": tm("mobileone_s0"),
    "timm-efficientnetv2": tm("tf_efficientnetv2_b0"),
    "timm-ghostnetv2": tm("ghostnetv2_100"),
}


def hf_full(config_cls, model_cls, shape, **kw):
    """A transformers model at its published size (the config's own defaults and `kw`)."""

    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(use_cache=False, **kw)
        return getattr(transformers, model_cls)(cfg).eval()

    return build, [shape_spec(shape, "i64")], "transformers"


# Decoders at full size, traced at the shape estimated: GPT-2 small (124,439,808
# parameters, published) and SmolLM2-135M's Llama configuration.
FULL_SIZE = {
    "hf-gpt2-124m": hf_full("GPT2Config", "GPT2LMHeadModel", (1, 1024)),
    "hf-smollm2-135m": hf_full(
        "LlamaConfig", "LlamaForCausalLM", (1, 1024), vocab_size=49152, hidden_size=576,
        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0,
        tie_word_embeddings=True),
}


def make_input(spec):
    shape, dtype = spec.split(":")
    dims = [int(d) for d in shape.split("x")]
    if dtype == "i64":
        return torch.randint(3, 900, dims, dtype=torch.int64)
    return torch.randn(dims)


def storage_bytes(tensors):
    seen = set()
    total = 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def graph_ops(traced):
    """The aten ops (`aten::name.overload`) the traced forward pass calls."""
    ops = set()

    def walk(block):
        for node in block.nodes():
            for b in node.blocks():
                walk(b)
            if node.kind().startswith("aten::"):
                try:
                    ops.add(node.schema().split("(", 1)[0])
                except RuntimeError:  # no schema (a special form)
                    ops.add(node.kind())

    walk(traced.inlined_graph)
    return sorted(ops)


def record_bytes(path):
    """Bytes of the file's tensor records: its variables' storages (data/N) and its
    graph constants' (constants/N)."""
    import zipfile

    sizes = {"data": 0, "constants": 0}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) == 3 and parts[1] in sizes and parts[2].isdigit():
                sizes[parts[1]] += info.file_size
    return sizes["data"], sizes["constants"]


def blank_row(name, exporting):
    """A model's row before its trace or export has filled it in."""
    _, inputs, package = MODELS[name]
    row = {"name": name, "package": package, "file": None, "inputs": inputs,
           "param_bytes": None, "buffer_bytes": None, "data_bytes": None,
           "constant_bytes": 0 if exporting else None, "ops": [], "error": None}
    if exporting:
        row["ir"] = None
    return row


def trace(name, out_dir):
    build, inputs, _ = MODELS[name]
    row = blank_row(name, exporting=False)
    try:
        model = build()
        row["param_bytes"] = storage_bytes(p for _, p in model.named_parameters())
        row["buffer_bytes"] = storage_bytes(b for _, b in model.named_buffers())
        xs = tuple(make_input(s) for s in inputs)
        with torch.no_grad():
            traced = torch.jit.trace(model, xs, strict=False, check_trace=False)
        path = os.path.join(out_dir, name + ".pt")
        traced.save(path)
        row["file"] = path
        row["ops"] = graph_ops(traced)
        row["data_bytes"], row["constant_bytes"] = record_bytes(path)
    except Exception as e:  # noqa: BLE001 - a model PyTorch cannot trace is reported
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if os.environ.get("CORPUS_DEBUG"):
            traceback.print_exc()
    return row


def archive_bytes(path):
    """Bytes of a .pt2 archive's tensor records: its weights' and constants' storages
    (data/weights/weight_N, data/constants/tensor_N), each stored once."""
    import zipfile

    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) == 4 and parts[1] == "data" and parts[2] in ("weights", "constants") \
                    and not parts[3].endswith(".json"):
                total += info.file_size
    return total


def export(name, out_dir):
    """The model as its users export it now: torch.export.export, saved with
    torch.export.save. The training IR is saved where it can be; a program that saves
    only after run_decompositions() (transformers' decoders build their causal mask
    under vmap, which the training IR keeps and torch.export.save refuses) is saved in
    core ATen. row["ir"] says which."""
    build, inputs, _ = MODELS[name]
    row = blank_row(name, exporting=True)
    try:
        model = build()
        row["param_bytes"] = storage_bytes(p for _, p in model.named_parameters())
        row["buffer_bytes"] = storage_bytes(b for _, b in model.named_buffers())
        xs = tuple(make_input(s) for s in inputs)
        ep = torch.export.export(model, xs, strict=False)
        path = os.path.join(out_dir, name + ".pt2")
        try:
            torch.export.save(ep, path)
            row["ir"] = "training"
        except Exception:  # noqa: BLE001 - the training IR does not save: core ATen
            torch.export.save(ep.run_decompositions({}), path)
            row["ir"] = "core-aten"
        row["file"] = path
        row["data_bytes"] = archive_bytes(path)
    except Exception as e:  # noqa: BLE001 - a model PyTorch cannot export is reported
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if os.environ.get("CORPUS_DEBUG"):
            traceback.print_exc()
    return row


def crashed_row(name, exporting, how):
    """The row of a model whose tracer or exporter crashed the process twice."""
    row = blank_row(name, exporting)
    verb = "exporting" if exporting else "tracing"
    row["error"] = f"Crash: PyTorch crashed {verb} it, twice ({how})"
    return row


class DiskFull(Exception):
    """The disk under the output folder has no room left for the files."""


# Below this much free space, a crash of a worker is taken for a full disk: PyTorch's
# archive writer aborts the process (`unexpected pos`) when a write falls short.
DISK_FULL_BELOW = 64 << 20


def disk_full(out_dir):
    """DiskFull naming the folder and its free space, when it is (nearly) full."""
    import shutil

    free = shutil.disk_usage(out_dir).free
    if free < DISK_FULL_BELOW:
        return DiskFull(f"corpus: no space left on the disk that holds {out_dir} "
                        f"({free >> 20} MiB free); free some and run it again")
    return None


def supervise(flags, out_dir, names, exporting):
    """Runs the models in a worker process (this script under CORPUS_WORKER=1), which
    appends a row a model to corpus.jsonl. A crash of PyTorch's tracer or exporter (an
    abort or a fatal signal, which no `except` catches) then costs one model, not the
    set: the first model without a row, if the worker had started it (it names the
    model it starts in DIR/started), is the one that crashed; it is tried once more
    (a crash of PyTorch can be a flake) and then reported as crashed, and a new worker
    goes on with the models after it. A worker that exits with an error status is a
    fault of this script and ends the run with that status."""
    import signal
    import subprocess

    rows = os.path.join(out_dir, "corpus.jsonl")
    started = os.path.join(out_dir, "started")
    open(rows, "w").close()
    tried = set()
    todo = list(names)
    env = dict(os.environ, CORPUS_WORKER="1")
    while todo:
        if os.path.exists(started):
            os.remove(started)
        worker = subprocess.run([sys.executable, os.path.abspath(__file__), *flags,
                                 "--out", out_dir, *todo], env=env)
        with open(rows) as f:
            done = {json.loads(line)["name"] for line in f if line.strip()}
        todo = [n for n in todo if n not in done]
        code = worker.returncode
        if code >= 0:
            if code == 0 and todo:
                print(f"corpus: the worker ended without rows for {todo}", file=sys.stderr)
                return 1
            return code
        full = disk_full(out_dir)
        if full is not None:
            raise full
        try:
            how = "killed by " + signal.Signals(-code).name
        except ValueError:
            how = f"killed by signal {-code}"
        if not todo:
            print(f"corpus: PyTorch crashed at exit ({how}), after every model's row",
                  file=sys.stderr)
            return 0
        name = todo[0]
        with open(started) if os.path.exists(started) else open(os.devnull) as f:
            if f.read() != name:
                print(f"corpus: the worker was {how} before it started {name}",
                      file=sys.stderr)
                return 1
        if name not in tried:
            tried.add(name)
            print(f"{name}: PyTorch crashed ({how}); trying it once more", file=sys.stderr)
            continue
        with open(rows, "a") as f:
            f.write(json.dumps(crashed_row(name, exporting, how)) + "\n")
        print(f"{name}: PyTorch crashed ({how}), twice", file=sys.stderr)
        todo = todo[1:]
    return 0


def cache_key(flags, names):
    """What the files depend on: this script, the Python, torch and the corpus's
    packages (their versions), the set and format, and the models asked for."""
    import hashlib
    from importlib import metadata

    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    parts = [sys.version, torch.__version__, *flags, *names]
    for package in ("transformers", "timm", "torchvision"):
        try:
            parts.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{package} missing")
    h.update("\0".join(parts).encode())
    return h.hexdigest()[:16]


def cached(cache_root, flags, out_dir, names, exporting):
    """supervise(), through a cache: the files of a run with the same cache_key are
    reused. A new entry is written in place and marked complete last, so a run killed
    halfway is redone; one with a crashed model is not kept. Either way the files are
    hard-linked (else copied) into DIR and DIR/corpus.jsonl names them there, so that
    nothing done to the cache later touches a run that read it. An entry replaces the
    older ones of its set, format and torch (those no run is writing), so the cache
    holds one entry of each."""
    import fcntl
    import shutil

    cache_root = os.path.abspath(cache_root)
    sets = [f.lstrip("-") for f in flags if f != "--pt2"] or ["corpus"]
    prefix = f"{'pt2' if exporting else 'pt'}-{sets[0]}-torch{torch.__version__}"
    entry = os.path.join(cache_root, f"{prefix}-{cache_key(flags, names)}")
    os.makedirs(cache_root, exist_ok=True)
    with open(entry + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        complete = os.path.join(entry, "complete")
        if os.path.exists(complete):
            print(f"corpus: {len(names)} models from the cache, {entry} "
                  "(same script, Python and packages)", file=sys.stderr)
        else:
            shutil.rmtree(entry, ignore_errors=True)
            os.makedirs(entry)
            code = supervise(flags, entry, names, exporting)
            if code != 0:
                return code
            with open(os.path.join(entry, "corpus.jsonl")) as f:
                crashed = any((json.loads(line)["error"] or "").startswith("Crash:")
                              for line in f if line.strip())
            if not crashed:
                open(complete, "w").close()
                evict(cache_root, prefix, entry)
        with open(os.path.join(entry, "corpus.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows:
            if row["file"]:
                mine = os.path.join(out_dir, os.path.basename(row["file"]))
                if os.path.exists(mine):
                    os.remove(mine)
                try:
                    os.link(row["file"], mine)
                except OSError:
                    shutil.copyfile(row["file"], mine)
                row["file"] = mine
    with open(os.path.join(out_dir, "corpus.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


def evict(cache_root, prefix, keep):
    """Removes the entries of `prefix` other than `keep` that no run holds the lock of
    (their lock files stay: removing one would let two runs lock the same entry)."""
    import fcntl
    import shutil

    for other in os.listdir(cache_root):
        stale = os.path.join(cache_root, other)
        if not other.startswith(prefix + "-") or len(other) != len(prefix) + 17 \
                or stale == keep:
            continue
        with open(stale + ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            shutil.rmtree(stale, ignore_errors=True)


def main(argv):
    flags = []
    exporting = argv[:1] == ["--pt2"]
    if exporting:
        flags.append(argv[0])
        argv = argv[1:]
    for flag, models in (("--held-out", HELD_OUT), ("--full-size", FULL_SIZE)):
        if argv[:1] == [flag]:
            MODELS.clear()
            MODELS.update(models)
            flags.append(argv[0])
            argv = argv[1:]
    if argv[:1] == ["--list"]:
        for name, (_, inputs, package) in MODELS.items():
            print(name, package, " ".join(inputs))
        return 0
    cache_root = None
    if argv[:1] == ["--cache"] and len(argv) >= 2:
        cache_root = argv[1]
        argv = argv[2:]
    if argv[:1] != ["--out"] or len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = argv[1]
    names = argv[2:] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"corpus: no model {unknown[0]!r} (see --list)", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    if cache_root is not None:
        return cached(cache_root, flags, out_dir, names, exporting)
    if not os.environ.get("CORPUS_WORKER"):
        return supervise(flags, out_dir, names, exporting)
    if not exporting:
        hf_patch()
    with open(os.path.join(out_dir, "corpus.jsonl"), "a") as f:
        for name in names:
            with open(os.path.join(out_dir, "started"), "w") as mark:
                mark.write(name)
            row = export(name, out_dir) if exporting else trace(name, out_dir)
            f.write(json.dumps(row) + "\n")
            f.flush()
            status = row["error"] or ("exported (" + row["ir"] + ")" if exporting else "traced")
            print(f"{name}: {status}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    import errno

    try:
        sys.exit(main(sys.argv[1:]))
    except DiskFull as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        print(f"corpus: no space left on the disk ({e.filename or 'writing the files'}); "
              "free some and run it again", file=sys.stderr)
        sys.exit(2)
