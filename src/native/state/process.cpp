// The process as the kernel sees it: resident memory (current and peak), and writes to
// standard output with one write(2) loop: no lock (a thread holding Rust's stdout lock
// cannot stall it), no allocation; for the out-of-memory path.

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "../internal.h"

namespace memprof {

void process_memory(int64_t* resident, int64_t* peak_resident) {
  *resident = 0;
  *peak_resident = 0;
  // Opened once (a thread-safe local static) and read from offset 0 each time: the
  // kernel regenerates the text on every read.
  static const int statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  static const long page = sysconf(_SC_PAGESIZE);
  if (statm >= 0 && page > 0) {
    char buf[128];
    const ssize_t n = pread(statm, buf, sizeof(buf) - 1, 0);
    if (n > 0) {
      buf[n] = 0;
      // "size resident shared text lib data dt", in pages.
      char* end = nullptr;
      std::strtoll(buf, &end, 10);
      const long long pages = std::strtoll(end, nullptr, 10);
      *resident = int64_t(pages) * int64_t(page);
    }
  }
  // RUSAGE_THREAD: its ru_maxrss is the process's all the same (the larger of the
  // address space's high-water mark and the one kept in the signal struct, whichever
  // thread asks), where RUSAGE_SELF also takes the signal lock and sums the CPU times of
  // every thread: a cost that grows with libtorch's thread pools, for figures unused.
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) == 0) {
    *peak_resident = int64_t(ru.ru_maxrss) * 1024;  // kilobytes on Linux
  }
  // The kernel sums resident pages from per-CPU counters: two reads a moment apart can
  // disagree by a few pages. A peak is never below the current figure it reports with.
  *peak_resident = std::max(*peak_resident, *resident);
}

int write_stdout(const char* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    const ssize_t w = ::write(STDOUT_FILENO, buf + done, len - done);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      set_error("write to standard output failed");
      return -1;
    }
    done += size_t(w);
  }
  return 0;
}

}  // namespace memprof
