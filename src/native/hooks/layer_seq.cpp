// The layers of the training thread's ops, learned once and then looked up, so that
// leak hunting alone (no step timeline) need not ask libtorch for every op's inputs.
//
// An allocation's layer is the layer of the first VarStore variable among the inputs
// of the timeline-level op that makes it. Asking libtorch for op inputs makes it box
// every argument of every op, nested ones included, into IValues (tensors' reference
// counts, lists on the heap): on a CPU ResNet-18 training step that cost a percent or
// two of the step, where the rest of leak hunting costs a fraction of that. But a
// training loop runs the same ops in the same order every iteration. So, with leak
// hunting alone, the recorder asks for inputs in a *learning* iteration and keeps the
// sequence of the training thread's forward and optimizer timeline ops (name and
// layer); in the iterations after, registered without inputs, the n-th such op takes
// the layer of the n-th learned op if their names are the same. From the first op whose
// name differs (or past the learned sequence) the rest of the iteration has no layer
// (`(none)`, not the layer that ran last: that may be wrong there), and the next
// iteration learns again. The first
// two iterations learn (the first often differs: an optimizer's state is made at its
// first step), and every 64th after, so a change that keeps every op's name is not
// kept for long. A loop that does not repeat itself (three looking-up iterations in a
// row that met an op they did not learn) gets inputs for every op from then on, as
// before.
//
// State of the training thread only (the thread that started the session): read and
// written by its op callbacks and by begin_iteration, which it runs; only the count of
// entries ever written is read by other threads (the profiler's own memory).

#include "../internal.h"

namespace memprof {

namespace {
struct Learned {
  int32_t name;
  int32_t layer1;  // layer id + 1 of the op's first variable, 0 none
};
constexpr uint32_t kCapacity = uint32_t(1) << 20;  // ops an iteration; 8 MiB reserved
constexpr uint32_t kRelearnEvery = 64;             // iterations

struct LayerSeq {
  Learned* seq = nullptr;  // reserved at the first session that uses it
  bool on = false;         // this session learns and looks up (leak hunting alone)
  bool learning = true;    // this iteration asks for inputs and learns
  bool mismatch = false;   // this iteration met an op the sequence did not have
  uint32_t len = 0;        // ops learned
  uint32_t pos = 0;        // ops of this iteration so far
  uint32_t iterations = 0; // iterations since the session began
  uint32_t missed = 0;     // looking-up iterations in a row that met an unlearned op
  // Entries ever written (their memory is touched); read by any thread's statistics.
  std::atomic<uint32_t> high_water{0};
};
constexpr uint32_t kMissedLimit = 3;
LayerSeq g_seq;
}  // namespace

void layer_seq_start(bool on) {
  LayerSeq& s = g_seq;
  if (on && !s.seq) {
    s.seq = reserve<Learned>(kCapacity);
  }
  s.on = on && s.seq;
  s.learning = true;
  s.mismatch = false;
  s.len = 0;
  s.pos = 0;
  s.iterations = 0;
  s.missed = 0;
}

bool layer_seq_next_iteration() {
  LayerSeq& s = g_seq;
  if (!s.on) {
    return true;
  }
  ++s.iterations;
  if (!s.learning) {
    s.missed = s.mismatch ? s.missed + 1 : 0;
    if (s.missed >= kMissedLimit) {
      s.on = false;  // not a repeating loop: inputs for every op from now on
      return true;
    }
  }
  // Iterations 1 and 2 learn, then every kRelearnEvery-th and any after a miss.
  s.learning = s.iterations < 2 || s.mismatch || s.iterations % kRelearnEvery == 0;
  s.mismatch = false;
  s.pos = 0;
  if (s.learning) {
    s.len = 0;
  }
  return s.learning;
}

bool layer_seq_looks_up() {
  return g_seq.on && !g_seq.learning && tls_training_thread;
}

void layer_seq_learn(int32_t name, int32_t layer1) {
  LayerSeq& s = g_seq;
  if (!s.on || !s.learning || !tls_training_thread) {
    return;
  }
  const uint32_t i = s.pos++;
  if (i < kCapacity) {
    s.seq[i] = Learned{name, layer1};
    s.len = i + 1;
    if (s.len > s.high_water.load(std::memory_order_relaxed)) {
      s.high_water.store(s.len, std::memory_order_relaxed);
    }
  }
}

int32_t layer_seq_lookup(int32_t name) {
  LayerSeq& s = g_seq;
  if (s.mismatch) {
    return -1;
  }
  const uint32_t i = s.pos++;
  if (i < s.len && s.seq[i].name == name) {
    return s.seq[i].layer1;
  }
  s.mismatch = true;
  return -1;
}

uint64_t layer_seq_bytes() {
  return uint64_t(g_seq.high_water.load(std::memory_order_relaxed)) * sizeof(Learned);
}

}  // namespace memprof
