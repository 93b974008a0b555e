// scaled_dot_product_attention in the estimator's dry run, as PyTorch 2.11's CUDA build
// runs it, and meta kernels for the fused attention ops CUDA would run.
//
// On CUDA, `scaled_dot_product_attention` (aten/src/ATen/native/transformers/attention.cpp)
// asks `select_sdp_backend` (transformers/cuda/sdp_utils.cpp) for a backend and calls the
// fused op of that backend. On meta, libtorch answers "math" and materialises the
// batch x heads x L x S scores. While a dry run is on, the kernel below (registered on
// AutogradMeta, where it wins over the composite kernel) takes the backend CUDA would
// take for the dry run's GPU (compute capability), or the one forced by the estimate's
// options, and calls the fused op as attention.cpp does, so that autograd saves what CUDA
// saves. Outside a dry run it runs the composite kernel, as before.
//
// The rules are those of the 2.11 wheel built for CUDA 13.0 with cuDNN 9.19 (its
// libtorch_cuda.so was checked for which checks exist: no pointer-alignment check for the
// memory-efficient kernel, no grouped-query support in it, no cuDNN 65535 batch limit).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/scaled_dot_product_attention_compositeimplicitautograd_dispatch.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "dryrun.h"

namespace memprof {
namespace {

std::atomic<int32_t> g_sm{80};
std::atomic<int32_t> g_backend{MP_ATTN_AUTO};
std::atomic<uint64_t> g_runs[4];

const char* backend_name(int32_t b) {
  switch (b) {
    case MP_ATTN_FLASH:
      return "flash";
    case MP_ATTN_EFFICIENT:
      return "efficient";
    case MP_ATTN_CUDNN:
      return "cudnn";
    case MP_ATTN_MATH:
      return "math";
    default:
      return "auto";
  }
}

struct Sdp {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  const std::optional<at::Tensor>& mask;
  double dropout;
  bool is_causal;
  bool enable_gqa;
  int sm;  // major * 10 + minor
  int major() const { return sm / 10; }
  int minor() const { return sm % 10; }
  bool has_mask() const { return mask.has_value() && mask->defined(); }
};

std::string str(int64_t v) {
  return std::to_string(v);
}

// sdp_utils_cpp.h: input_requires_grad.
bool input_requires_grad(const Sdp& p) {
  return (p.q.requires_grad() || p.k.requires_grad() || p.v.requires_grad()) &&
         at::GradMode::is_enabled();
}

// sdp_utils_cpp.h: check_tensor_shapes.
std::string tensor_shapes(const Sdp& p) {
  if (p.q.dim() == 4 && p.k.dim() == 4 && p.v.dim() == 4) {
    return "";
  }
  return "query, key and value must be 4-D (got " + str(p.q.dim()) + "-D query)";
}

// sdp_utils_cpp.h: check_tensor_dtype.
std::string dtypes(const Sdp& p, std::initializer_list<at::ScalarType> allowed, const char* what) {
  const auto t = p.q.scalar_type();
  bool ok = t == p.k.scalar_type() && t == p.v.scalar_type();
  bool in = false;
  for (auto a : allowed) {
    in = in || a == t;
  }
  if (ok && in) {
    return "";
  }
  return std::string("it needs query, key and value of dtype ") + what + " (got " +
         c10::toString(t) + ")";
}

// sdp_utils_cpp.h: check_batch_size_and_num_heads_dense<supports_gqa, requires_same_num_heads>
// with check_grouped_query_attention.
std::string batch_and_heads(const Sdp& p, bool supports_gqa, bool requires_same_num_heads) {
  const int64_t qh = p.q.size(-3), kh = p.k.size(-3), vh = p.v.size(-3);
  if (!(p.q.size(0) == p.k.size(0) && p.q.size(0) == p.v.size(0))) {
    return "it needs query, key and value of the same batch size";
  }
  if (p.enable_gqa && supports_gqa) {
    if (requires_same_num_heads && kh != vh) {
      return "it needs key and value with the same number of heads";
    }
    if (qh % kh != 0 || (!requires_same_num_heads && qh % vh != 0)) {
      return "the heads of key/value must divide the heads of query";
    }
    return "";
  }
  if (!(qh == kh && qh == vh)) {
    return p.enable_gqa ? "it does not support grouped-query attention (enable_gqa with "
                          "fewer key/value heads)"
                        : "it needs query, key and value with the same number of heads";
  }
  return "";
}

// sdp_utils_cpp.h: check_nonzero_sequence_lengths_dense.
std::string nonzero_seq(const Sdp& p) {
  return (p.q.size(-2) == 0 || p.k.size(-2) == 0) ? "a sequence length is 0" : "";
}

// sdp_utils_cpp.h: check_last_dim_stride_equals_1_dense<ignore_singleton_dim> (GPU: the
// mask's last stride too).
std::string last_dim_stride(const Sdp& p, bool ignore_singleton) {
  bool ok = p.q.stride(-1) == 1 && p.k.stride(-1) == 1 && p.v.stride(-1) == 1;
  if (ignore_singleton) {
    ok = ok || p.q.size(-1) == 1;
  }
  const bool mask_ok = !p.has_mask() || p.mask->stride(-1) == 1;
  return (ok && mask_ok) ? "" : "it needs a last dimension of stride 1";
}

bool sm_in(const Sdp& p, int lo, int hi) {
  return p.sm >= lo && p.sm <= hi;
}

// sdp_utils.cpp: can_use_flash_attention.
std::string flash_why_not(const Sdp& p) {
  std::string w = tensor_shapes(p);
  if (!w.empty()) return w;
  if (p.has_mask()) return "flash attention does not take an attn_mask";  // check_for_attn_mask
  // check_head_dim_size_flash: q, k, v last dims equal and <= 256.
  const int64_t d = p.q.size(-1);
  if (!(d == p.k.size(-1) && d == p.v.size(-1) && d <= 256)) {
    return "it needs q, k, v of the same head size, at most 256 (got " + str(d) + ", " +
           str(p.k.size(-1)) + ", " + str(p.v.size(-1)) + ")";
  }
  // check_flash_attention_hardware_support: [sm80, sm121].
  if (!sm_in(p, 80, 121)) {
    return "it needs compute capability 8.0 to 12.1 (this GPU: " + str(p.major()) + "." +
           str(p.minor()) + ")";
  }
  // check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120.
  if (input_requires_grad(p) && (sm_in(p, 86, 89) || sm_in(p, 120, 121))) {
    const bool supported = d <= 192 || (p.dropout <= 0.0 && d > 224);
    if (!supported) {
      return "it cannot train with head size " + str(d) +
             " on compute capability 8.6-8.9 or 12.x (192 < d <= 224, or > 224 with dropout)";
    }
  }
  // check_flash_causal_non_square_seqlens.
  if (p.is_causal && p.q.size(-2) != p.k.size(-2)) {
    return "it does not take is_causal with different query and key lengths";
  }
  // check_dtypes_flash_attention (FA3 off by default) -> check_dtypes_low_precision.
  w = p.major() >= 8 ? dtypes(p, {at::kHalf, at::kBFloat16}, "f16 or bf16")
                     : dtypes(p, {at::kHalf}, "f16");
  if (!w.empty()) return w;
  w = batch_and_heads(p, true, true);
  if (!w.empty()) return w;
  w = nonzero_seq(p);
  if (!w.empty()) return w;
  return last_dim_stride(p, true);
}

// sdp_utils.cpp: minimum_gemm_alignment (with use_tensor_cores).
int64_t minimum_gemm_alignment(const Sdp& p) {
  const bool is_half = p.q.scalar_type() == at::kHalf || p.q.scalar_type() == at::kBFloat16;
  const bool use_tc = p.major() >= 8 ? true : (p.major() >= 7 ? is_half : false);
  int64_t align = p.major() >= 8 ? 4 : 1;
  if (use_tc) {
    align = std::max<int64_t>(align, 128 / (is_half ? 16 : 32));
  }
  return align;
}

// sdp_utils.cpp: can_use_mem_efficient_attention.
std::string efficient_why_not(const Sdp& p) {
  // check_mem_efficient_hardware_support: [sm50, sm121].
  if (!sm_in(p, 50, 121)) {
    return "it needs compute capability 5.0 to 12.1";
  }
  std::string w = tensor_shapes(p);
  if (!w.empty()) return w;
  // check_head_dim_size_mem_efficient.
  const int64_t a = minimum_gemm_alignment(p);
  const int64_t dq = p.q.size(-1), dv = p.v.size(-1);
  if (!(dq == p.k.size(-1) && dq % a == 0 && dq > 0 && dv % a == 0 && dv > 0)) {
    return "it needs head sizes divisible by " + str(a) + " (got " + str(dq) + ", " +
           str(p.k.size(-1)) + ", " + str(dv) + ")";
  }
  w = nonzero_seq(p);
  if (!w.empty()) return w;
  w = last_dim_stride(p, false);
  if (!w.empty()) return w;
  w = batch_and_heads(p, false, true);
  if (!w.empty()) return w;
  return p.major() >= 8 ? dtypes(p, {at::kHalf, at::kFloat, at::kBFloat16}, "f16, f32 or bf16")
                        : dtypes(p, {at::kHalf, at::kFloat}, "f16 or f32");
}

// sdp_utils_cpp.h: check_attn_mask_shape.
std::string mask_shape(const Sdp& p) {
  if (!p.has_mask()) return "";
  const auto& m = *p.mask;
  const char* bad = "it needs an attn_mask of shape (L, S) or (B|1, H|1, L|1, S|1)";
  if (m.requires_grad()) return "it does not take an attn_mask that requires grad";
  if (m.size(-2) != p.q.size(2) && m.size(-2) != 1) return bad;
  if (m.size(-1) != p.k.size(2) && m.size(-1) != 1) return bad;
  if (m.dim() == 2) return "";
  if (m.dim() == 4 && (m.size(0) == 1 || m.size(0) == p.q.size(0)) &&
      (m.size(1) == 1 || m.size(1) == p.q.size(1))) {
    return "";
  }
  return bad;
}

// sdp_utils.cpp: can_use_cudnn_attention (cuDNN 9.19: no version gate applies).
std::string cudnn_why_not(const Sdp& p) {
  std::string w = tensor_shapes(p);
  if (!w.empty()) return w;
  w = p.major() >= 8 ? dtypes(p, {at::kHalf, at::kBFloat16}, "f16 or bf16")
                     : dtypes(p, {at::kHalf}, "f16");
  if (!w.empty()) return w;
  w = mask_shape(p);
  if (!w.empty()) return w;
  if (!sm_in(p, 80, 121)) {  // check_cudnn_hardware_support
    return "it needs compute capability 8.0 to 12.1";
  }
  w = nonzero_seq(p);
  if (!w.empty()) return w;
  w = last_dim_stride(p, true);
  if (!w.empty()) return w;
  w = batch_and_heads(p, true, false);
  if (!w.empty()) return w;
  // check_cudnn_tensor_shapes: head size limit 128, 256 on sm90 (cuDNN >= 9.10), 192/128
  // on sm10x; multiples of 8; key length not 1; query length not 1 with dropout.
  const int64_t dqk = p.q.size(3), dv = p.v.size(3);
  int64_t limit = 128;
  if (p.sm == 90) limit = 256;
  if (p.major() == 10 && dqk == 192 && dv == 128) limit = 192;
  if (dqk > limit || dv > limit) {
    return "it needs head sizes of at most " + str(limit) + " on this GPU (got " + str(dqk) +
           ")";
  }
  if (dqk % 8 != 0 || dv % 8 != 0) return "it needs head sizes that are multiples of 8";
  if (p.k.size(2) == 1) return "it does not take a key length of 1";
  if (p.dropout != 0.0 && p.q.size(2) == 1) return "it does not take dropout with a query length of 1";
  return "";
}

// sdp_utils.cpp: check_prefer_cudnn_attention (cuDNN > 9.15, compute capability 9.x or
// 10.x with minor 0 or 3): then the order is cuDNN, flash, efficient, math; otherwise the
// default (Context.h) flash, efficient, math, cuDNN, where math always takes it first.
int32_t choose(const Sdp& p) {
  const bool prefer_cudnn = (p.major() == 9 || p.major() == 10) && (p.minor() == 0 || p.minor() == 3);
  if (prefer_cudnn && cudnn_why_not(p).empty()) return MP_ATTN_CUDNN;
  if (flash_why_not(p).empty()) return MP_ATTN_FLASH;
  if (efficient_why_not(p).empty()) return MP_ATTN_EFFICIENT;
  return MP_ATTN_MATH;
}

std::string why_not(const Sdp& p, int32_t b) {
  switch (b) {
    case MP_ATTN_FLASH:
      return flash_why_not(p);
    case MP_ATTN_EFFICIENT:
      return efficient_why_not(p);
    case MP_ATTN_CUDNN:
      return cudnn_why_not(p);
    default:
      return "";
  }
}

// attention.cpp: pad_last_dim<8, false> (flash needs head sizes that are multiples of 8).
at::Tensor pad_last_dim8(const at::Tensor& t) {
  const int64_t last = t.size(-1);
  if (last % 8 == 0) return t;
  return at::pad(t, {0, 8 - last % 8});
}

// attention.cpp: convert_boolean_attn_mask (a bool mask becomes an additive one of the
// query's dtype).
std::optional<at::Tensor> convert_mask(const std::optional<at::Tensor>& m, const at::Tensor& q) {
  if (!m.has_value() || !m->defined()) return std::nullopt;
  if (m->scalar_type() == at::kBool) {
    return at::where(*m, at::scalar_tensor(0.0, m->options().dtype(q.scalar_type())),
                     at::scalar_tensor(-std::numeric_limits<double>::infinity(),
                                       m->options().dtype(q.scalar_type())));
  }
  return m;
}

// attention.cpp: preprocess_mask (the memory-efficient kernel's bias: expanded to
// [B, H, L, S], its last dimension padded to a multiple of 16, strides aligned to 16).
at::Tensor preprocess_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k) {
  auto m = mask.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
  const int64_t last = m.size(-1);
  if (last % 16 != 0) {
    return at::pad(m, {0, 16 - last % 16}).slice(-1, 0, last);
  }
  if (m.stride(0) % 16 != 0 || m.stride(1) % 16 != 0 || m.stride(2) % 16 != 0) {
    return m.contiguous();
  }
  return m;
}

at::Tensor sdpa_as_on_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& mask, double dropout,
                           bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (!meta_trace_on() || q.device().type() != c10::DeviceType::Meta) {
    return at::compositeimplicitautograd::scaled_dot_product_attention(
        q, k, v, mask, dropout, is_causal, scale, enable_gqa);
  }
  Sdp p{q, k, v, mask, dropout, is_causal, enable_gqa, g_sm.load()};
  int32_t b = g_backend.load();
  if (b == MP_ATTN_AUTO) {
    b = choose(p);
  } else {
    const std::string w = why_not(p, b);
    TORCH_CHECK(w.empty(), "attention ", backend_name(b), ": CUDA would not run it here: ", w);
  }
  g_runs[b - 1].fetch_add(1, std::memory_order_relaxed);
  const bool lse = input_requires_grad(p);
  switch (b) {
    case MP_ATTN_FLASH: {
      const int64_t og = q.size(-1);
      const double og_scale = scale.has_value() ? *scale : 1.0 / std::sqrt(double(og));
      // In this order, as attention.cpp pads them.
      auto qp = pad_last_dim8(q);
      auto kp = pad_last_dim8(k);
      auto vp = pad_last_dim8(v);
      auto out = std::get<0>(
          at::_scaled_dot_product_flash_attention(qp, kp, vp, dropout, is_causal, false, og_scale));
      return out.size(-1) != og ? out.slice(-1, 0, og) : out;
    }
    case MP_ATTN_EFFICIENT: {
      auto m = convert_mask(mask, q);
      if (m.has_value()) m = preprocess_mask(*m, q, k);
      return std::get<0>(
          at::_scaled_dot_product_efficient_attention(q, k, v, m, lse, dropout, is_causal, scale));
    }
    case MP_ATTN_CUDNN: {
      auto m = convert_mask(mask, q);
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, m, lse, dropout,
                                                                   is_causal, false, scale));
    }
    default:
      return at::compositeimplicitautograd::scaled_dot_product_attention(
          q, k, v, mask, dropout, is_causal, scale, enable_gqa);
  }
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The fused ops' meta kernels. Each allocates, in order, what the CUDA op allocates; the
// buffers the CUDA op frees before it returns are allocated and freed here at the same
// point (a local that goes out of scope).

