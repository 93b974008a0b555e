// What the training thread's ops take from their inputs, learned once and then looked
// up, so that neither leak hunting nor the step timeline need ask libtorch for every
// op's inputs in every iteration.
//
// From its inputs the recorder takes the layer and variable of a timeline-level op (the
// first VarStore variable among them) and, with the step timeline, the FLOPs of a
// counted op (conv, matmul: from the inputs' shapes). Asking libtorch for op inputs
// makes it box every argument of every op, nested ones included, into IValues (tensors'
// reference counts, lists on the heap): on a CPU ResNet-18 training step that cost a
// percent or two of the step, where the rest of the recording costs a fraction of that.
// But a training loop runs the same ops in the same order every iteration. So the
// recorder asks for inputs in a *learning* iteration and keeps, for each op that took
// something from its inputs, its name, layer, variable and FLOPs, and a signature of
// the sizes of every block the thread allocated before it in the iteration; in the
// iterations after, registered without inputs, the n-th such op takes what the n-th
// learned op took if their names and signatures are the same. The first two iterations
// learn (the first often differs: an optimizer's state is made at its first step), and
// every 64th after.
//
// Where they part (another op, or the same ops on blocks of other sizes: a batch of
// another shape, whose FLOPs differ):
// - leak hunting with the memory history: the rest of the iteration has no layer
//   (`(none)`, not the layer that ran last: that may be wrong there); leak hunting
//   alone learns its blocks' origins instead (below, BlockSeq), and registers no op
//   callback between its learning iterations;
// - with the step timeline: that op's FLOPs are logged as not counted, and the rest of
//   the iteration asks for inputs again (the callback is registered anew, with them),
//   so every later op is counted from its own inputs. A timeline op whose end parts
//   (it allocated other sizes) has the FLOPs looked up inside it logged as not counted
//   too (ops.cpp): the same bytes in can be another shape (8x32 tokens after 4x64).
// Either way the next iteration learns again. A loop that does not repeat itself (three
// looking-up iterations in a row that parted) gets inputs for every op from then on.
//
// The learned ops are state of the training thread only (the thread that started the
// session): read and written by its op callbacks, its allocations and begin_iteration,
// which it runs; only the count of entries ever written, the looked-up count and the
// parting flags are read or written by other threads. Ops on other threads (CUDA's
// backward runs on the autograd engine's device thread) do not look up: with the
// timeline, the first of them without inputs makes the rest of the iteration ask for
// them (not a parting). The learned blocks have a second sequence for the other
// threads' blocks, looked up by them.

#include "../internal.h"

