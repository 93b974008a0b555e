// TorchScript files. For the dry run, a file is loaded straight onto the meta device
// (the weights' bytes are read from the file and dropped), its scalar constants kept on
// the CPU with their values (a traced `size // heads` divides by one); a forward that
// fails names the module it failed in. For both recorders, the module path of the
// TorchScript op running on a thread, read from the interpreter's module hierarchy.

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/import_read.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "../dryrun/dryrun.h"
#include "../program/program.h"
#include "script.h"

namespace memprof {
namespace {
// The module path in one entry of the interpreter's module hierarchy: entries read
// `TOP(ResNet)::forward` (the root), `layer4(Sequential)::forward`, `0(BasicBlock)::forward`,
// `SELF(Conv2d)::_conv_forward` (a method of the module above), `::relu` or
// `CALL_FUNCTION::relu` (free functions). Appends `.instance` to buf (at `*len`) for a
// submodule entry; false when the path does not fit.
inline bool append_instance(const std::string& entry, char* buf, size_t cap, size_t* len) {
  const size_t paren = entry.find('(');
  const size_t colons = entry.find("::");
  if (paren == std::string::npos || paren == 0 || (colons != std::string::npos && colons < paren)) {
    return true;  // a free function: no module
  }
  const char* name = entry.data();
  if ((paren == 4 && std::strncmp(name, "SELF", 4) == 0) ||
      (paren == 3 && std::strncmp(name, "TOP", 3) == 0) ||
      (paren == 21 && std::strncmp(name, "INSTANCE_NAME_UNKNOWN", 21) == 0)) {
    return true;
  }
  const size_t sep = *len > 0 ? 1 : 0;
  if (*len + sep + paren >= cap) {
    return false;
  }
  if (sep) {
    buf[(*len)++] = '.';
  }
  std::memcpy(buf + *len, name, paren);
  *len += paren;
  buf[*len] = 0;
  return true;
}

// Whether this thread runs TorchScript now; if so, *layer1 gets the name id + 1 of the
// innermost module's path (0 for the root module's own ops, or a path that does not fit
// a name). Costs one call returning an empty vector when no TorchScript runs.
}  // namespace

bool script_module_path(char* buf, size_t cap, bool* fits) {
  if (program_module_path(buf, cap, fits)) {
    return true;  // an exported program's node: its module stack names the path
  }
  const std::vector<std::string> frames = torch::jit::currentModuleHierarchy();
  if (frames.empty()) {
    return false;
  }
  // The module path of the last op on this thread that had one.
  thread_local std::string last;
  size_t len = 0;
  buf[0] = 0;
  *fits = true;
  // An op of an autodiff subgraph's forward (the optimized graph's `<forward op>`) that
  // an optimization pass made (a dropout's native_dropout, from its gradient formula)
  // carries no call stack: it takes the module of the op before it, which the node it
  // replaced followed in the graph.
  if (frames.size() == 1 && frames[0].find("<forward op>") != std::string::npos) {
    *fits = last.size() < cap;
    if (*fits) {
      std::memcpy(buf, last.c_str(), last.size() + 1);
    }
    return true;
  }
  // The first entry is the root module (TOP) or the function the interpreter was given.
  for (size_t k = 1; k < frames.size() && *fits; ++k) {
    *fits = append_instance(frames[k], buf, cap, &len);
  }
  if (*fits) {
    last.assign(buf, len);
  }
  return true;
}

namespace {
// The index N of a constant node compiled from `CONSTANTS.cN` in the file's code.
int64_t constant_index(const torch::jit::Node* n) {
  const std::string text = n->sourceRange().source() ? n->sourceRange().text().str() : std::string();
  const std::string prefix = "CONSTANTS.c";
  const auto at = text.rfind(prefix);
  if (at == std::string::npos) {
    return -1;
  }
  int64_t index = 0;
  size_t k = at + prefix.size();
  if (k == text.size()) {
    return -1;
  }
  for (; k < text.size() && text[k] >= '0' && text[k] <= '9'; ++k) {
    index = index * 10 + (text[k] - '0');
  }
  return k == text.size() ? index : -1;
}

void restore_scalars(torch::jit::Block* block, const std::vector<at::Tensor>& values) {
  for (torch::jit::Node* n : block->nodes()) {
    for (torch::jit::Block* b : n->blocks()) {
      restore_scalars(b, values);
    }
    if (n->kind() != c10::prim::Constant || !n->hasAttribute(c10::attr::value) ||
        n->kindOf(c10::attr::value) != torch::jit::AttributeKind::t) {
      continue;
    }
    const at::Tensor& now = n->t(c10::attr::value);
    const int64_t i = constant_index(n);
    if (!now.is_meta() || now.dim() != 0 || i < 0 || size_t(i) >= values.size()) {
      continue;
    }
    const at::Tensor& saved = values[size_t(i)];
    if (saved.defined() && saved.dim() == 0 && saved.scalar_type() == now.scalar_type()) {
      n->t_(c10::attr::value, saved);
    }
  }
}

// Loading onto the meta device drops every tensor's values, the file's constants' too.
// A traced model computes sizes with its scalar constants (`C // heads` becomes
// `aten::floor_divide(C, {4})` then `aten::Int`), which needs their values: they are
// read again from the file's constants on the CPU (scalars only: larger constants stay
// on the meta device with the weights) and put back into the graphs.
void restore_scalar_constants(torch::jit::Module& m, const std::string& path) {
  std::vector<at::Tensor> values;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord("constants.pkl")) {
      return;
    }
    const c10::IValue table = torch::jit::readArchiveAndTensors(
        "constants", "", "", std::nullopt, std::nullopt, c10::Device(c10::kCPU), reader);
    if (!table.isTuple()) {
      return;
    }
    for (const c10::IValue& v : table.toTupleRef().elements()) {
      values.push_back(v.isTensor() && v.toTensor().dim() == 0 ? v.toTensor() : at::Tensor());
    }
  } catch (const std::exception&) {
    return;  // constants this reader cannot read: the dry run says where a value was missing
  }
  for (const torch::jit::Module& sub : m.modules()) {
    for (const torch::jit::Method& method : sub.get_methods()) {
      restore_scalars(method.graph()->block(), values);
    }
  }
}

