// tch-memprof's FFI contract: every struct, enum and function that crosses between the
// native layer (src/native/*.cpp) and Rust (src/ffi/) is defined here, once.
//
// Layout checks on both sides come from the MP_SIZE / MP_FIELD / MP_CONST lines below:
// the C++ side turns them into static_asserts at the end of this file, and build.rs
// turns the same lines into compile-time `size_of` / `offset_of!` / value assertions on
// the Rust mirrors. A struct that drifts on either side fails that side's build.
//
// Conventions:
// - Every function returns 0 on success and -1 on failure; the failure's message is in
//   the calling thread's last-error slot (memprof_last_error). Counts and other results
//   go through out-pointers. No C++ exception crosses this boundary: every function is
//   noexcept and runs its body behind one guard (api.cpp).
// - Device slots: 0 is the CPU, 1 + i is cuda:i (MP_MAX_DEVICES in all).
// - Generations: a counter bumped at every phase change and every iteration start;
//   blocks carry the generation and phase of their birth.

#ifndef TCH_MEMPROF_H
#define TCH_MEMPROF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define MP_NOEXCEPT noexcept
extern "C" {
#else
#define MP_NOEXCEPT
#endif

// ---------------------------------------------------------------------------------
// Constants and enums.

#define MP_MAX_CUDA 16
#define MP_MAX_DEVICES 17
#define MP_META_CAPACITY 33554432

// Phases of an iteration (a block's birth phase, an op's phase).
enum MpPhase {
  MP_PHASE_FORWARD = 0,
  MP_PHASE_BACKWARD = 1,
  MP_PHASE_OPTIMIZER = 2,
  MP_PHASE_IDLE = 3,  // no profiling session
};

// Kinds of events (MpTlEvent.kind), in both logs the op recorder writes: the step log
// of a profiled step and the meta trace of a dry run.
enum MpEventKind {
  MP_EV_ALLOC = 1,
  MP_EV_FREE = 2,
  MP_EV_OP_BEGIN = 3,
  MP_EV_OP_END = 4,
  MP_EV_LINK = 5,
  MP_EV_FLOPS = 6,
  MP_EV_UNCOUNTED = 7,
  MP_EV_PHASE = 8,
  MP_EV_READ = 9,
  MP_EV_BASELINE = 10,   // dry run only: the weights and the first batch are on the device
  MP_EV_WORKSPACE = 11,  // dry run only: an op CUDA runs on cuBLAS (value 1) or cuBLASLt (2) ended
  MP_EV_TRANSIENT = 12,  // dry run only: a CUDA kernel's workspace, taken and freed inside it
};

// What an MP_EV_TRANSIENT's size is (its aux).
enum MpTransient {
  MP_TRANSIENT_EXACT = 0,     // the size the kernel takes
  MP_TRANSIENT_BOUND = 1,     // the larger plausible size (a convolution not measured)
  MP_TRANSIENT_MEASURED = 2,  // the most a measured call held at once, over requests not known
  MP_TRANSIENT_RULE = 3,      // that call's larger plausible size: the pool's other layout only
  MP_TRANSIENT_SPLIT = 4,     // one of a measured call's requests, known one by one
};

// Where the op recorder's events go (memprof_set_params' target).
enum MpTarget {
  MP_TARGET_STEP = 0,     // the step log of the profiled loop
  MP_TARGET_DRY_RUN = 1,  // the meta trace of the estimator's dry run
};

// Frames kept of an allocation's call stack (MpSite.ips), with the step detail on.
#define MP_SITE_DEPTH 96

// What memprof_tensor_blocks reads and marks (flags, or-ed).
enum MpBlocksFlags {
  MP_BLOCKS_WATCH = 1,       // watch the blocks read (MpBlock.watched)
  MP_BLOCKS_GRADS_ONLY = 2,  // read the .grad blocks only (blocks may be null)
};
// The kinds of watched blocks (MpBlock.watched), each with its own count of frees.
enum MpWatch {
  MP_WATCH_NONE = 0,
  MP_WATCH_VARIABLE = 1,  // a variable's own block
  MP_WATCH_GRAD = 2,      // a variable's .grad block
};

// Marks the estimator's dry run sets (memprof_meta_mark): they become the trace's phase
// and baseline events.
enum MpMetaMark {
  MP_MARK_NONE = 0,       // not a mark
  MP_MARK_FORWARD = 1,    // a step's forward pass begins
  MP_MARK_BACKWARD = 2,   // its backward pass is next (it begins at the first autograd node)
  MP_MARK_OPTIMIZER = 3,  // its optimizer step begins
  MP_MARK_BASELINE = 4,   // the first step's inputs are on the device: the baseline
  MP_MARK_END = 5,        // the dry run's loop is over (what it frees after belongs to no step)
  MP_MARK_STEP = 6,       // a user's own step begins: its phases are found as the profiler
                          // finds them (backward at the autograd engine's first node, the
                          // optimizer at the first allocation outside backward after it)
};

// Attention backends of the dry run's scaled_dot_product_attention (MpAttention.backend).
enum MpAttentionBackend {
  MP_ATTN_AUTO = 0,       // as PyTorch's CUDA build picks for the GPU (MpAttention.sm)
  MP_ATTN_FLASH = 1,      // forced: flash attention
  MP_ATTN_EFFICIENT = 2,  // forced: memory-efficient attention
  MP_ATTN_CUDNN = 3,      // forced: cuDNN attention
  MP_ATTN_MATH = 4,       // forced: the math (reference) path
};

// The autocast op lists of the dry run (memprof_meta_autocast_begin) and what
// memprof_autocast_listing lists: the crate's lists, or the ops this libtorch registers
// autocast kernels for.
enum MpAutocastList {
  MP_AUTOCAST_LIST_CUDA = 0,        // CUDA autocast's lists and policies
  MP_AUTOCAST_LIST_CPU = 1,         // CPU autocast's
  MP_AUTOCAST_REGISTERED_CUDA = 2,  // ops with a kernel on AutocastCUDA in this libtorch
  MP_AUTOCAST_REGISTERED_CPU = 3,   // on AutocastCPU
};

// What a TorchScript file's first input is (memprof_script_input_kind).
enum MpInputKind {
  MP_INPUT_UNKNOWN = 0,
  MP_INPUT_TOKENS = 1,  // token ids: an embedding's indices
  MP_INPUT_IMAGES = 2,  // images: a 2-d convolution's input
};

// Device types of the autocast and RNG calls.
enum MpDeviceType {
  MP_DEVICE_CPU = 0,
  MP_DEVICE_CUDA = 1,
};

// What memprof_cuda_control does.
enum MpCudaControl {
  MP_CUDA_RESET_PEAKS = 0,
  MP_CUDA_EMPTY_CACHE = 1,
  MP_CUDA_CLEAR_WORKSPACES = 2,  // release the cuBLAS/cuBLASLt workspaces, as PyTorch does
};

// MpWorkspace.kind.
enum MpWorkspaceKind {
  MP_WORKSPACE_CUBLAS = 0,
  MP_WORKSPACE_CUBLASLT = 1,
};

// ---------------------------------------------------------------------------------
// Structs.

// Counters of one device slot.
typedef struct MpDeviceStats {
  int64_t live;       // live bytes of blocks whose birth was seen
  int64_t peak_iter;  // peak of live since the iteration began
  int64_t peak_run;   // peak of live since the session began
  int64_t allocs;  // births seen (the overhead bench's count; frees are not counted)
  int64_t optimizer_born_live;  // live bytes born in optimizer phases
  int64_t feature_maps;         // forward bytes live at backward start; -1: no backward
  // CUDA: the caching allocator's own totals, as passed with its reports (-1: none yet).
  int64_t reported_allocated;
  int64_t reported_reserved;
  int64_t reported_peak_allocated_iter;
  int64_t reported_peak_reserved_iter;
  int64_t reported_peak_allocated_run;
  int64_t reported_peak_reserved_run;
} MpDeviceStats;

// The session's global state.
typedef struct MpState {
  uint32_t generation;
  uint32_t phase;  // MpPhase
  int64_t active_backward;
  int64_t backward_passes;
  uint64_t log_len;
  uint64_t log_capacity;
  int64_t untagged_frees;  // frees whose birth tag could not be read (should stay 0)
  int32_t cpu_installed;
  int32_t cuda_loaded;
  int64_t cuda_ooms_seen;
  int64_t hook_reentries;   // a hook entered while it ran on the same thread (must stay 0)
  int64_t cuda_untracked;   // CUDA births the block table had no room for
  int32_t op_records;       // 1 while libtorch runs op callbacks for every op, not only nodes
  int32_t graph_task_direct;  // 1 where the graph task is read from libtorch's TLS itself
} MpState;

// One birth (+size) or death (-size) of a block during backward.
typedef struct MpLogEvent {
  uint64_t ptr;
  int64_t delta;
  uint32_t generation;
  uint32_t device;  // device slot
} MpLogEvent;

// The allocation behind a tensor's storage.
typedef struct MpBlock {
  int32_t defined;
  int32_t device;   // device slot, -1 unknown device type
  int32_t tracked;  // the block's birth was seen
  uint32_t phase;   // birth phase (tracked only)
  uint32_t generation;  // birth generation (tracked only)
  uint32_t watched;     // MpWatch: its free is counted in memprof_watched_frees
  // 1 + the place of its birth in the backward log, where it was born in a backward
  // pass and logged (tracked only); 0 otherwise. The place may be of an earlier
  // iteration's log: the birth is there only if the event there is a birth at `base`
  // (no other block can be born at that address while this one lives).
  uint32_t birth_log;
  uint32_t reserved;
  uint64_t base;    // storage base pointer (block identity)
  int64_t bytes;    // block bytes as accounted (CUDA: rounded)
} MpBlock;

// CUDA caching-allocator statistics of one device (aggregate pool).
typedef struct MpCudaStats {
  int64_t allocated_current;
  int64_t allocated_peak;
  int64_t reserved_current;
  int64_t reserved_peak;
  int64_t active_current;
  int64_t active_peak;
  int64_t requested_current;
  int64_t requested_peak;
  int64_t alloc_retries;
  int64_t ooms;
  int64_t free_bytes;
  int64_t total_bytes;
} MpCudaStats;

// A cuBLAS or cuBLASLt workspace PyTorch keeps on a device (one per handle and stream:
// the training thread's and the autograd engine's thread's each take one), a block of
// the caching allocator until torch._C._cuda_clearCublasWorkspaces().
typedef struct MpWorkspace {
  uint64_t ptr;    // the block's address
  int64_t bytes;   // the block's bytes: the chosen workspace size rounded up to 512 B
  int32_t device;  // CUDA index
  int32_t kind;    // MP_WORKSPACE_CUBLAS or MP_WORKSPACE_CUBLASLT
  int32_t tracked; // 1: the session saw the block born (its bytes are in its counters)
  int32_t pad;
} MpWorkspace;

// One event of a log the op recorder writes: the step log of a profiled step, or the
// meta trace of a dry run (device slot 0 there, blocks named by their fake addresses,
// generation = the dry run's training step from 1). The meaning of the fields depends
// on kind:
//   alloc/free: phase = birth phase, device = slot, generation = birth generation,
//               op = timeline op, ptr = block, value = +/- bytes; aux (alloc, with the
//               step detail on or a dry run keeping sites) = its call stack's site id
//               + 1 (memprof_site), 0 none;
//   op begin:   generation = scope name id + 1 (0 none), aux = name id, value = index
//               of the first variable among the inputs (-1 none), ptr = in
//               TorchScript, the running module's path name id + 2 (1: the root
//               module), 0 outside TorchScript;
//   op end:     aux = name id, value = live bytes of the timeline device;
//   link:       aux = forward op index, ptr = autograd sequence number;
//   flops:      aux = name id, value = FLOPs;   uncounted: aux = name id;
//   phase:      phase = the new phase, generation = the new generation;
//   read:       (the step detail on; always in a dry run) op = timeline op, ptr = the
//               storage of a tensor that op (or an op nested in it) took as an input;
//   baseline:   (dry run) the weights and the first batch are on the device;
//   workspace:  (dry run) op = timeline op, aux = name id of an op CUDA runs on cuBLAS
//               (value 1) or on cuBLASLt (value 2), at its end;
//   transient:  (dry run) op = timeline op, value = the bytes a CUDA kernel takes and
//               frees inside itself (cuDNN's convolution workspace), after its outputs;
//               aux = 1 when that is the larger plausible size, not the kernel's own.
typedef struct MpTlEvent {
  uint8_t kind;  // MpEventKind
  uint8_t phase;
  uint8_t device;
  uint8_t pad;
  uint32_t generation;
  int32_t op;   // timeline op index in this step, -1 none
  int32_t aux;
  uint64_t ptr;
  int64_t value;
} MpTlEvent;

// The call stack of one allocation of the detailed step: return addresses, innermost
// first, from the allocation hook's caller on (the hook's own frames left out).
typedef struct MpSite {
  uint32_t frames;  // addresses in ips
  uint32_t pad;
  uint64_t ips[MP_SITE_DEPTH];
} MpSite;

// What an iteration's step log holds of its ops (MpTimelineHeader.records).
enum MpRecords {
  MP_RECORDS_NONE = 0,   // no op's events: only blocks and phases (a looking-up iteration)
  MP_RECORDS_AFTER = 1,  // the ops' events after it parted from the learned ones only
  MP_RECORDS_ALL = 2,    // every op's events
};

typedef struct MpTimelineHeader {
  uint64_t len;  // events logged this iteration (more than capacity: overflow)
  uint64_t capacity;
  uint32_t start_generation;  // first generation of this iteration
  int32_t ops;                // timeline ops begun this iteration
  int64_t start_live;         // live bytes of the timeline device at the iteration start
  int32_t on;
  int32_t device;
  int32_t records;            // MpRecords
  int32_t learning;           // this iteration learns its ops (and records them all)
} MpTimelineHeader;

// A live block of the registry (leak hunting, snapshots, OOM reports).
typedef struct MpLiveBlock {
  uint64_t ptr;
  int64_t size;
  int32_t op;      // name id of the timeline-level op that allocated it, -1 none
  int32_t layer;   // name id of its layer, -1 unknown
  uint32_t iter;   // iteration (step, from 1) it was born in
  uint8_t phase;   // birth phase
  uint8_t device;  // device slot
  uint16_t pad;
} MpLiveBlock;

// The live-block registry's own size.
typedef struct MpRegistry {
  uint64_t capacity;    // entries reserved
  uint64_t high_water;  // entries ever used (their memory is touched)
  int64_t live;         // entries in use now
  int64_t dropped;      // births not registered because the registry was full
  uint64_t entry_bytes;
  int32_t on;
  int32_t pad;
  // What the ops took from their inputs, learned (op_seq.cpp): bytes of the entries ever written.
  uint64_t learned_ops_bytes;
  // Ops of this session that took what they needed from the learned ones, not from
  // their inputs.
  uint64_t looked_up_ops;
} MpRegistry;

// One birth (+size) or death (-size) of the memory history.
typedef struct MpHistEvent {
  uint64_t ptr;
  int64_t size;
  int32_t op;         // name id of the op running on the thread, -1 none
  int32_t layer;      // its layer's name id, -1 unknown
  uint64_t time_dev;  // microseconds (CLOCK_MONOTONIC) << 8 | device slot
} MpHistEvent;

// How the dry run runs scaled_dot_product_attention, and how often each backend ran.
typedef struct MpAttention {
  int32_t sm;        // the GPU's compute capability, major * 10 + minor (90 = 9.0)
  int32_t backend;   // MpAttentionBackend
  uint64_t runs[4];  // calls since the last set, by backend: flash, efficient, cudnn, math
} MpAttention;

// Autocast state of one device type, to restore on exit.
typedef struct MpAutocast {
  int32_t enabled;
  int32_t dtype;  // c10::ScalarType
} MpAutocast;

// One value of an exported program's node (program/program.cpp): an argument, matched
// to the op's schema by `name`, or a result. A list (MP_VALUE_LIST, `len` elements) is
// followed by its elements, which are neither lists nor named.
typedef enum MpValueKind {
  MP_VALUE_NONE = 0,
  MP_VALUE_TENSOR = 1,  // tensor: an at::Tensor* (arguments: borrowed; results: owned)
  MP_VALUE_INT = 2,     // i (also a c10::ScalarType, c10::Layout or c10::MemoryFormat)
  MP_VALUE_FLOAT = 3,   // f
  MP_VALUE_BOOL = 4,    // i: 0 or 1
  MP_VALUE_STRING = 5,  // str, len bytes
  MP_VALUE_DEVICE = 6,  // str, len bytes: "meta", "cpu", "cuda:0"
  MP_VALUE_LIST = 7,    // len elements follow
} MpValueKind;

typedef struct MpValue {
  int32_t kind;      // MpValueKind
  int32_t len;       // a list's element count, or a string's bytes
  int64_t i;
  double f;
  void* tensor;
  const char* name;  // an argument's name in the op's schema (NULL: a list's element, a result)
  const char* str;
} MpValue;

// Called when an allocation fails, before the error is raised: (ctx, device slot,
// requested bytes, allocated bytes, reserved bytes (CUDA; 0 on the CPU)).
typedef void (*MpOomCallback)(void* ctx, int32_t slot, int64_t requested, int64_t allocated,
                              int64_t reserved);

// ---------------------------------------------------------------------------------
// Functions (api.cpp).

// The calling thread's last error message: copies at most len-1 bytes and a NUL into
// buf; *needed gets the full length.
int memprof_last_error(char* buf, size_t len, size_t* needed) MP_NOEXCEPT;

// Session control, on the training thread.
int memprof_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks) MP_NOEXCEPT;
int memprof_stop(void) MP_NOEXCEPT;
int memprof_begin_iteration(void) MP_NOEXCEPT;

