// TorchScript files (script/script.cpp): loaded onto the meta device for the dry run
// with their scalar constants restored, run, and their variables listed; and the module
// path of the TorchScript op running on a thread, which the op recorder names layers by.

#ifndef TCH_MEMPROF_SCRIPT_H
#define TCH_MEMPROF_SCRIPT_H

#include "../internal.h"

namespace memprof {

// A loaded file (its torch::jit::Module) the caller frees with script_free.
void* script_load(const char* path);
void script_free(void* m);
void script_train(void* m, bool on);
// The ops a `cpu` device constant of the file fed (it was traced on the CPU), a line each.
std::string script_cpu_uses(void* m);
int32_t script_input_kind(void* m);
void script_fresh(void* m);
at::Tensor* script_forward(void* m, const at::Tensor* const* inputs, size_t n, bool optimize);
std::vector<std::pair<std::string, at::Tensor>> script_tensors(void* m, int32_t which);
int script_tensor(void* m, int32_t which, uint64_t index, uint64_t* n, void** tensor,
                  char* name_buf, size_t len, uint64_t* name_len);
// Whether a TorchScript interpreter (or an exported program's node, program/) runs on
// this thread; if so, buf (cap bytes) gets the innermost module's path as
// named_modules() names it (`layer4.0.conv2`; empty for the root module's own ops) and
// *fits whether it fitted.
bool script_module_path(char* buf, size_t cap, bool* fits);

}  // namespace memprof

#endif  // TCH_MEMPROF_SCRIPT_H
