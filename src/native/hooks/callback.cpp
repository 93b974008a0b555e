// The one op callback's registration (the callback itself and the op recorder are in
// ops.cpp): registered while a dry run or a profiling session needs it, with the ops'
// inputs while either needs them, and for every op (FUNCTION scope) only while one
// records ops: the dry run, leak hunting's op origins in the iterations that learn
// them, the step timeline, the memory history. A session without them (no leak
// hunting, or leak hunting between the iterations that learn) registers none: its
// phases come from the allocation hooks, and libtorch keeps every op on the
// dispatcher's fast path, which builds no record at all. The profiled step asks for inputs only in the
// iterations that learn what its ops take from them (op_seq.cpp), and from inside a
// record for the rest of an iteration that parted from them.

#include <mutex>

#include "../internal.h"

namespace memprof {

std::atomic<bool> g_step_user{false};

namespace {
std::mutex g_callback_mutex;
at::CallbackHandle g_callback = 0;
bool g_used[2] = {false, false};
bool g_inputs[2] = {false, false};
bool g_outputs[2] = {false, false};
bool g_functions[2] = {false, false};
bool g_has_inputs = false;
bool g_has_outputs = false;
bool g_has_functions = false;
}  // namespace

namespace {
// Registers the callback as the targets need it now (under g_callback_mutex). The
// profiled step needs it only for inputs or every op's records: its phases need no
// record (backward begins at the first allocation or free in the engine's graph task:
// internal.h, backward_if_in_task), and a callback for the autograd nodes alone would
// cost every node a rebuild of libtorch's thread-local callback lists (the engine sets
// its thread-local state again for each node). The dry run always needs it.
void register_callback_locked() {
  const bool step = g_used[MP_TARGET_STEP] &&
      (g_inputs[MP_TARGET_STEP] || g_functions[MP_TARGET_STEP]);
  const bool any = step || g_used[MP_TARGET_DRY_RUN];
  const bool want_inputs = g_inputs[0] || g_inputs[1];
  const bool want_outputs = g_outputs[0] || g_outputs[1];
  const bool want_functions = g_functions[0] || g_functions[1];
  if (g_callback != 0 && any && want_inputs == g_has_inputs && want_outputs == g_has_outputs &&
      want_functions == g_has_functions) {
    return;  // registered as needed
  }
  // Records begun under the old registration keep it to their end.
  if (g_callback != 0) {
    at::removeCallback(g_callback);
    g_callback = 0;
  }
  if (any) {
    auto callback = at::RecordFunctionCallback(&on_op_start, &on_op_end)
                        .needsInputs(want_inputs)
                        .needsOutputs(want_outputs);
    if (want_functions) {
      callback.scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION});
    } else {
      callback.scopes({at::RecordScope::BACKWARD_FUNCTION});
    }
    g_callback = at::addGlobalCallback(std::move(callback));
    g_has_inputs = want_inputs;
    g_has_outputs = want_outputs;
    g_has_functions = want_functions;
  }
}
}  // namespace

void op_callback_use(int target, bool on, bool inputs, bool outputs, bool functions) {
  std::lock_guard<std::mutex> lock(g_callback_mutex);
  g_used[target] = on;
  g_inputs[target] = on && inputs;
  g_outputs[target] = on && outputs;
  g_functions[target] = on && functions;
  if (target == MP_TARGET_STEP) {
    g_step_user.store(on);
  }
  register_callback_locked();
}

void op_callback_want_functions(int target, bool functions) {
  std::lock_guard<std::mutex> lock(g_callback_mutex);
  if (!g_used[target] || g_functions[target] == functions) {
    return;
  }
  g_functions[target] = functions;
  register_callback_locked();
}

void op_callback_want_records(int target) {
  std::lock_guard<std::mutex> lock(g_callback_mutex);
  if (!g_used[target] || (g_inputs[target] && g_functions[target])) {
    return;
  }
  g_inputs[target] = true;
  g_functions[target] = true;
  register_callback_locked();
}

void op_callback_want_inputs(int target) {
  std::lock_guard<std::mutex> lock(g_callback_mutex);
  if (!g_used[target] || g_inputs[target]) {
    return;  // stopped (a late record of another thread), or asking already
  }
  g_inputs[target] = true;
  register_callback_locked();
}

}  // namespace memprof