// Reading the counters.
int memprof_state(MpState* out) MP_NOEXCEPT;
int memprof_device_stats(int32_t slot, MpDeviceStats* out) MP_NOEXCEPT;
int memprof_registry(MpRegistry* out) MP_NOEXCEPT;
int memprof_timeline_header(MpTimelineHeader* out) MP_NOEXCEPT;

// The backward log, in place: *events (null before the library's load-time set-up) and
// its *len entries stay valid for the process's life; they are rewritten only after
// memprof_begin_iteration or a session's start or end. *total gets how many were logged
// in all (more than *len: the log overflowed, some were dropped).
int memprof_log_view(const MpLogEvent** events, uint64_t* len, uint64_t* total) MP_NOEXCEPT;
// Reading the step log: copy up to cap events (out may be null with cap 0); *total gets
// how many were logged in all (more than cap or the capacity: some were not copied).
int memprof_read_timeline(MpTlEvent* out, uint64_t cap, uint64_t* total) MP_NOEXCEPT;
// The step detail, for the iteration that begins now (call right after
// memprof_begin_iteration, before any op; needs the timeline on): every op's tensor inputs
// are logged (MP_EV_READ) and every allocation of the timeline device keeps its call stack
// (a site). Off again at the next call with on = 0. Costly: for one profiled step.
int memprof_set_detail(int32_t on) MP_NOEXCEPT;
// The next iteration learns its ops again (this one's step log was found unlike the
// learned one's).
int memprof_relearn(void) MP_NOEXCEPT;
// The call stack of site `id` (an alloc event's aux - 1) of the detailed step.
int memprof_site(uint64_t id, MpSite* out) MP_NOEXCEPT;
// The history's newest min(len, ring, cap) events, oldest first; *total: appended since
// the start, *ring: the ring's size.
int memprof_read_history(MpHistEvent* out, uint64_t cap, uint64_t* total, uint64_t* ring)
    MP_NOEXCEPT;
