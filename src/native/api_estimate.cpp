// The C ABI of the estimator (declared in memprof.h): its dry run on the meta device
// (dryrun/), TorchScript files (script/) and exported programs (program/). Each
// function runs behind guarded(), as api.cpp's do.

#include <ATen/core/Tensor.h>

#include <cstring>
#include <string>

#include "internal.h"
#include "guarded.h"
#include "dryrun/dryrun.h"
#include "program/program.h"
#include "script/script.h"

using namespace memprof;

extern "C" {

// ---------------------------------------------------------------------------------
// The estimator's dry run on the meta device (dryrun/) and TorchScript files (script/).

int memprof_meta_begin(void) noexcept {
  return guarded("memprof_meta_begin", [&]() -> int { return meta_begin() ? 0 : -1; });
}

int memprof_meta_end(void) noexcept {
  return guarded("memprof_meta_end", [&]() -> int {
    meta_end();
    return 0;
  });
}

int memprof_meta_sites(int32_t on) noexcept {
  return guarded("memprof_meta_sites", [&]() -> int { return meta_sites(on != 0) ? 0 : -1; });
}

int memprof_meta_mark(int32_t value) noexcept {
  return guarded("memprof_meta_mark", [&]() -> int {
    if (value < MP_MARK_FORWARD || value > MP_MARK_STEP) {
      set_error("memprof_meta_mark: not a MpMetaMark");
      return -1;
    }
    meta_mark(value);
    return 0;
  });
}

int memprof_meta_read(MpTlEvent* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_meta_read", [&]() -> int {
    if (!given(total, "memprof_meta_read") || (cap > 0 && !given(out, "memprof_meta_read"))) {
      return -1;
    }
    meta_read(out, cap, total);
    return 0;
  });
}

int memprof_meta_attention(const MpAttention* set, MpAttention* get) noexcept {
  return guarded("memprof_meta_attention", [&]() -> int {
    if (set != nullptr) {
      if (set->backend < MP_ATTN_AUTO || set->backend > MP_ATTN_MATH || set->sm <= 0) {
        set_error("memprof_meta_attention: not a MpAttentionBackend or no compute capability");
        return -1;
      }
      set_attention(set->sm, set->backend);
    }
    if (get != nullptr) {
      attention_get(get);
    }
    return 0;
  });
}

int memprof_meta_gpu(int32_t multiprocessors, int32_t threads_per_multiprocessor) noexcept {
  return guarded("memprof_meta_gpu", [&]() -> int {
    if (multiprocessors <= 0 || threads_per_multiprocessor <= 0) {
      set_error("memprof_meta_gpu: no multiprocessors or no threads per multiprocessor");
      return -1;
    }
    set_reduce_gpu(multiprocessors, threads_per_multiprocessor);
    return 0;
  });
}

int memprof_reduce_buffers(const int64_t* sizes, const int64_t* strides, uint64_t ndim,
                           int64_t offset, int32_t in_dtype, int32_t out_dtype,
                           const int64_t* dims, int64_t ndims, int32_t keepdim,
                           int32_t multiprocessors, int32_t threads_per_multiprocessor,
                           int64_t* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_reduce_buffers", [&]() -> int {
    if (!given(total, "memprof_reduce_buffers") || (ndim > 0 && (!given(sizes, "memprof_reduce_buffers") ||
                                                                 !given(strides, "memprof_reduce_buffers"))) ||
        (ndims > 0 && !given(dims, "memprof_reduce_buffers")) ||
        (cap > 0 && !given(out, "memprof_reduce_buffers"))) {
      return -1;
    }
    if (multiprocessors <= 0 || threads_per_multiprocessor <= 0) {
      set_error("memprof_reduce_buffers: no multiprocessors or no threads per multiprocessor");
      return -1;
    }
    const int32_t last = int32_t(c10::ScalarType::NumOptions);
    if (in_dtype < 0 || in_dtype >= last || out_dtype < 0 || out_dtype >= last) {
      set_error("memprof_reduce_buffers: not a ScalarType");
      return -1;
    }
    for (uint64_t d = 0; d < ndim; ++d) {
      if (sizes[d] < 0 || strides[d] < 0) {
        set_error("memprof_reduce_buffers: a negative size or stride");
        return -1;
      }
    }
    if (offset < 0) {
      set_error("memprof_reduce_buffers: a negative offset");
      return -1;
    }
    at::OptionalIntArrayRef reduced;
    if (ndims >= 0) {
      reduced = at::IntArrayRef(dims, size_t(ndims));
    }
    const auto buffers = reduction_buffers_of(
        at::IntArrayRef(sizes, ndim), at::IntArrayRef(strides, ndim), offset,
        c10::ScalarType(in_dtype), c10::ScalarType(out_dtype), reduced, keepdim != 0,
        ReduceGpu{multiprocessors, threads_per_multiprocessor});
    *total = buffers.size();
    for (uint64_t i = 0; i < buffers.size() && i < cap; ++i) {
      out[i] = buffers[i];
    }
    return 0;
  });
}

