// Op, layer and scope names, interned once into a fixed table: no lock, no heap (a
// slot is claimed with a CAS on its hash), bounded probing and bounded waiting. The
// stored name drops the evaluate_function prefix of backward nodes. Also here: the C
// ABI's name lookups and interning, and the per-thread layer scopes.

#include <cstring>

#include "../internal.h"

namespace memprof {

namespace {
constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function";
constexpr uint32_t kMaxNameProbe = 256;
// Polls of a slot that another thread is filling before giving up on it (the filler
// copies at most kNameLen bytes, so this is never reached unless it was preempted).
constexpr uint32_t kMaxReadyPolls = 1u << 16;

struct NameSlot {
  std::atomic<uint64_t> hash;
  std::atomic<uint32_t> ready;
  memprof_flops::Kind kind;
  bool prefixed;  // the name began with the evaluate_function prefix (dropped here)
  bool whole;     // the name after it fit (not cut to kNameLen - 1)
  char name[kNameLen];
};
NameSlot g_names[kNameSlots];

// The name as stored: without the evaluate_function prefix of backward nodes.
inline const char* shown_name(const char* name, bool* prefixed) {
  constexpr size_t kPrefix = sizeof(kEvaluateFunction) - 1;
  *prefixed = name[0] == 'a' && name[1] == 'u' &&
      std::strncmp(name, kEvaluateFunction, kPrefix) == 0;
  if (!*prefixed) {
    return name;
  }
  const char* shown = name + kPrefix;
  while (*shown == ':' || *shown == ' ') {
    ++shown;
  }
  return shown;
}

// The last ids this thread interned, by the address of the name. An op's name is its
// schema's, at the same address every call, so most records find their id here and
// skip hashing the name; an address can be reused for another name (a record's own
// string), so a hit counts only when the name is the slot's, prefix included.
struct NameCacheEntry {
  const char* ptr;
  int32_t id;
};
constexpr uint32_t kNameCache = 64;
thread_local NameCacheEntry tls_name_cache[kNameCache];

inline uint32_t name_cache_index(const char* p) {
  const uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(p));
  return uint32_t((a >> 3) ^ (a >> 11)) & (kNameCache - 1);
}

inline uint64_t name_hash(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (size_t n = 0; *s && n < 4096; ++s, ++n) {
    h = (h ^ uint8_t(*s)) * 1099511628211ull;
  }
  return h | 1;  // 0 marks an empty slot
}
}  // namespace

namespace {
int32_t intern_slow(const char* name) {
  const uint64_t h = name_hash(name);
  uint32_t i = uint32_t(h) & (kNameSlots - 1);
  for (uint32_t probe = 0; probe < kMaxNameProbe; ++probe, i = (i + 1) & (kNameSlots - 1)) {
    NameSlot& slot = g_names[i];
    uint64_t cur = slot.hash.load(std::memory_order_acquire);
    if (cur == 0 && slot.hash.compare_exchange_strong(cur, h, std::memory_order_acq_rel)) {
      bool prefixed = false;
      const char* shown = shown_name(name, &prefixed);
      std::strncpy(slot.name, shown, kNameLen - 1);
      slot.name[kNameLen - 1] = 0;
      slot.prefixed = prefixed;
      slot.whole = std::strlen(shown) < kNameLen - 1;
      slot.kind = memprof_flops::classify(name);
      slot.ready.store(1, std::memory_order_release);
      return int32_t(i);
    }
    if (cur == h) {
      for (uint32_t n = 0; n < kMaxReadyPolls; ++n) {
        if (slot.ready.load(std::memory_order_acquire) != 0) {
          return int32_t(i);
        }
      }
      return -1;
    }
  }
  return -1;
}
}  // namespace

int32_t intern(const char* name) {
  if (!name) {
    name = "";
  }
  NameCacheEntry& e = tls_name_cache[name_cache_index(name)];
  if (e.ptr == name) {
    const NameSlot& slot = g_names[e.id];
    if (slot.whole) {
      bool prefixed = false;
      const char* shown = shown_name(name, &prefixed);
      if (prefixed == slot.prefixed && std::strcmp(shown, slot.name) == 0) {
        return e.id;
      }
    }
  }
  const int32_t id = intern_slow(name);
  if (id >= 0) {
    e = NameCacheEntry{name, id};
  }
  return id;
}

memprof_flops::Kind kind_of(int32_t id) {
  if (id < 0 || uint32_t(id) >= kNameSlots ||
      g_names[id].ready.load(std::memory_order_acquire) == 0) {
    return memprof_flops::Kind{memprof_flops::kUnknown, 0};
  }
  return g_names[id].kind;
}

const char* name_of(int32_t id) {
  if (id < 0 || uint32_t(id) >= kNameSlots ||
      g_names[id].ready.load(std::memory_order_acquire) == 0) {
    return nullptr;
  }
  return g_names[id].name;
}

// ---------------------------------------------------------------------------------
// For the C ABI.

int64_t copy_name(int32_t id, char* buf, size_t len) {
  const char* n = name_of(id);
  if (!n) {
    return -1;
  }
  const size_t l = std::strlen(n);
  if (buf && len > 0) {
    const size_t c = l < len - 1 ? l : len - 1;
    std::memcpy(buf, n, c);
    buf[c] = 0;
  }
  return int64_t(l);
}

int intern_checked(const char* name, int32_t* id) {
  *id = intern(name);
  if (*id < 0) {
    set_error("the name table is full");
    return -1;
  }
  return 0;
}

// Scopes name the layer of the ops run on this thread until the matching pop.
int scope_push(int32_t id) {
  OpStack& t = tls_ops;
  if (t.n_scope >= kMaxScopes) {
    set_error("scopes nested deeper than 32");
    return -1;
  }
  t.scopes[t.n_scope++] = id;
  return 0;
}

int scope_pop() {
  OpStack& t = tls_ops;
  if (t.n_scope <= 0) {
    set_error("no scope is open on this thread");
    return -1;
  }
  --t.n_scope;
  return 0;
}

}  // namespace memprof