// Live registered blocks of device `slot` in this session; *n: how many there are.
int memprof_live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap, uint64_t* n) MP_NOEXCEPT;

// The block behind a tensor (an at::Tensor*), or behind its .grad with grad = 1.
int memprof_tensor_block(const void* tensor, int32_t grad, MpBlock* out) MP_NOEXCEPT;
// The blocks behind n tensors and behind their .grad in one call, as memprof_tensor_block
// fills them (blocks[i], grads[i]; with MP_BLOCKS_GRADS_ONLY only grads[i]). With
// MP_BLOCKS_WATCH each block whose birth was seen (on the CPU or a CUDA device) is also
// watched (MpBlock.watched: MP_WATCH_VARIABLE or MP_WATCH_GRAD): its free will be
// counted. frees[2]: memprof_watched_frees as it was before the blocks were read.
int memprof_tensor_blocks(const void* const* tensors, size_t n, MpBlock* blocks,
                          MpBlock* grads, int32_t flags, uint64_t* frees) MP_NOEXCEPT;
// How many watched blocks were freed since the process started, by kind: out[0] the
// variables' blocks, out[1] the .grad blocks. While a count stays the same, no watched
// block of its kind was freed, so no tensor that pointed to one points elsewhere unless
// that block is still held by another tensor: record_stats re-reads the variables'
// blocks only when the first changes, their .grad blocks only when the second does.
int memprof_watched_frees(uint64_t* out) MP_NOEXCEPT;
// Adopts the blocks behind n tensors (at::Tensor*) and behind their .grad that no
// report showed born: on CUDA, blocks allocated before the session pushed its reporter
// (a model moved to the GPU before the profiler was built). They are counted live from
// now on, as born before the session's first iteration in the forward phase; their
// frees are then seen like any block's. *bytes: the bytes adopted.
int memprof_adopt_blocks(const void* const* tensors, size_t n, int64_t* bytes) MP_NOEXCEPT;
// Test mode, for the CUDA accounting run on the CPU: every CPU block born so far becomes
// unknown and the CPU counters restart from zero, as CUDA's start with the session's
// reporter. Call before memprof_start; the mode lasts for the process.
int memprof_forget_cpu_blocks(void) MP_NOEXCEPT;