int memprof_meta_conv_workspaces(const char* table, size_t len) noexcept {
  return guarded("memprof_meta_conv_workspaces", [&]() -> int {
    if (len > 0 && !given(table, "memprof_meta_conv_workspaces")) {
      return -1;
    }
    set_conv_workspaces(len > 0 ? table : nullptr, len);
    return 0;
  });
}

int memprof_meta_empty(const int64_t* sizes, size_t n, const void* like, void** out) noexcept {
  return guarded("memprof_meta_empty", [&]() -> int {
    if (!given(out, "memprof_meta_empty") || !given(like, "memprof_meta_empty") ||
        (n > 0 && !given(sizes, "memprof_meta_empty"))) {
      return -1;
    }
    if (!meta_ensure_ready()) {
      return -1;
    }
    *out = meta_empty(sizes, n, *static_cast<const at::Tensor*>(like));
    return 0;
  });
}

int memprof_meta_convert(void* tensor) noexcept {
  return guarded("memprof_meta_convert", [&]() -> int {
    if (!given(tensor, "memprof_meta_convert") || !meta_ensure_ready()) {
      return -1;
    }
    meta_convert(static_cast<at::Tensor*>(tensor));
    return 0;
  });
}

int memprof_meta_autocast_begin(int32_t list, int32_t dtype) noexcept {
  return guarded("memprof_meta_autocast_begin", [&]() -> int {
    if (list != MP_AUTOCAST_LIST_CUDA && list != MP_AUTOCAST_LIST_CPU) {
      set_error("memprof_meta_autocast_begin: not an autocast list");
      return -1;
    }
    return meta_autocast_begin(list, dtype) ? 0 : -1;
  });
}

int memprof_meta_autocast_end(void) noexcept {
  return guarded("memprof_meta_autocast_end", [&]() -> int {
    meta_autocast_end();
    return 0;
  });
}

namespace {
// A text for the caller: its length to *needed, at most len - 1 of its bytes and a NUL
// to buf (nothing when len is 0, the caller asking the length).
void copy_text(const std::string& text, char* buf, size_t len, uint64_t* needed) {
  *needed = text.size();
  if (len > 0) {
    const size_t k = std::min(len - 1, text.size());
    std::memcpy(buf, text.data(), k);
    buf[k] = 0;
  }
}
}  // namespace

int memprof_autocast_listing(int32_t which, char* buf, size_t len, uint64_t* needed) noexcept {
  return guarded("memprof_autocast_listing", [&]() -> int {
    if (!given(needed, "memprof_autocast_listing") || (len > 0 && !given(buf, "memprof_autocast_listing"))) {
      return -1;
    }
    if (which < MP_AUTOCAST_LIST_CUDA || which > MP_AUTOCAST_REGISTERED_CPU) {
      set_error("memprof_autocast_listing: not a MpAutocastList");
      return -1;
    }
    const std::string text = autocast_listing(which);
    copy_text(text, buf, len, needed);
    return 0;
  });
}

