// The collectives of ranks that share a host, through a shared segment (shm_segment.hpp): no
// per-hop messages, no progress thread on the blocking path.
//
// Each operation runs in generations, one per chunk of at most a slot's bytes. In generation g
// a member (1) waits until every member is done with generation g-1 (only when it writes a
// shared slot), writes its part and publishes `arrived` = g; (2) waits for the arrivals it
// reads, computes its share (a reduction of its 1/p of the chunk over the slots in member order
// 0, 1, ..., p-1, so every member gets bitwise the same result), publishes `done` = g; (3) where
// it needs every member's share (allreduce, the root of reduce), waits for every `done` and
// copies the result out. A member publishes `arrived` = g only after it finished every read of
// earlier generations, which is what makes the result area safe to rewrite.
//
// An operation is a state machine: `advance` moves it as far as it can. Blocking, in the
// caller's thread (ShmChannel::run), it sleeps in the segment's wait; on the progress thread
// (ShmOp, for the nonblocking calls) it returns when a flag is not there yet. Operations of one
// channel run one after another, in the order they were posted, which is the same on every
// member.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dtype.hpp"
#include "engine.hpp"
#include "mpi_comm.hpp"
#include "shm_segment.hpp"
#include "step_program.hpp"

namespace harness {

enum class ShmKind { kAllreduce, kReduce, kBroadcast, kAllgather, kReduceScatter, kGather, kScatter, kBarrier };

// One call. `count` is in elements of `esz` bytes: the whole buffer for allreduce, reduce and
// broadcast (in place: in == out); one member's block for the others (allgather and gather:
// `in`, with `out` holding members x count; reduce_scatter and scatter: `out`, with `in`
// holding members x count); 0 for a barrier.
struct ShmCall {
  ShmKind kind = ShmKind::kBarrier;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  int esz = 4;
  ReduceFn reduce = nullptr;  // reductions only
  DivideFn divide = nullptr;  // AVG: the result is divided by divide_by
  int divide_by = 1;
  int root = 0;
  // What the op's record counts as bytes sent: the bytes the message path's step program would
  // send from this rank (ShmChannel::record_bytes), so that a run's traffic is counted alike on
  // both paths and as the simulator counts it.
  int64_t record_bytes = 0;
};

class ShmCollective {
 public:
  // What an `arrived` flag says instead of a count when its member gave the operation up
  // (host_hierarchy.hpp: a host's leader whose exchange with the other hosts failed).
  static constexpr int64_t kGaveUp = -1;

  ShmCollective(std::shared_ptr<ShmSegment> seg, ShmCall call, std::string what);
  // Generations the call takes (every member computes the same from the same call).
  static int64_t generations(const ShmSegment& seg, const ShmCall& call);
  // Whether the call copies directly between the members' buffers (ShmSegment::direct).
  static bool direct(const ShmSegment& seg, const ShmCall& call);
  void start_at(uint32_t first_generation) { gen0_ = first_generation; }
  const ShmCall& call() const { return call_; }
  // How far the operation got: changes whenever advance moves it on.
  int64_t position() const { return (chunk_ * 4 + stage_) * (int64_t{1} << 20) + cursor_; }
  // Moves the operation on; with `block` until it is done (`check` runs while it sleeps and
  // throws to give up). Returns whether it is done. Throws CommError.
  bool advance(bool block, const std::function<void()>& check);
  // Tells the members waiting for this one that it gave the operation up: publishes its first
  // `arrived` with kGaveUp, which they raise as an error. Only in the operation's turn, before
  // it wrote anything of its own.
  void announce_giving_up();

 private:
  void alone();  // the whole call when this member is the only one
  bool advance_direct(bool block, const std::function<void()>& check);
  bool writes_slot() const;
  bool waits_for_all_done() const;
  // Whether member m's flag has reached `target`: sleeps until it has when blocking.
  bool ready(ShmFlag& flag, int m, uint32_t target, bool block, const std::function<void()>& check);
  bool arrivals_ready(uint32_t g, bool block, const std::function<void()>& check);
  bool all_done(uint32_t g, bool block, const std::function<void()>& check);
  void write(int64_t e0, int64_t c);
  void compute(int64_t e0, int64_t c);
  void copy_out(int64_t e0, int64_t c);
  int64_t half_offset() const;  // where in its slot the chunk goes (a pipelined call alternates halves)
  void check_count(int m, uint32_t g) const;