// Names of ops, layers and scopes.
int memprof_name(int32_t id, char* buf, size_t len, int64_t* name_len) MP_NOEXCEPT;  // -1: unknown id
int memprof_intern(const char* name, int32_t* id) MP_NOEXCEPT;
// The variables the op recorder of `target` (MpTarget) finds among an op's inputs, by
// storage pointer: their index and their layer's name id (-1 none).
int memprof_set_params(int32_t target, const uint64_t* ptrs, const int32_t* ids, const int32_t* layers,
                       size_t n) MP_NOEXCEPT;
int memprof_scope_push(int32_t id) MP_NOEXCEPT;
int memprof_scope_pop(void) MP_NOEXCEPT;

// Memory history and out-of-memory reports.
int memprof_history(int32_t on, uint64_t max_entries) MP_NOEXCEPT;
int memprof_set_oom_callback(MpOomCallback cb, void* ctx) MP_NOEXCEPT;
// Writes to standard output with write(2): no lock, no allocation (the OOM path).
int memprof_write_stdout(const char* buf, size_t len) MP_NOEXCEPT;
// The process's resident memory now and its peak, in bytes: /proc/self/statm's resident
// pages (read with one pread on a descriptor kept open) and getrusage's ru_maxrss. Two
// system calls, cheap enough for every record_stats.
int memprof_process_memory(int64_t* resident, int64_t* peak_resident) MP_NOEXCEPT;