// A use of a device constant that moves a scalar constant whose value was read back
// (`torch.to(CONSTANTS.c0, torch.device("cpu"), 6)`, Gemma's embedding scale): the
// optimized graph needs that value (constant propagation folds the `to`, then
// CanonicalizeOps turns `mul(x, <0-dim constant>)` into `mul(x, <its item()>)`), so the
// device becomes the CPU, where the value is. Nothing is lost: a file traced on the CPU
// keeps the scalar there in the real run too, and on a GPU `to` returns the constant,
// already there since the file was loaded (512 bytes no estimate counts).
bool scalar_to_cpu(const torch::jit::Use& use) {
  const torch::jit::Node* n = use.user;
  if (n->kind() != c10::aten::to || use.offset == 0 || n->inputs().empty()) {
    return false;
  }
  const torch::jit::Node* src = n->input(0)->node();
  return src->kind() == c10::prim::Constant && src->hasAttribute(c10::attr::value) &&
      src->kindOf(c10::attr::value) == torch::jit::AttributeKind::t &&
      src->t(c10::attr::value).dim() == 0 && !src->t(c10::attr::value).is_meta();
}

// A use of a device constant that moves one of the file's tensor constants
// (`torch.to(CONSTANTS.c0, torch.device("cpu"), 6)`): a constant the file makes into a
// CPU scalar (`torch.tensor([...]).sum()` scaling a GPU tensor) runs on a GPU too, so it
// is not counted among the ops that stop a GPU run.
bool constant_to(const torch::jit::Use& use) {
  const torch::jit::Node* n = use.user;
  return n->kind() == c10::aten::to && use.offset != 0 && !n->inputs().empty() &&
      n->input(0)->node()->kind() == c10::prim::Constant;
}

