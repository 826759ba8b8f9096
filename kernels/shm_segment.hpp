// Shared memory among the ranks of one host: the segment the intranode collectives
// (shm_collective.hpp) run in, and the flags they publish and wait on.
//
// Layout, one mapping per member: a header, every member's pid, two flags per member (each on
// its own cache line: `arrived` and `done`, generation numbers), one data slot per member and
// one result area, each `slot_bytes` long. The file lives in a tmpfs directory (/dev/shm, or
// $HARNESS_SHM_DIR) and is unlinked as soon as every member has mapped it, so nothing is left
// behind when a process dies.
//
// Waiting never spins unbounded: a waiter polls a flag for a bounded time (when the host's
// members outnumber its cores it yields the core a few times instead), then sleeps in the
// kernel on the flag's futex until the publisher wakes it, checking every `kLivenessCheckS`
// that the member it waits for still lives.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace harness {

// One flag: a generation number a member publishes, how many waiters sleep on it (so that a
// publisher makes the wake-up system call only when someone sleeps), and what the publisher
// says of that generation (an `arrived` flag: its operation's element count, which the others
// check against theirs).
struct alignas(64) ShmFlag {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
  std::atomic<int64_t> info{0};
  // An `arrived` flag of a direct copy: where, in the publisher's own memory, its data lies
  // (ShmSegment::read_from reads it from there).
  std::atomic<uint64_t> addr{0};
};
static_assert(sizeof(ShmFlag) == 64, "one flag per cache line");

// Whether generation `value` is at or past `target` (generations wrap around at 2^32).
inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

class ShmSegment {
 public:
  // Collective over `comm`, whose members must all run on this host. Returns null when the
  // segment cannot be made on every member (no tmpfs space, a missing directory, ...); then
  // `why_not` says why, the same on every member, and nothing is left on disk.
  // `world_ranks[m]`: member m's world rank (for messages).
  static std::unique_ptr<ShmSegment> create(MPI_Comm comm, std::vector<int> world_ranks, int64_t slot_bytes,
                                            std::string* why_not);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int members() const { return members_; }
  int me() const { return me_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  char* slot(int member) const { return slots_ + static_cast<int64_t>(member) * slot_bytes_; }
  char* result() const { return slots_ + static_cast<int64_t>(members_) * slot_bytes_; }
  ShmFlag& arrived(int member) const { return flags_[2 * member]; }
  ShmFlag& done(int member) const { return flags_[2 * member + 1]; }
  int world_rank(int member) const { return world_[member]; }
  // Whether this member may poll before sleeping: only where the host's members fit its cores.
  bool may_spin() const { return may_spin_; }

  // Publishes `generation` (and `info`, `addr`) on `flag` and wakes whoever sleeps on it.
  static void publish(ShmFlag& flag, uint32_t generation, int64_t info = 0, uint64_t addr = 0);
  // Whether this member may read the others' memory directly (process_vm_readv, one copy
  // instead of two through a slot): probed when the segment is made, the same on every member;
  // HARNESS_SHM_DIRECT=0 on any member turns it off.
  bool direct() const { return direct_; }
  // Copies `bytes` from address `addr` of member `m`'s process into `local`. Throws CommError
  // (PeerLostError when the process is gone) naming `what`.
  void read_from(int m, uint64_t addr, void* local, size_t bytes, const std::string& what) const;
  // Blocks until member `m`'s `flag` reaches `target`. `check` runs every kLivenessCheckS of
  // sleeping (it throws to give up: a shutdown); a member whose process is gone makes this
  // throw a PeerLostError naming `what` and the member.
  void wait(ShmFlag& flag, int m, uint32_t target, const std::string& what, const std::function<void()>& check) const;
  // Throws a PeerLostError when member `m`'s process no longer exists.
  void check_alive(int m, const std::string& what) const;

  static constexpr double kSpinS = 20e-6;
  static constexpr int kYields = 8;  // oversubscribed: yields of the core before a futex sleep
  static constexpr double kLivenessCheckS = 0.05;

 private:
  ShmSegment() = default;

  void* base_ = nullptr;
  size_t length_ = 0;
  int members_ = 0, me_ = 0;
  int64_t slot_bytes_ = 0;
  std::vector<int> world_;
  const int32_t* pids_ = nullptr;
  std::vector<bool> checkable_;  // whether this member can see member m's process
  ShmFlag* flags_ = nullptr;
  char* slots_ = nullptr;
  bool may_spin_ = false;
  bool direct_ = false;
};

}  // namespace harness