// CUDA: allocator statistics, history, snapshot, peak reset and cache emptying. Each
// fails softly (an error, never a crash) without CUDA.
int memprof_cuda_stats(int32_t index, MpCudaStats* out) MP_NOEXCEPT;
// The driver's free and total memory of cuda:index (cudaMemGetInfo): a driver call, and
// on a device without a CUDA context it creates one; memprof_cuda_stats leaves them 0.
int memprof_cuda_memory_info(int32_t index, int64_t* free_bytes, int64_t* total_bytes) MP_NOEXCEPT;
int memprof_cuda_history(int32_t on, int64_t max_entries) MP_NOEXCEPT;
int memprof_cuda_snapshot(const char* path) MP_NOEXCEPT;
int memprof_cuda_control(int32_t index, int32_t what) MP_NOEXCEPT;
// The cuBLAS and cuBLASLt workspaces PyTorch holds now, at most `cap` of them written to
// `out`: returns how many there are (more than `cap`: call again with room for all),
// 0 before the first matrix product, -1 without CUDA or where this libtorch's workspace
// table has a layout not known to this build (an error names it).
int memprof_cuda_workspaces(MpWorkspace* out, int32_t cap) MP_NOEXCEPT;

// Mixed precision and RNG state (checkpointing).
int memprof_autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype,
                           MpAutocast* prev) MP_NOEXCEPT;