// attention.cu _scaled_dot_product_flash_attention_cuda -> _flash_attention_forward ->
// flash_api.cpp mha_fwd on q, k, v transposed to [B, L, H, D]: out = empty_like(q),
// softmax_lse f32 [B, H, L], rng_state u64 [2] and _unused u64 [] (a second rng_state
// with dropout). Split-KV accumulators (inference at small batch x heads, sized by the
// GPU's SM count) are not modelled.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
flash_fwd_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor&, double dropout,
               bool, bool, std::optional<double>) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2);
  auto out = at::empty_like(q.transpose(1, 2));
  auto lse = at::empty({B, H, L}, q.options().dtype(at::kFloat));
  auto rng_state = at::empty({2}, q.options().dtype(at::kUInt64));
  auto unused = at::empty({}, q.options().dtype(at::kUInt64));
  if (dropout > 0.0) {
    rng_state = at::empty({2}, q.options().dtype(at::kUInt64));
  }
  auto debug = at::empty({0}, q.options());
  return {out.transpose(1, 2), lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S),
          rng_state, unused, debug};
}

// attention_backward.cu _scaled_dot_product_flash_attention_backward_cuda ->
// _flash_attention_backward -> flash_api.cpp mha_bwd: dq, dk, dv = empty_like of q, k, v
// in [B, L, H, D]; softmax_d f32 [B, H, round128(L)] (returned, dropped by the caller);
// dq_accum f32 [B, round128(L), H, round(D, 32 if D <= 128 else 64)]; with fewer key/value
// heads (GQA), dk/dv expanded to the query's heads [B, S, H, D], summed into dk/dv.
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_bwd_meta(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    c10::SymInt, c10::SymInt, double, bool, const at::Tensor&, const at::Tensor&,
    std::optional<double>) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Hk = k.size(1);
  auto dout_t = grad_out.transpose(1, 2).contiguous();
  auto out_t = out.transpose(1, 2).contiguous();
  auto dq = at::empty_like(q.transpose(1, 2));
  auto dk = at::empty_like(k.transpose(1, 2));
  auto dv = at::empty_like(v.transpose(1, 2));
  {
    auto softmax_d = at::empty({B, H, round_up(L, 128)}, q.options().dtype(at::kFloat));
    auto dq_accum = at::empty({B, round_up(L, 128), H, round_up(D, D <= 128 ? 32 : 64)},
                              q.options().dtype(at::kFloat));
    if (Hk != H) {
      auto dk_expanded = at::empty({B, S, H, D}, q.options());
      auto dv_expanded = at::empty({B, S, H, D}, q.options());
    }
  }
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

