// The caller side of the wait-avoiding group allreduce (the protocol is in wait_avoiding.hpp):
// publishing and arriving at rounds, and the collective close.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "caller.hpp"
#include "wait_avoiding.hpp"

namespace harness {

class WaitAvoiding {
 public:
  // Collective over the engine's ranks. `initial` is what this rank contributes to a round
  // joined before its caller published anything (with `accumulate`, nothing: zeros);
  // `phases[j]` is this rank's group (world ranks, itself included) in phase j; `quorum` (in
  // [1, size], the same on every rank) is how many arrivals activate a round (1: the first one
  // that may activate).
  WaitAvoiding(std::shared_ptr<Engine> engine, FloatSpan initial, int sync_every, bool accumulate,
               std::vector<std::vector<int>> phases, int64_t ring_threshold_bytes, int quorum = 1);

  // What one arrival returns: its completion, and what the round was (filled in by then).
  struct Round {
    std::shared_ptr<OpState> state;
    std::shared_ptr<RoundInfo> info;
  };
  // Publishes `buf` (overwriting, or adding with `accumulate`) and arrives at the next round;
  // the group sum lands in `out`, which must stay alive until the round completes.
  // `may_activate` is ignored when quorum > 1.
  Round iround(FloatSpan buf, FloatSpan out, bool may_activate);

  // Collective: returns once every rank has run all its rounds; throws the op's error.
  void close();

  // How many phases' groups run their rounds through shared memory (every member on this host).
  int shm_phases() const { return shm_phases_; }

 private:
  // The shared-memory channels of this rank's group in each phase and of all ranks (collective).
  void open_shared_memory(WaConfig& cfg);

  std::shared_ptr<Engine> engine_;
  int shm_phases_ = 0;
  int64_t count_;
  bool accumulate_;
  std::shared_ptr<WaShared> shared_;
  std::shared_ptr<OpState> op_state_;
  int64_t next_round_ = 0;  // guarded by shared_->mu
  std::atomic<bool> closed_{false};
};

}  // namespace harness
