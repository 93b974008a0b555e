// Exported programs (program/program.cpp): one node of a torch.export graph called
// through the dispatcher, and the module path of the node running on a thread, which
// the op recorder names layers by (as it does TorchScript's).

#ifndef TCH_MEMPROF_PROGRAM_H
#define TCH_MEMPROF_PROGRAM_H

#include "../internal.h"

namespace memprof {

int program_call(const char* op, const char* overload, const char* module, const MpValue* args,
                 size_t n, MpValue* out, size_t cap, size_t* n_out);
// Whether an exported program's node runs on this thread; if so, buf (cap bytes) gets
// its module path (`layer4.0.conv2`; empty for the root module) and *fits whether it
// fitted.
bool program_module_path(char* buf, size_t cap, bool* fits);

}  // namespace memprof

#endif  // TCH_MEMPROF_PROGRAM_H