// attention.cu _scaled_dot_product_efficient_attention_cuda -> _efficient_attention_forward
// on q, k, v transposed to [B, L, H, D]: philox seed and offset as CPU int64 scalars (no
// GPU memory), res [B, L, H, Dv] of the query's dtype, logsumexp f32
// [B, H, compute_log_sumexp ? ceil(L / 32) * 32 : 0] (kernel_forward.h kAlignLSE = 32), and
// for f16/bf16 with Dv > 128 (the cutlassF kernel with kMaxK 65536 > kKeysPerBlock 128,
// kNeedsOutputAccumulatorBuffer) an f32 output accumulator [B, L, H, Dv] freed on return.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_fwd_meta(
    const at::Tensor& q, const at::Tensor&, const at::Tensor& v, const std::optional<at::Tensor>&,
    bool compute_log_sumexp, double, bool, std::optional<double>) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dv = v.size(3);
  auto seed = at::empty({}, at::TensorOptions().dtype(at::kLong));
  auto offset = at::empty({}, at::TensorOptions().dtype(at::kLong));
  auto res = at::empty({B, L, H, Dv}, q.options());
  auto lse = at::empty({B, H, compute_log_sumexp ? round_up(L, 32) : 0},
                       q.options().dtype(at::kFloat));
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (half && Dv > 128) {
    auto output_accum = at::empty({B, L, H, Dv}, q.options().dtype(at::kFloat));
  }
  return {res.transpose(1, 2), lse, seed, offset};
}