int memprof_meta_inventory(char* buf, size_t len, uint64_t* needed) noexcept {
  return guarded("memprof_meta_inventory", [&]() -> int {
    if (!given(needed, "memprof_meta_inventory") ||
        (len > 0 && !given(buf, "memprof_meta_inventory")) || !meta_ensure_ready()) {
      return -1;
    }
    const std::string text = meta_inventory();
    copy_text(text, buf, len, needed);
    return 0;
  });
}

int memprof_script_load(const char* path, void** out) noexcept {
  return guarded("memprof_script_load", [&]() -> int {
    if (!given(path, "memprof_script_load") || !given(out, "memprof_script_load") ||
        !meta_ensure_ready()) {
      return -1;
    }
    *out = script_load(path);
    return 0;
  });
}

int memprof_script_free(void* module) noexcept {
  return guarded("memprof_script_free", [&]() -> int {
    script_free(module);
    return 0;
  });
}

int memprof_script_train(void* module, int32_t on) noexcept {
  return guarded("memprof_script_train", [&]() -> int {
    if (!given(module, "memprof_script_train")) {
      return -1;
    }
    script_train(module, on != 0);
    return 0;
  });
}

int memprof_script_fresh(void* module) noexcept {
  return guarded("memprof_script_fresh", [&]() -> int {
    if (!given(module, "memprof_script_fresh")) {
      return -1;
    }
    script_fresh(module);
    return 0;
  });
}

int memprof_script_cpu_uses(void* module, char* buf, size_t len, uint64_t* needed) noexcept {
  return guarded("memprof_script_cpu_uses", [&]() -> int {
    if (!given(module, "memprof_script_cpu_uses") || !given(needed, "memprof_script_cpu_uses") ||
        (len > 0 && !given(buf, "memprof_script_cpu_uses"))) {
      return -1;
    }
    const std::string text = script_cpu_uses(module);
    copy_text(text, buf, len, needed);
    return 0;
  });
}

int memprof_script_input_kind(void* module, int32_t* kind) noexcept {
  return guarded("memprof_script_input_kind", [&]() -> int {
    if (!given(module, "memprof_script_input_kind") || !given(kind, "memprof_script_input_kind")) {
      return -1;
    }
    *kind = script_input_kind(module);
    return 0;
  });
}

int memprof_script_forward(void* module, const void* const* inputs, size_t n, int32_t optimize,
                           void** out) noexcept {
  return guarded("memprof_script_forward", [&]() -> int {
    if (!given(module, "memprof_script_forward") || !given(out, "memprof_script_forward") ||
        (n > 0 && !given(inputs, "memprof_script_forward"))) {
      return -1;
    }
    *out = script_forward(module, reinterpret_cast<const at::Tensor* const*>(inputs), n,
                          optimize != 0);
    return 0;
  });
}

int memprof_script_tensor(void* module, int32_t which, uint64_t index, uint64_t* n,
                          void** tensor, char* name_buf, size_t len, uint64_t* name_len) noexcept {
  return guarded("memprof_script_tensor", [&]() -> int {
    if (!given(module, "memprof_script_tensor") || !given(n, "memprof_script_tensor")) {
      return -1;
    }
    return script_tensor(module, which, index, n, tensor, name_buf, len, name_len);
  });
}

int memprof_program_call(const char* op, const char* overload, const char* module,
                         const MpValue* args, size_t n, MpValue* out, size_t cap,
                         size_t* n_out) noexcept {
  return guarded("memprof_program_call", [&]() -> int {
    if (!given(op, "memprof_program_call") || !given(n_out, "memprof_program_call") ||
        (n > 0 && !given(args, "memprof_program_call")) ||
        (cap > 0 && !given(out, "memprof_program_call"))) {
      return -1;
    }
    return program_call(op, overload, module, args, n, out, cap, n_out);
  });
}

}  // extern "C"