  std::shared_ptr<ShmSegment> seg_;
  ShmCall call_;
  std::string what_;
  int64_t per_chunk_ = 0, chunks_ = 0, chunk_ = 0;
  uint32_t gen0_ = 0;
  bool direct_ = false;
  int stage_ = 0;
  int cursor_ = 0;           // the next member whose flag a stage still waits for
  double next_check_ = -1;  // nonblocking: when to check the awaited member's process next (-1: not waiting)
};

// The shared-memory path of one communicator or group whose members share a host: its segment
// and the order of its operations. Made collectively; null when the segment cannot be made.
class ShmTurn;

// Whether HARNESS_SHM=0 turns the shared-memory path off in this process.
bool shm_turned_off();
// The members of `comm` on this host (MPI_Comm_split_type; collective), as a communicator.
MpiComm members_on_this_host(MPI_Comm comm);

class ShmChannel : public std::enable_shared_from_this<ShmChannel> {
 public:
  static std::shared_ptr<ShmChannel> open(MPI_Comm comm, std::vector<int> world_ranks, int64_t slot_bytes,
                                          std::string* why_not);
  // The channel of `comm` (collective) when all its members run on this host and the
  // environment does not turn the path off (HARNESS_SHM=0 on any member); else null, with
  // `why_not` set only when a segment was wanted and could not be made.
  static std::shared_ptr<ShmChannel> open_on_host(MPI_Comm comm, std::vector<int> world_ranks, std::string* why_not);
  // Whether a call of `kind` moving `bytes` (its larger buffer) should take this path: up to
  // kMaxBytes, except a gather, scatter or allgather above one slot where the members cannot
  // read each other's memory (ShmSegment::direct): there MPI's own single-copy transfers were
  // faster than two copies through the slots (bench collectives, 2 ranks: allgather of 1 MiB
  // 0.76x MPI through the slots, 1.05x on the message path).
  bool wins(ShmKind kind, int64_t bytes) const {
    const bool copies = kind == ShmKind::kAllgather || kind == ShmKind::kGather || kind == ShmKind::kScatter;
    return bytes <= (copies && !seg_->direct() ? kSlotBytes : kMaxBytes);
  }
  const ShmSegment& segment() const { return *seg_; }

  // Runs the call in the calling thread, after every operation posted before it; records it.
  void run(Engine& engine, const char* name, const ShmCall& call);
  // The same for the progress thread: an Op that waits for its turn, then advances the call.
  std::unique_ptr<Op> op(const char* name, std::shared_ptr<OpState> state, const ShmCall& call);
  // The turns of several calls, taken together (nothing posted meanwhile comes between them),
  // for an operation of the progress thread made of them and more (host_hierarchy.hpp).
  std::vector<std::unique_ptr<ShmTurn>> turns(const std::vector<std::pair<const char*, ShmCall>>& calls);

  // The bytes `call`'s record counts: those of the step program `build()` makes (the message
  // path's), built once per kind, count, root and element size, then remembered.
  template <class Build>
  int64_t record_bytes(const ShmCall& call, Build&& build) {
    if (seg_->members() == 1) return 0;  // a member alone sends nothing on either path
    const BytesKey key{call.kind, call.count, call.root, call.esz};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = bytes_.find(key);
      if (it != bytes_.end()) return it->second;
    }
    const int64_t bytes = bytes_sent(build());
    std::lock_guard<std::mutex> lock(mu_);
    bytes_[key] = bytes;
    return bytes;
  }

  static constexpr int64_t kSlotBytes = 256 << 10;
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

 private:
  friend class ShmTurn;
  struct Ticket {
    uint64_t seq = 0;
    uint32_t first_gen = 0;
  };
  Ticket take(const ShmCall& call);  // under mu_
  // Blocks until ticket `seq` may run; throws the error an earlier operation failed with (the
  // caller then gives the turn up).
  void wait_turn(uint64_t seq, const std::function<void()>& check);
  bool my_turn(uint64_t seq);
  // Ends ticket `seq`'s turn; a failure breaks the channel (the members' generations no
  // longer agree), and every later operation fails with it.
  void end_turn(const std::optional<CommError>& failure);
  // Gives up ticket `seq` before its turn came (an aborted nonblocking call): that breaks the
  // channel as well, and the turn is skipped when it comes.
  void cancel(uint64_t seq, const CommError& failure);
  void break_with(const CommError& failure);  // under mu_
  void advance_turn();    // the next turn not cancelled; wakes the sleepers
  void skip_cancelled();  // under mu_: turn_ past the cancelled tickets

  std::shared_ptr<ShmSegment> seg_;
  // Turns: a ticket's operation runs when turn_ reaches its seq. turn_ is read without the lock
  // on the fast path (the previous operation ended); it changes under the lock, and a thread
  // that sleeps for its turn counts itself in sleepers_ so that ending a turn wakes it.
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_seq_ = 0;
  std::atomic<uint64_t> turn_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> broken_flag_{false};
  uint32_t next_gen_ = 1;  // the flags start at 0
  std::optional<CommError> broken_;
  std::set<uint64_t> cancelled_;  // under mu_
  using BytesKey = std::tuple<ShmKind, int64_t, int, int>;
  std::map<BytesKey, int64_t> bytes_;  // under mu_
  std::atomic<int> cancelled_count_{0};
};

// One call on the progress thread: its place in its channel's order and its progress. Dropped
// before it ended, it gives its turn up (which breaks the channel).
class ShmTurn {
 public:
  ShmTurn(std::shared_ptr<ShmChannel> channel, uint64_t seq, uint32_t first_gen, ShmCollective coll);
  ~ShmTurn();
  ShmTurn(const ShmTurn&) = delete;
  ShmTurn& operator=(const ShmTurn&) = delete;
  // Advances once its turn has come; true when the call is done (its turn then ends). Throws
  // the call's error, or the error an earlier call broke the channel with. `moved`: whether
  // anything happened (the progress thread sleeps while nothing does).
  bool poll(bool* moved = nullptr);
  // Ends the turn with `error` (or gives it up before it came). With `announce`, when its turn
  // has come, the members waiting for this one learn first that it gave up.
  void give_up(const CommError& error, bool announce = false);
  bool ended() const { return ended_; }
  const ShmCall& call() const { return coll_.call(); }

 private:
  std::shared_ptr<ShmChannel> channel_;
  uint64_t seq_;
  ShmCollective coll_;
  bool started_ = false, done_ = false, ended_ = false;
};

}  // namespace harness