int memprof_autocast_exit(int32_t device_type, const MpAutocast* prev) MP_NOEXCEPT;
int memprof_rng_get(int32_t device_type, int32_t index, void** out) MP_NOEXCEPT;
int memprof_rng_set(int32_t device_type, int32_t index, const void* state) MP_NOEXCEPT;

// The estimator's dry run on the meta device. memprof_meta_begin installs the meta trace
// allocator and the missing meta kernels (once per process) and starts a trace (one at a
// time per process); memprof_meta_end stops it. memprof_meta_read copies the first
// min(total, cap) events; *total may exceed the trace's capacity (MP_META_CAPACITY), in
// which case the trace is incomplete.
int memprof_meta_begin(void) MP_NOEXCEPT;
// From now on (on = 1) each allocation of the meta trace keeps its call stack as a site
// (an alloc event's aux: the site id + 1, memprof_site reads it), the site table
// started anew; off (on = 0) again, and at the trace's end. Costly (an unwind per
// allocation): for the last step of a dry run. Fails while a profiled step keeps sites.
int memprof_meta_sites(int32_t on) MP_NOEXCEPT;
int memprof_meta_end(void) MP_NOEXCEPT;
int memprof_meta_mark(int32_t value) MP_NOEXCEPT;
int memprof_meta_read(MpTlEvent* out, uint64_t cap, uint64_t* total) MP_NOEXCEPT;
// A new meta tensor (an at::Tensor* the caller owns) of the given sizes, with the dtype
// of the tensor `like` (an at::Tensor*).
int memprof_meta_empty(const int64_t* sizes, size_t n, const void* like, void** out) MP_NOEXCEPT;
// Moves a tensor (at::Tensor*) onto the meta device in place: every handle that shares
// its TensorImpl sees it; the old storage is released.
int memprof_meta_convert(void* tensor) MP_NOEXCEPT;
// Sets how later dry runs run scaled_dot_product_attention (`set`: sm and backend; the
// run counts start again at 0) and/or reads the settings and the run counts (`get`).
// Either may be null.
int memprof_meta_attention(const MpAttention* set, MpAttention* get) MP_NOEXCEPT;
// The GPU later dry runs size CUDA's reduction buffers for: its streaming
// multiprocessors and the threads each holds at once (both > 0).
int memprof_meta_gpu(int32_t multiprocessors, int32_t threads_per_multiprocessor) MP_NOEXCEPT;
// The buffers CUDA's sum (or mean) takes from the caching allocator inside the kernel on
// a GPU of `multiprocessors` (threads each holds at once: `threads_per_multiprocessor`):
// an input of `ndim` `sizes` and `strides` (elements) at element `offset` of its
// storage, dtype `in_dtype` (a c10::ScalarType code), reduced into `out_dtype` over the
// `ndims` `dims` (ndims -1: every dim), `keepdim`. `*total` the buffers' count (a staging
// buffer and its semaphores per part, 0 where the reduction is not split across
// blocks), their bytes written to `out` up to `cap`, in the order taken.
int memprof_reduce_buffers(const int64_t* sizes, const int64_t* strides, uint64_t ndim,
                           int64_t offset, int32_t in_dtype, int32_t out_dtype,
                           const int64_t* dims, int64_t ndims, int32_t keepdim,
                           int32_t multiprocessors, int32_t threads_per_multiprocessor,
                           int64_t* out, uint64_t cap, uint64_t* total) MP_NOEXCEPT;