// attention_backward.cu _scaled_dot_product_efficient_attention_backward_cuda ->
// _efficient_attention_backward: grad_q, grad_k, grad_v of the shapes of q, k, v in
// [B, L, H, D]; a bias gradient padded to a multiple of 16 when asked for; delta f32
// [B, H, L] freed on return; the kernel's workspace (kernel_backward.h workspace_size:
// f32 accumulators, set by the kernel the dispatcher picks) taken after them, charged
// as an NVIDIA H200 measured it (tests/data/gpu-truth/h200-2026-11-26/workspaces.csv):
// f32 [B, H, L, D] and f32 [B, H, L], L and D rounded up to 64 (BERT and GPT-2 in f32
// to the byte, ViT-base's L = 197 1.5% over).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_bwd_meta(
    const at::Tensor&, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& bias, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, double, std::array<bool, 4> mask, bool, std::optional<double>) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  auto gq = at::empty(q.transpose(1, 2).sizes(), q.options());
  auto gk = at::empty(k.transpose(1, 2).sizes(), k.options());
  auto gv = at::empty(v.transpose(1, 2).sizes(), v.options());
  at::Tensor gb;
  if (mask[3] && bias.defined()) {
    auto sz = bias.sizes().vec();
    const int64_t last = sz.back();
    sz.back() = round_up(last, 16);
    gb = at::empty(sz, bias.options()).slice(-1, 0, last);
  }
  {
    auto delta = at::empty({B, H, L}, q.options().dtype(at::kFloat));
    const int64_t rows = B * H * round_up(L, 64);
    meta_transient(rows * round_up(q.size(3), 64) * 4 + rows * 4, kTransientExact);
  }
  return {gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2), gb};
}