// A traced or scripted graph names the device it was made on as constants:
// `aten::to(x, dtype, device=cpu)` in rotary embeddings, `aten::arange(..., device=cpu)`
// for position ids, `aten::zeros(..., device=cuda:0)` for masks. In the dry run every
// device the graph names is the dry run's: each device constant becomes `meta`, so
// what the graph makes on "its" device is made on meta, as it would be on the GPU; but
// a device used only to move scalar constants read back becomes the CPU (scalar_to_cpu).
// Each other op a `cpu` constant feeds (but constant_to's) is added to `cpu_uses`: a
// file traced on the CPU makes those ops' tensors on the CPU when it runs on a GPU,
// where they meet the GPU's ("Expected all tensors to be on the same device"; what the
// estimate says of it).
// Returns how many constants were rewritten.
size_t devices_to_meta(torch::jit::Block* block, std::vector<std::string>& cpu_uses) {
  size_t n = 0;
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* b : node->blocks()) {
      n += devices_to_meta(b, cpu_uses);
    }
    if (node->kind() != c10::prim::Constant || node->outputs().size() != 1 ||
        !node->hasAttribute(c10::attr::value) ||
        node->output()->type()->kind() != c10::TypeKind::DeviceObjType) {
      continue;
    }
    const auto& uses = node->output()->uses();
    if (node->kindOf(c10::attr::value) == torch::jit::AttributeKind::s && !uses.empty() &&
        std::all_of(uses.begin(), uses.end(), scalar_to_cpu)) {
      if (node->s(c10::attr::value) != "cpu") {
        node->s_(c10::attr::value, "cpu");
        ++n;
      }
      continue;
    }
    if (node->kindOf(c10::attr::value) == torch::jit::AttributeKind::s &&
        node->s(c10::attr::value) != "meta") {
      if (node->s(c10::attr::value) == "cpu") {
        for (const torch::jit::Use& use : uses) {
          if (!constant_to(use)) {
            cpu_uses.emplace_back(use.user->kind().toQualString());
          }
        }
      }
      node->s_(c10::attr::value, "meta");
      ++n;
    }
  }
  return n;
}

// The ops a `cpu` device constant feeds, sorted, each once.
std::vector<std::string> graph_devices_to_meta(torch::jit::Module& m) {
  std::vector<std::string> cpu_uses;
  for (const torch::jit::Module& sub : m.modules()) {
    for (const torch::jit::Method& method : sub.get_methods()) {
      devices_to_meta(method.graph()->block(), cpu_uses);
    }
  }
  std::sort(cpu_uses.begin(), cpu_uses.end());
  cpu_uses.erase(std::unique(cpu_uses.begin(), cpu_uses.end()), cpu_uses.end());
  return cpu_uses;
}

// A loaded file: the module, and what its graph made on the CPU before the dry run's
// devices became meta.
struct Script {
  torch::jit::Module module;
  std::vector<std::string> cpu_uses;
};

torch::jit::Module* module_of(void* m) {
  return &static_cast<Script*>(m)->module;
}
}  // namespace

void* script_load(const char* path) {
  // Without the debug files, each node's source range is the file's own code, where a
  // constant reads `CONSTANTS.cN` (restore_scalar_constants matches them by it).
  torch::jit::ExtraFilesMap extra;
  auto m = torch::jit::load(std::string(path), c10::Device(c10::kMeta), extra,
                            /*load_debug_files=*/false);
  restore_scalar_constants(m, path);
  std::vector<std::string> cpu_uses = graph_devices_to_meta(m);
  return new Script{std::move(m), std::move(cpu_uses)};
}

void script_free(void* m) {
  delete static_cast<Script*>(m);
}

std::string script_cpu_uses(void* m) {
  std::string text;
  for (const std::string& op : static_cast<Script*>(m)->cpu_uses) {
    text += op;
    text += '\n';
  }
  return text;
}

void script_train(void* m, bool on) {
  module_of(m)->train(on);
}

namespace {
// How many spatial dimensions a convolution node has: the length of its stride list.
size_t spatial_dims(const torch::jit::Node* conv) {
  if (conv->inputs().size() < 4) {
    return 0;
  }
  const torch::jit::Value* stride = conv->input(3);
  if (stride->node()->kind() == c10::prim::ListConstruct) {
    return stride->node()->inputs().size();
  }
  const auto v = torch::jit::toIValue(stride);
  return v.has_value() && v->isIntList() ? v->toIntList().size() : 0;
}
}  // namespace