// cuDNN's convolution workspaces later dry runs charge where a call was measured: `len`
// bytes of text, a line a call, `key\tbytes\n` (the key: the op's name and arguments as
// the measuring script wrote them); empty (len 0): none measured, every convolution the
// rule's size. The text is copied (parsed anew at each call, a few hundred lines).
int memprof_meta_conv_workspaces(const char* table, size_t len) MP_NOEXCEPT;
// Autocast in the dry run (dryrun/autocast.cpp): from begin to end, on this thread, the ops
// of `list` (MP_AUTOCAST_LIST_CUDA or _CPU) cast meta tensors as that autocast casts
// its device's, to `dtype` (c10::ScalarType: BFloat16 or Half). Only during a meta trace.
int memprof_meta_autocast_begin(int32_t list, int32_t dtype) MP_NOEXCEPT;
int memprof_meta_autocast_end(void) MP_NOEXCEPT;
// One line per op ("aten::name.overload", then " policy" for the crate's lists) of
// `which` (MpAutocastList), NUL-terminated into buf (at most len - 1 bytes); *needed is
// the whole text's length.
int memprof_autocast_listing(int32_t which, char* buf, size_t len, uint64_t* needed) MP_NOEXCEPT;
// The meta-kernel inventory, taken from this process's dispatcher (the meta kernels
// registered first): one line per aten op ("aten::name.overload", a tab, then "ours" or
// "missing") that has a CPU kernel but no composite kernel and no meta kernel of
// libtorch's own: "ours" when tch-memprof registers it. NUL-terminated into buf as
// memprof_autocast_listing writes.
int memprof_meta_inventory(char* buf, size_t len, uint64_t* needed) MP_NOEXCEPT;
// Calls the aten op `op` (`aten::conv2d`), overload `overload` ("" for the default),
// with the named arguments `args` (n values, lists' elements included) matched to its
// schema, missing ones taking the schema's defaults; the op runs with `module` (a
// dotted module path, or NULL) as the layer the op recorder names. Its returns go to
// out (cap values, lists' elements included; *n_out written): tensors as new handles.
int memprof_program_call(const char* op, const char* overload, const char* module,
                         const MpValue* args, size_t n, MpValue* out, size_t cap,
                         size_t* n_out) MP_NOEXCEPT;