// attention.cu _scaled_dot_product_cudnn_attention_cuda -> cudnn/MHA.cpp
// run_cudnn_SDP_fprop: the output with the query's layout [B, H, L, Dv], softmax stats
// f32 [B, H, L, 1] when compute_log_sumexp, dropout seed and offset int64 [1] on the GPU.
// cuDNN's workspace (sized by cuDNN's execution plan at run time) is not modelled.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
cudnn_fwd_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const std::optional<at::Tensor>&, bool compute_log_sumexp, double, bool, bool,
               std::optional<double>) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), Dv = v.size(3);
  auto seed = at::empty({1}, q.options().dtype(at::kLong));
  auto offset = at::empty({1}, q.options().dtype(at::kLong));
  auto out = at::empty({B, L, H, Dv}, q.options()).transpose(1, 2);
  at::Tensor lse;
  if (compute_log_sumexp) {
    lse = at::empty({B, H, L, 1}, q.options().dtype(at::kFloat));
  }
  // cuDNN's forward workspace: a 256-byte request after the outputs, freed before the
  // call returns, in every cuDNN attention forward of the H200's snapshots (GPT-2,
  // BERT-base, SmolLM2 and ViT-B training under bf16 autocast, 132 calls).
  meta_transient(256, kTransientExact);
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S), seed, offset,
          at::Tensor()};
}