int32_t script_input_kind(void* m) {
  auto* mod = module_of(m);
  const auto method = mod->find_method("forward");
  if (!method.has_value()) {
    return MP_INPUT_UNKNOWN;
  }
  std::shared_ptr<torch::jit::Graph> g = method->graph()->copy();
  torch::jit::Inline(*g);
  if (g->inputs().size() < 2) {
    return MP_INPUT_UNKNOWN;  // self only
  }
  // Breadth first from the first input through the tensors made from it: the first
  // embedding that takes it as indices, or convolution that takes it as input, says.
  std::vector<torch::jit::Value*> todo{g->inputs()[1]};
  std::unordered_set<torch::jit::Value*> seen{g->inputs()[1]};
  for (size_t i = 0; i < todo.size() && i < 4096; ++i) {
    for (const torch::jit::Use& use : todo[i]->uses()) {
      torch::jit::Node* n = use.user;
      const c10::Symbol k = n->kind();
      if (k == c10::aten::embedding && use.offset == 1) {
        return MP_INPUT_TOKENS;
      }
      if ((k == c10::aten::_convolution || k == c10::aten::conv2d) && use.offset == 0) {
        return spatial_dims(n) == 2 ? MP_INPUT_IMAGES : MP_INPUT_UNKNOWN;
      }
      for (torch::jit::Value* out : n->outputs()) {
        if (out->type()->kind() == c10::TypeKind::TensorType && seen.insert(out).second) {
          todo.push_back(out);
        }
      }
    }
  }
  return MP_INPUT_UNKNOWN;
}

void script_fresh(void* m) {
  auto* mod = module_of(m);
  *mod = mod->clone(/*inplace=*/true);
}

at::Tensor* script_forward(void* m, const at::Tensor* const* inputs, size_t n, bool optimize) {
  std::vector<c10::IValue> args;
  args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    args.emplace_back(*inputs[i]);
  }
  char* module = dry_run_module_buf();
  module[0] = 0;
  c10::IValue out;
  try {
    // As tch runs the file (optimize): the profiling graph executor's first call
    // profiles, the next run its optimized graph, where a training forward runs as
    // autodiff subgraphs that keep other tensors for backward than the ops as written
    // (a dropout becomes native_dropout, its output and mask kept even at p=0); on an
    // H200 a traced Swin-T's training peak was that graph's, 30% above the ops as
    // written. No fusion happens on meta tensors. Or as written, op by op (this thread
    // only), as after tch::jit::set_graph_executor_optimize(false).
    torch::jit::GraphOptimizerEnabledGuard executor(optimize);
    out = module_of(m)->forward(std::move(args));
  } catch (const c10::Error& e) {
    // Name the module the failing op ran in (`in module blocks.0.attn: ...`).
    if (meta_trace_on() && module[0] != 0) {
      TORCH_CHECK(false, "in module ", module, ": ", e.what_without_backtrace());
    }
    throw;
  }
  // The first tensor of what forward returns (a tensor, or a tuple/list/dict holding one).
  std::vector<c10::IValue> todo{out};
  while (!todo.empty()) {
    c10::IValue v = std::move(todo.back());
    todo.pop_back();
    if (v.isTensor()) {
      return new at::Tensor(v.toTensor());
    }
    if (v.isTuple()) {
      const auto& elems = v.toTupleRef().elements();
      for (size_t k = elems.size(); k-- > 0;) {
        todo.push_back(elems[k]);
      }
    } else if (v.isList()) {
      const auto list = v.toListRef();
      for (size_t k = list.size(); k-- > 0;) {
        todo.push_back(list[k]);
      }
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict()) {
        todo.insert(todo.begin(), kv.value());
      }
    }
  }
  TORCH_CHECK(false, "the module's forward returned no tensor");
}

// Parameters (which = 0) or buffers (1) of a module, recursively, in the module's order.
std::vector<std::pair<std::string, at::Tensor>> script_tensors(void* m, int32_t which) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto* mod = module_of(m);
  if (which == 0) {
    for (const auto& p : mod->named_parameters(/*recurse=*/true)) {
      out.emplace_back(p.name, p.value);
    }
  } else {
    for (const auto& b : mod->named_buffers(/*recurse=*/true)) {
      out.emplace_back(b.name, b.value);
    }
  }
  return out;
}

// What memprof_script_tensor hands back: the count of `which`'s tensors in *n and, when
// `index` is below it, that tensor (a new handle) and its name.
int script_tensor(void* m, int32_t which, uint64_t index, uint64_t* n, void** tensor,
                  char* name_buf, size_t len, uint64_t* name_len) {
  auto all = script_tensors(m, which);
  *n = all.size();
  if (index >= all.size()) {
    return 0;
  }
  if (!given(tensor, "memprof_script_tensor") || !given(name_len, "memprof_script_tensor")) {
    return -1;
  }
  const std::string& name = all[index].first;
  *name_len = name.size();
  if (name_buf && len > 0) {
    const size_t k = std::min(len - 1, name.size());
    std::memcpy(name_buf, name.data(), k);
    name_buf[k] = 0;
  }
  *tensor = new at::Tensor(all[index].second);
  return 0;
}

}  // namespace memprof
