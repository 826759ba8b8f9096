#include "shm_segment.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common.hpp"

namespace harness {

namespace {

constexpr uint32_t kMagic = 0x48534d31;  // "HSM1"
constexpr size_t kLine = 64;
constexpr int kNameBytes = 256;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Header {
  uint32_t magic;
  int32_t members;
  int64_t slot_bytes;
};

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_s) {
#ifdef __linux__
  timespec ts{static_cast<time_t>(timeout_s), static_cast<long>((timeout_s - static_cast<time_t>(timeout_s)) * 1e9)};
  // Not FUTEX_PRIVATE: the word is in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(timeout_s, 1e-4)));
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
#ifdef __linux__
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether process `pid` is alive: it exists and is not a zombie (a rank that exited but that
// its launcher has not reaped yet is gone all the same).
bool process_alive(int32_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return true;  // no /proc: kill's answer stands
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* paren = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

// Reads `bytes` at `remote` of process `pid` into `local`; 0 or errno.
int read_process(int32_t pid, uint64_t remote, void* local, size_t bytes) {
#ifdef __linux__
  size_t got = 0;
  while (got < bytes) {
    iovec here{static_cast<char*>(local) + got, bytes - got};
    iovec there{reinterpret_cast<void*>(remote + got), bytes - got};
    const ssize_t n = process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n < 0) return errno;
    if (n == 0) return EFAULT;
    got += static_cast<size_t>(n);
  }
  return 0;
#else
  (void)pid, (void)remote, (void)local, (void)bytes;
  return ENOSYS;
#endif
}

std::string shm_dir() {
  const char* dir = std::getenv("HARNESS_SHM_DIR");
  return dir && *dir ? dir : "/dev/shm";
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(MPI_Comm comm, std::vector<int> world_ranks, int64_t slot_bytes,
                                               std::string* why_not) {
  int me = 0, members = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &members);
  if (static_cast<int>(world_ranks.size()) != members) throw CommError("shared segment: one world rank per member");
  slot_bytes = static_cast<int64_t>(round_up(static_cast<size_t>(std::max<int64_t>(slot_bytes, kLine)), kLine));
  const size_t header = kLine;
  const size_t pids = round_up(sizeof(int32_t) * static_cast<size_t>(members), kLine);
  const size_t flags = sizeof(ShmFlag) * 2 * static_cast<size_t>(members);
  const size_t length = header + pids + flags + static_cast<size_t>(slot_bytes) * (static_cast<size_t>(members) + 1);

  // Member 0 makes the file and names it; the others open it. Any failure anywhere is agreed on
  // (MPI_MIN of ok) so that every member takes the same path.
  char name[kNameBytes] = {0};
  std::string why;
  int fd = -1;
  if (me == 0) {
    static std::atomic<int> made{0};
    std::snprintf(name, sizeof(name), "%s/harness-shm-%d-%d-%d", shm_dir().c_str(), static_cast<int>(getpid()),
                  made.fetch_add(1), world_ranks[0]);
    fd = ::open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      why = std::string("cannot create ") + name + ": " + std::strerror(errno);
    } else {
      // posix_fallocate reserves the pages now: a full tmpfs fails here, not with SIGBUS later.
      int rc = ftruncate(fd, static_cast<off_t>(length));
      if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(length));
      else rc = errno;
      if (rc != 0) why = "cannot reserve " + std::to_string(length) + " bytes in " + name + ": " + std::strerror(rc);
    }
  }
  int ok = why.empty() ? 1 : 0;
  check_mpi(MPI_Bcast(name, kNameBytes, MPI_CHAR, 0, comm), "MPI_Bcast(shared segment name)");
  check_mpi(MPI_Bcast(&ok, 1, MPI_INT, 0, comm), "MPI_Bcast(shared segment)");
  if (me != 0 && ok) {
    fd = ::open(name, O_RDWR | O_CLOEXEC);
    if (fd < 0) why = std::string("cannot open ") + name + ": " + std::strerror(errno);
  }
  void* base = MAP_FAILED;
  if (fd >= 0 && why.empty()) {
    base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) why = std::string("cannot map ") + name + ": " + std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
  int mine = why.empty() ? 1 : 0, all = 0;
  check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(shared segment)");
  // Every member has opened the file (or failed): the name can go.
  check_mpi(MPI_Barrier(comm), "MPI_Barrier(shared segment)");
  if (me == 0 && name[0]) ::unlink(name);
  if (!all) {
    if (base != MAP_FAILED) munmap(base, length);
    // Every member reports the first failure, wherever it happened.
    int first = mine ? members : me, who = 0;
    check_mpi(MPI_Allreduce(&first, &who, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(shared segment)");
    char text[kNameBytes] = {0};
    if (me == who) std::snprintf(text, sizeof(text), "%s", why.c_str());
    check_mpi(MPI_Bcast(text, kNameBytes, MPI_CHAR, who, comm), "MPI_Bcast(shared segment)");
    if (why_not) *why_not = "rank " + std::to_string(world_ranks[who]) + ": " + text;
    return nullptr;
  }

  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->base_ = base;
  seg->length_ = length;
  seg->members_ = members;
  seg->me_ = me;
  seg->slot_bytes_ = slot_bytes;
  seg->world_ = std::move(world_ranks);
  char* p = static_cast<char*>(base);
  auto* head = reinterpret_cast<Header*>(p);
  auto* pid_table = reinterpret_cast<int32_t*>(p + header);
  seg->pids_ = pid_table;
  seg->flags_ = reinterpret_cast<ShmFlag*>(p + header + pids);
  seg->slots_ = p + header + pids + flags;
  // The file is zero-filled: flags start at generation 0. Each member writes its own pid.
  pid_table[me] = static_cast<int32_t>(getpid());
  if (me == 0) *head = Header{kMagic, members, slot_bytes};
  // Direct reads need the others' permission to read this process's memory: where Yama
  // restricts that to a process's ancestors (ptrace_scope 1), allow any process of this user
  // (an error where there is no Yama is harmless). Each member's `arrived` flag holds where its
  // mapping of the segment starts, for the probe below.
#ifdef __linux__
  const char* direct_env = std::getenv("HARNESS_SHM_DIRECT");
  const bool direct_wanted = !(direct_env && std::string(direct_env) == "0");
  if (direct_wanted) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#else
  const bool direct_wanted = false;
#endif
  seg->flags_[2 * me].addr.store(reinterpret_cast<uint64_t>(base), std::memory_order_relaxed);
  const unsigned cores = std::thread::hardware_concurrency();
  seg->may_spin_ = cores > 0 && static_cast<unsigned>(members) <= cores;
  check_mpi(MPI_Barrier(comm), "MPI_Barrier(shared segment)");  // pids and header visible to all
  // A member in another pid namespace (a container of its own) cannot be watched: no liveness
  // checks of it from here.
  seg->checkable_.resize(static_cast<size_t>(members));
  for (int m = 0; m < members; ++m) seg->checkable_[m] = kill(pid_table[m], 0) == 0 || errno == EPERM;
  if (head->magic != kMagic || head->members != members || head->slot_bytes != slot_bytes)
    throw CommError("shared segment: members disagree on its layout", ErrorKind::kInternal);
  // The probe: read every other member's header through its own mapping.
  int direct = direct_wanted ? 1 : 0;
  for (int m = 0; m < members && direct; ++m) {
    Header theirs{};
    const uint64_t at = seg->flags_[2 * m].addr.load(std::memory_order_relaxed);
    direct = m == me || (read_process(pid_table[m], at, &theirs, sizeof(theirs)) == 0 && theirs.magic == kMagic);
  }
  int all_direct = 0;
  check_mpi(MPI_Allreduce(&direct, &all_direct, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(direct reads)");
  seg->direct_ = all_direct == 1;
  return seg;
}

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, length_);
}

void ShmSegment::publish(ShmFlag& flag, uint32_t generation, int64_t info, uint64_t addr) {
  // ordered before the value by its seq_cst store
  flag.info.store(info, std::memory_order_relaxed);
  flag.addr.store(addr, std::memory_order_relaxed);
  flag.value.store(generation, std::memory_order_seq_cst);
  if (flag.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&flag.value);
}

void ShmSegment::read_from(int m, uint64_t addr, void* local, size_t bytes, const std::string& what) const {
  const int rc = read_process(pids_[m], addr, local, bytes);
  if (rc == 0) return;
  if (rc == ESRCH) check_alive(m, what);
  throw CommError(what + ": cannot read member " + std::to_string(m) + "'s data (rank " + std::to_string(world_[m]) +
                      ", pid " + std::to_string(pids_[m]) + "): " + std::strerror(rc),
                  rc == ESRCH ? ErrorKind::kPeerLost : ErrorKind::kInternal);
}

void ShmSegment::check_alive(int m, const std::string& what) const {
  const int32_t pid = pids_[m];
  if (pid > 0 && checkable_[static_cast<size_t>(m)] && !process_alive(pid))
    throw CommError(what + ": member " + std::to_string(m) + " (rank " + std::to_string(world_[m]) + ", pid " +
                        std::to_string(pid) + ") exited (its process is gone)",
                    ErrorKind::kPeerLost);
}

void ShmSegment::wait(ShmFlag& flag, int m, uint32_t target, const std::string& what,
                      const std::function<void()>& check) const {
  if (reached(flag.value.load(std::memory_order_acquire), target)) return;
  if (may_spin_) {
    const double until = now() + kSpinS;
    for (int i = 1;; ++i) {
      cpu_relax();
      if (reached(flag.value.load(std::memory_order_acquire), target)) return;
      if (i % 64 == 0 && now() > until) break;
    }
  } else {
    // More members than cores: the awaited one may need this core. Give it away a few times
    // (a yield lets a runnable member run at once, cheaper than a futex sleep and wake-up),
    // then sleep.
    for (int i = 0; i < kYields; ++i) {
      std::this_thread::yield();
      if (reached(flag.value.load(std::memory_order_acquire), target)) return;
    }
  }
  for (;;) {
    flag.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = flag.value.load(std::memory_order_seq_cst);
    if (!reached(seen, target)) futex_wait(&flag.value, seen, kLivenessCheckS);
    flag.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(flag.value.load(std::memory_order_acquire), target)) return;
    check_alive(m, what);
    if (check) check();
  }
}

}  // namespace harness