// cudnn/MHA.cpp run_cudnn_SDP_bprop: dq, dk, dv with the layouts of q, k, v, then cuDNN's
// workspace, charged as an NVIDIA H200 measured it (tests/data/gpu-truth/
// h200-2026-11-26/workspaces.csv): an f32 [B, H, L, D] query-gradient accumulator and
// f32 [B, H, L] (BERT, GPT-2, SmolLM2 and ViT-base in bf16: each to the byte, less the
// 512 B the allocator rounds another block to).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cudnn_bwd_meta(
    const at::Tensor&, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double,
    bool, std::optional<double>) {
  // In this order (a function's arguments have none).
  auto dq = at::empty_like(q);
  auto dk = at::empty_like(k);
  auto dv = at::empty_like(v);
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  meta_transient(rows * q.size(3) * 4 + rows * 4, kTransientExact);
  return {dq, dk, dv};
}

bool has_meta(const char* name) {
  auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void set_attention(int32_t sm, int32_t backend) {
  g_sm.store(sm);
  g_backend.store(backend);
  for (auto& r : g_runs) {
    r.store(0);
  }
}

void attention_get(MpAttention* out) {
  out->sm = g_sm.load();
  out->backend = g_backend.load();
  for (int i = 0; i < 4; ++i) {
    out->runs[i] = g_runs[i].load();
  }
}

void register_attention_kernels() {
  auto* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  if (!has_meta("aten::_scaled_dot_product_flash_attention")) {
    lib->impl("_scaled_dot_product_flash_attention", TORCH_FN(flash_fwd_meta));
  }
  if (!has_meta("aten::_scaled_dot_product_flash_attention_backward")) {
    lib->impl("_scaled_dot_product_flash_attention_backward", TORCH_FN(flash_bwd_meta));
  }
  if (!has_meta("aten::_scaled_dot_product_efficient_attention")) {
    lib->impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_fwd_meta));
  }
  if (!has_meta("aten::_scaled_dot_product_efficient_attention_backward")) {
    lib->impl("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_bwd_meta));
  }
  if (!has_meta("aten::_scaled_dot_product_cudnn_attention")) {
    lib->impl("_scaled_dot_product_cudnn_attention", TORCH_FN(cudnn_fwd_meta));
  }
  if (!has_meta("aten::_scaled_dot_product_cudnn_attention_backward")) {
    lib->impl("_scaled_dot_product_cudnn_attention_backward", TORCH_FN(cudnn_bwd_meta));
  }
  auto* autograd = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
  autograd->impl("scaled_dot_product_attention", TORCH_FN(sdpa_as_on_cuda));
}

}  // namespace memprof