namespace memprof {

namespace {
constexpr uint32_t kCapacity = uint32_t(1) << 20;  // ops an iteration; 32 MiB reserved
constexpr uint32_t kRelearnEvery = 64;             // iterations

struct Learned {
  int32_t name;
  bool end;      // a timeline op's end (checked, takes nothing), else an op's start
  OpInputs took;
  uint64_t sig;  // tls_hot.alloc_sig there
};
static_assert(sizeof(Learned) == 32, "the docs give a learned op's size");

struct OpSeq {
  Learned* seq = nullptr;  // reserved at the first session that uses it
  bool on = false;         // this session learns and looks up
  bool sizes = false;      // the sizes allocated matter (the timeline's FLOPs), not only names
  bool learning = true;    // this iteration asks for inputs and learns
  // This iteration met an op the sequence did not have; it asks for inputs (the timeline
  // after parting, the step detail). Written by any thread's op callback.
  std::atomic<bool> mismatch{false};
  std::atomic<bool> forced{false};
  uint32_t len = 0;        // ops learned
  uint32_t pos = 0;        // ops of this iteration so far
  uint32_t iterations = 0; // iterations since the session began
  uint32_t missed = 0;     // looking-up iterations in a row that parted
  // Entries ever written (their memory is touched); read by any thread's statistics.
  std::atomic<uint32_t> high_water{0};
  // Ops of this session that took what they needed from the learned ones.
  std::atomic<uint64_t> looked_up{0};
  // Blocks of other threads that took their learned origin (many writers).
  std::atomic<uint64_t> looked_up_other{0};
  // What this iteration's step log holds of its ops (MpRecords).
  std::atomic<int> records{MP_RECORDS_ALL};
};
constexpr uint32_t kMissedLimit = 3;
OpSeq g_seq;

// Leak hunting alone: the origin of each block, learned at its place in the iteration's
// allocations (see internal.h, op_seq_block_origin). Two sequences: the training
// thread's, and the other threads' together (CUDA's backward runs on the autograd
// engine's device thread; two threads allocating at once make its order differ, which
// parts, and the next iteration learns).
struct LearnedBlock {
  uint64_t key;  // size << 8 | device slot
  int32_t op;
  int32_t layer;
};
static_assert(sizeof(LearnedBlock) == 16, "the docs give a learned block's size");
constexpr uint32_t kBlockCapacity = uint32_t(1) << 20;  // blocks an iteration and sequence

enum BlockMode : int { kByRecords = 0, kLearnBlocks = 1, kLookUpBlocks = 2 };

// One cache line: what a block's look-up reads and writes besides its learned entry.
struct alignas(64) BlockSeq {
  LearnedBlock* seq[2] = {nullptr, nullptr};  // reserved at the first session that uses it
  // Learned, by sequence: written at iteration boundaries, read by any thread.
  std::atomic<uint32_t> len[2] = {{0}, {0}};
  std::atomic<uint32_t> pos[2] = {{0}, {0}};  // blocks of this iteration so far
  std::atomic<int> mode{kByRecords};          // this iteration's (BlockMode)
  bool ready = false;  // the last iteration learned (or looked up without parting)
  std::atomic<int64_t> high_water[2] = {{0}, {0}};  // entries ever written, by sequence
  // The training thread's blocks that took their learned origin (one writer).
  std::atomic<uint64_t> looked_up{0};
};
static_assert(sizeof(BlockSeq) == 64, "a block's look-up touches one line of it");
BlockSeq g_blocks;

inline uint64_t block_key(int dev, int64_t size) {
  return (uint64_t(size) << 8) | uint64_t(dev & 0xff);
}
}  // namespace

void op_seq_start(bool on, bool sizes) {
  OpSeq& s = g_seq;
  if (on && !s.seq) {
    s.seq = reserve<Learned>(kCapacity);
  }
  BlockSeq& b = g_blocks;
  // Leak hunting and the step timeline learn their blocks from the first iteration.
  const bool blocks = on && !g_hist_on.load();
  if (blocks && !b.seq[0]) {
    b.seq[0] = reserve<LearnedBlock>(kBlockCapacity);
    b.seq[1] = reserve<LearnedBlock>(kBlockCapacity);
  }
  b.ready = false;
  b.len[0].store(0);
  b.len[1].store(0);
  b.pos[0].store(0);
  b.pos[1].store(0);
  b.mode.store(blocks && b.seq[0] && b.seq[1] ? kLearnBlocks : kByRecords);
  s.on = on && s.seq;
  s.sizes = sizes;
  s.learning = true;
  s.mismatch.store(false);
  s.forced.store(false);
  s.len = 0;
  s.pos = 0;
  s.iterations = 0;
  s.missed = 0;
  s.looked_up.store(0);
  s.looked_up_other.store(0);
  g_blocks.looked_up.store(0);
  s.records.store(MP_RECORDS_ALL);
  tls_hot.alloc_sig = 0;
}

namespace {
// The iteration that ends leaves what it learned of its blocks (or whether its look-ups
// held).
void end_block_iteration() {
  BlockSeq& b = g_blocks;
  const int was = b.mode.load();
  if (was == kLearnBlocks) {
    for (int w = 0; w < 2; ++w) {
      const uint32_t n = b.pos[w].load();
      b.len[w].store(n < kBlockCapacity ? n : kBlockCapacity);
    }
    b.ready = true;
  } else if (was == kLookUpBlocks && b.pos[0].load() != b.len[0].load()) {
    // The training thread made fewer blocks than the learned iteration (more would
    // have parted): a layer or a branch skipped. Its loop differs: the next one learns.
    g_seq.mismatch.store(true);
    b.ready = false;
  } else if (was == kByRecords) {
    b.ready = false;  // parted, or ops recorded for another reason: learn anew
  }
}

// The next iteration learns its blocks, looks them up or takes origins from records.
void next_block_mode(bool by_blocks, bool learning) {
  BlockSeq& b = g_blocks;
  b.pos[0].store(0);
  b.pos[1].store(0);
  int mode = kByRecords;
  if (by_blocks && g_seq.on && b.seq[0] && b.seq[1]) {
    mode = learning || !b.ready ? kLearnBlocks : kLookUpBlocks;
  }
  b.mode.store(mode);
}
}  // namespace

bool op_seq_next_iteration(bool by_blocks) {
  OpSeq& s = g_seq;
  tls_hot.alloc_sig = 0;
  end_block_iteration();
  if (!s.on) {
    next_block_mode(false, true);
    return true;
  }
  ++s.iterations;
  if (!s.learning) {
    s.missed = s.mismatch.load() ? s.missed + 1 : 0;
    if (s.missed >= kMissedLimit) {
      s.on = false;  // not a repeating loop: inputs for every op from now on
      next_block_mode(false, true);
      return true;
    }
  }
  // Iterations 1 and 2 learn, then every kRelearnEvery-th and any after a miss.
  s.learning = s.iterations < 2 || s.mismatch.load() || s.iterations % kRelearnEvery == 0;
  if (!s.learning && by_blocks && !g_blocks.ready) {
    // Nothing learned of the blocks yet (the memory history ran): this one learns.
    s.learning = true;
  }
  s.mismatch.store(false);
  s.forced.store(false);
  s.pos = 0;
  if (s.learning) {
    s.len = 0;
  }
  next_block_mode(by_blocks, s.learning);
  return s.learning;
}

namespace {
// Every op's record for the rest of this iteration; its step log has the ops' events
// from here on only, if it had none.
void records_from_now() {
  int none = MP_RECORDS_NONE;
  g_seq.records.compare_exchange_strong(none, MP_RECORDS_AFTER);
  op_callback_want_records(MP_TARGET_STEP);
}
}  // namespace

void op_seq_set_records(int records) {
  g_seq.records.store(records);
}

int op_seq_records() {
  return g_seq.records.load();
}

bool op_seq_learning() {
  return g_seq.on && g_seq.learning;
}

void op_seq_record_all() {
  OpSeq& s = g_seq;
  s.forced.store(true);
  int expect = kLookUpBlocks;
  g_blocks.mode.compare_exchange_strong(expect, kByRecords);
  s.records.store(MP_RECORDS_ALL);
  op_callback_want_records(MP_TARGET_STEP);
}

void op_seq_relearn() {
  g_seq.mismatch.store(true);
}

bool op_seq_origins_learned() {
  return g_blocks.mode.load(std::memory_order_relaxed) == kLookUpBlocks;
}

namespace {
// Parted: another block here than the learned one. It has no origin; the rest of the
// iteration has every op's record with inputs (registered anew), and the next one
// learns. Only the training thread's parting counts as the loop differing (toward
// the three in a row after which every op is recorded for good): the other threads'
// order may vary from one iteration to the next (two devices' backward, a loader).
[[gnu::noinline]] void block_parted(int w, int32_t* op, int32_t* layer) {
  int expect = kLookUpBlocks;
  if (g_blocks.mode.compare_exchange_strong(expect, kByRecords)) {
    if (w == 0) {
      g_seq.mismatch.store(true, std::memory_order_relaxed);
    }
    g_seq.forced.store(true);
    records_from_now();
  }
  *op = -1;
  *layer = -1;
}

// Every case but the training thread's look-up: by records, learning, other threads.
[[gnu::noinline]] void block_origin_slow(int mode, int dev, int64_t size, int32_t* op,
                                         int32_t* layer) {
  BlockSeq& b = g_blocks;
  if (mode == kByRecords) {
    current_origin(op, layer);
    return;
  }
  const int w = tls_hot.training_thread ? 0 : 1;
  // The training thread's position has one writer: no read-modify-write (a locked
  // instruction an allocation).
  const uint32_t i = w == 0 ? b.pos[0].load(std::memory_order_relaxed)
                            : b.pos[1].fetch_add(1, std::memory_order_relaxed);
  if (w == 0) {
    b.pos[0].store(i + 1, std::memory_order_relaxed);
  }
  const uint64_t key = block_key(dev, size);
  if (mode == kLearnBlocks) {
    current_origin(op, layer);
    if (i < kBlockCapacity) {
      b.seq[w][i] = LearnedBlock{key, *op, *layer};
      // Pages touched: the most entries each sequence ever wrote.
      atomic_max(b.high_water[w], int64_t(i) + 1);
    }
    return;
  }
  // Looking up here is another thread's (op_seq_block_origin takes the training
  // thread's): the other threads' sequence.
  if (i < b.len[1].load(std::memory_order_relaxed) && b.seq[1][i].key == key) {
    *op = b.seq[1][i].op;
    *layer = b.seq[1][i].layer;
    g_seq.looked_up_other.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  block_parted(1, op, layer);
}
}  // namespace

// The training thread's look-up (nearly every allocation of a steady iteration) inline
// here, in a few lines of code; every other case out of line.
void op_seq_block_origin(int dev, int64_t size, int32_t* op, int32_t* layer) {
  BlockSeq& b = g_blocks;
  const int mode = b.mode.load(std::memory_order_relaxed);
  if (__builtin_expect(mode != kLookUpBlocks || !tls_hot.training_thread, 0)) {
    block_origin_slow(mode, dev, size, op, layer);
    return;
  }
  const uint32_t i = b.pos[0].load(std::memory_order_relaxed);
  b.pos[0].store(i + 1, std::memory_order_relaxed);
  if (__builtin_expect(
          i < b.len[0].load(std::memory_order_relaxed) && b.seq[0][i].key == block_key(dev, size),
          1)) {
    *op = b.seq[0][i].op;
    *layer = b.seq[0][i].layer;
    // One writer, the training thread.
    b.looked_up.store(b.looked_up.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return;
  }
  block_parted(0, op, layer);
}

void op_seq_stop_blocks() {
  int expect = kLookUpBlocks;
  if (g_blocks.mode.compare_exchange_strong(expect, kByRecords)) {
    g_seq.forced.store(true);
    records_from_now();
  } else {
    g_blocks.mode.store(kByRecords);
  }
}

namespace {
void learn(int32_t name, bool end, const OpInputs& took) {
  OpSeq& s = g_seq;
  if (!s.on || !tls_hot.training_thread) {
    return;
  }
  if (!s.learning) {
    // Inputs in a looking-up iteration (another callback asked for them): the op takes
    // its own, and keeps its place in the sequence.
    if (!s.mismatch.load(std::memory_order_relaxed)) {
      ++s.pos;
    }
    return;
  }
  const uint32_t i = s.pos++;
  if (i < kCapacity) {
    s.seq[i] = Learned{name, end, took, tls_hot.alloc_sig};
    s.len = i + 1;
    if (s.len > s.high_water.load(std::memory_order_relaxed)) {
      s.high_water.store(s.len, std::memory_order_relaxed);
    }
  }
}

// The learned entry the training thread's next op start or end matches, or null (it
// parts from the learned ops: the rest of the iteration does too).
const Learned* match(int32_t name, bool end) {
  OpSeq& s = g_seq;
  if (s.mismatch.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  const uint32_t i = s.pos++;
  if (i < s.len && s.seq[i].name == name && s.seq[i].end == end &&
      (!s.sizes || s.seq[i].sig == tls_hot.alloc_sig)) {
    return &s.seq[i];
  }
  s.mismatch.store(true, std::memory_order_relaxed);
  return nullptr;
}
}  // namespace

void op_seq_learn(int32_t name, const OpInputs& took) {
  learn(name, false, took);
}

bool op_seq_lookup(int32_t name, OpInputs* took) {
  const Learned* e = match(name, false);
  if (!e) {
    return false;
  }
  *took = e->took;
  // One writer, the training thread.
  std::atomic<uint64_t>& n = g_seq.looked_up;
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return true;
}

bool op_seq_looking_up() {
  const OpSeq& s = g_seq;
  return tls_hot.training_thread && s.on && !s.learning &&
      !s.forced.load(std::memory_order_relaxed);
}

bool op_seq_op_end(int32_t name) {
  const OpSeq& s = g_seq;
  if (!tls_hot.training_thread || !s.on || !s.sizes) {
    return true;
  }
  if (s.learning) {
    learn(name, true, OpInputs{});
  } else if (!s.forced.load(std::memory_order_relaxed) && !match(name, true)) {
    // Another op, or blocks of other sizes: the next ops' inputs may have other shapes.
    op_seq_ask_inputs(true);
    return false;
  }
  return true;
}

void op_seq_ask_inputs(bool parted) {
  OpSeq& s = g_seq;
  if (parted) {
    s.mismatch.store(true, std::memory_order_relaxed);
  }
  if (!s.forced.exchange(true)) {
    op_callback_want_inputs(MP_TARGET_STEP);
  }
}

uint64_t op_seq_looked_up() {
  return g_seq.looked_up.load(std::memory_order_relaxed) +
      g_blocks.looked_up.load(std::memory_order_relaxed) +
      g_seq.looked_up_other.load(std::memory_order_relaxed);
}

uint64_t op_seq_bytes() {
  return uint64_t(g_seq.high_water.load(std::memory_order_relaxed)) * sizeof(Learned) +
      uint64_t(g_blocks.high_water[0].load(std::memory_order_relaxed) +
               g_blocks.high_water[1].load(std::memory_order_relaxed)) *
      sizeof(LearnedBlock);
}

}  // namespace memprof