// TorchScript modules loaded onto the meta device (a handle the caller frees with
// memprof_script_free).
int memprof_script_load(const char* path, void** out) MP_NOEXCEPT;
int memprof_script_free(void* module) MP_NOEXCEPT;
int memprof_script_train(void* module, int32_t on) MP_NOEXCEPT;
// Forgets what the graph executor learnt in earlier calls (its profiles and optimized
// plans): the module's methods are cloned, its tensors shared, so that the next call is
// a fresh process's first.
int memprof_script_fresh(void* module) MP_NOEXCEPT;
// What forward's first input is, from where it goes in the inlined graph (through views,
// casts and reshapes): *kind = MP_INPUT_TOKENS where it is an embedding's indices,
// MP_INPUT_IMAGES where it is a 2-d convolution's input, else MP_INPUT_UNKNOWN.
int memprof_script_input_kind(void* module, int32_t* kind) MP_NOEXCEPT;
// The ops the file's `cpu` device constants feed (it was traced on the CPU, and on a GPU
// those ops make their tensors on the CPU), one a line, each once: at most len - 1 bytes
// and a NUL to buf, *needed the whole text's length.
int memprof_script_cpu_uses(void* module, char* buf, size_t len, uint64_t* needed) MP_NOEXCEPT;
// forward(inputs...) and the first tensor it returns (an at::Tensor* the caller owns).
// optimize != 0: through the graph executor's optimizations, as tch runs a file by
// default (from the second call: the profiled graph, its autodiff subgraphs); 0: as
// written, op by op (tch::jit::set_graph_executor_optimize(false)).
int memprof_script_forward(void* module, const void* const* inputs, size_t n, int32_t optimize,
                           void** out) MP_NOEXCEPT;
// Parameters (which = 0) or buffers (1), recursively: *n is their count; with
// index < *n, *tensor receives a new at::Tensor* sharing the i-th one and name_buf its
// dotted name (NUL-terminated, cut to len; *name_len: the name's full length).
int memprof_script_tensor(void* module, int32_t which, uint64_t index, uint64_t* n,
                          void** tensor, char* name_buf, size_t len, uint64_t* name_len)
    MP_NOEXCEPT;

// Self-checks for the tests: the CUDA block table (insert, find, remove of n fake
// blocks in a small table, with collisions and reuse; *errors counts mismatches), and a
// deliberate re-entry of the CPU allocation hook (the negative control of
// MpState.hook_reentries).
int memprof_selftest_block_table(uint64_t n, uint64_t* errors) MP_NOEXCEPT;
// The CUDA accounting path driven without a GPU: n fake cuda:0 blocks reported born and
// then dead, on this thread (other_thread 0) or another; *ns: the time of the reports.
int memprof_cuda_report_cost(uint64_t n, int32_t other_thread, uint64_t* ns) MP_NOEXCEPT;
int memprof_selftest_reenter(void) MP_NOEXCEPT;

#ifdef __cplusplus
}  // extern "C"
#endif

// ---------------------------------------------------------------------------------
// Layout: every struct size, field offset and shared constant, checked on both sides.
#include "memprof_layout.h"

#endif  // TCH_MEMPROF_H
