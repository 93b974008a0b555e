// cuDNN's convolution workspaces as measured: the bytes a CUDA convolution (or its
// backward) took and freed inside the call, for each convolution a GPU was measured
// running (cudnn.benchmark off, PyTorch's default: cuDNN's heuristics pick the plan from
// the call's shapes, dtypes and layouts and the device). The table comes from the Rust
// side for the GPU estimated for (estimate/gpu.rs; empty for a GPU not measured); the
// convolution kernels (kernels.cpp) look each call up by its arguments, written as the
// measuring script wrote them, and charge the rule's larger plausible size on a miss.

#include <ATen/ATen.h>

#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "dryrun.h"

namespace memprof {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, ConvWorkspace> g_table;

// PyTorch's name of a dtype, as `str(tensor.dtype)` writes it without `torch.`.
const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return nullptr;
  }
}

void put_dims(std::string& key, at::IntArrayRef dims, char sep) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) {
      key += sep;
    }
    key += std::to_string(dims[i]);
  }
}

// `T32x64x56x56:float32:200704x3136x56x1`; false for a dtype no measurement has.
bool put_tensor(std::string& key, const at::Tensor& t) {
  const char* dtype = dtype_name(t.scalar_type());
  if (dtype == nullptr) {
    return false;
  }
  key += 'T';
  put_dims(key, t.sizes(), 'x');
  key += ':';
  key += dtype;
  key += ':';
  put_dims(key, t.strides(), 'x');
  key += ' ';
  return true;
}

// `[1 1]`.
void put_list(std::string& key, at::IntArrayRef v) {
  key += '[';
  put_dims(key, v, ' ');
  key += "] ";
}

const char* py_bool(bool b) {
  return b ? "True" : "False";
}

// stride, padding, dilation, transposed, output padding, groups.
void put_params(std::string& key, const ConvParams& p) {
  put_list(key, p.stride);
  put_list(key, p.padding);
  put_list(key, p.dilation);
  key += py_bool(p.transposed);
  key += ' ';
  put_list(key, p.output_padding);
  key += std::to_string(p.groups);
}

std::optional<ConvWorkspace> find(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_table.find(key);
  if (it == g_table.end()) {
    return std::nullopt;
  }
  return it->second;
}

// The tab-separated numbers of a line after its key: the most held at once, then, where
// the line has them, the data and weight gradients' workspace requests.
ConvWorkspace parse_bytes(const std::string& fields) {
  ConvWorkspace w;
  size_t used = 0;
  w.held = std::stoll(fields, &used);
  if (used < fields.size() && fields[used] == '\t') {
    const std::string rest = fields.substr(used + 1);
    w.data = std::stoll(rest, &used);
    w.weight = std::stoll(rest.substr(used + 1));
  }
  return w;
}

}  // namespace

void set_conv_workspaces(const char* table, size_t len) {
  // A line a call: `key\tbytes\n`, or `key\tbytes\tdata\tweight\n` for a backward
  // call whose requests are known. Parsed whole before it replaces the table (a bad
  // number throws, the caller's error, and leaves the old table).
  std::unordered_map<std::string, ConvWorkspace> parsed;
  size_t at = 0;
  while (table != nullptr && at < len) {
    const char* line = table + at;
    const void* nl = memchr(line, '\n', len - at);
    const size_t n = nl ? size_t(static_cast<const char*>(nl) - line) : len - at;
    const void* tab = memchr(line, '\t', n);
    if (tab != nullptr) {
      const size_t k = size_t(static_cast<const char*>(tab) - line);
      parsed[std::string(line, k)] = parse_bytes(std::string(line + k + 1, n - k - 1));
    }
    at += n + 1;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_table.swap(parsed);
}

std::optional<int64_t> measured_conv_workspace(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    const ConvParams& params) {
  std::string key = "convolution ";
  if (!put_tensor(key, input) || !put_tensor(key, weight)) {
    return std::nullopt;
  }
  if (bias.has_value() && bias->defined()) {
    if (!put_tensor(key, *bias)) {
      return std::nullopt;
    }
  } else {
    key += "None ";
  }
  put_params(key, params);
  const auto found = find(key);
  return found ? std::optional<int64_t>(found->held) : std::nullopt;
}

std::optional<ConvWorkspace> measured_conv_backward_workspace(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvParams& params,
    std::array<bool, 3> mask) {
  std::string key = "convolution_backward ";
  if (!put_tensor(key, grad_output) || !put_tensor(key, input) || !put_tensor(key, weight)) {
    return std::nullopt;
  }
  put_params(key, params);
  key += " [";
  key += py_bool(mask[0]);
  key += ' ';
  key += py_bool(mask[1]);
  key += ' ';
  key += py_bool(mask[2]);
  key += ']';
  return find(key);
}

}  // namespace memprof
