// The wait-avoiding, externally triggerable group allreduce of WAGMA-SGD (and the solo /
// majority partial allreduce of eager-SGD, which is the same mechanism over one group).
//
// Round k at rank i:
//  * The caller publishes its buffer (WAGMA: overwrite; eager-SGD: accumulate) and arrives.
//  * Activation: a rank that arrives at a round nobody activated yet (and may activate:
//    everyone in WAGMA and solo mode, only the round's initiator in majority mode) sends an
//    activation message to every rank. A rank's progress thread that receives the activation
//    of round k joins rounds up to k at once, even while the caller is still computing,
//    contributing the last published buffer (stale; eager-SGD then zeroes it).
//  * The group of round k (phases[k % L], from harness.schedules) sums the joined
//    contributions by allreduce. A caller that arrives after its round completed gets the
//    stored sum without waiting.
//  * Synchronous rounds (k % sync_every == sync_every - 1) are never joined on a rank's
//    behalf: they are an allreduce over all ranks of freshly published buffers, which bounds
//    how far any progress thread can run ahead of its caller.
//  * Quorum (quorum > 1; quorum == 1 is the rule above): round k is activated once `quorum`
//    callers have arrived at it. A caller arriving at a non-synchronous round k it has not
//    joined yet (k >= next_join_) counts its own arrival for k and sends an "arrived at k"
//    notice to every other rank (the activation channel, payload -(k+1)). Each progress thread
//    counts notices and its own caller's arrivals per round; once round k's count reaches
//    `quorum` (and k >= next_join_) it joins every round up to k, as on an activation. Every
//    rank receives the same notices, so a rank either reaches the quorum of k or has joined k
//    already. `may_activate` is ignored. Counts of rounds below next_join_ are dropped. The
//    first `quorum` arrivals all contribute fresh buffers (each published before sending its
//    notice, and its progress thread joins only once the count is reached); the other ranks
//    contribute what their buffer holds (stale; eager-SGD: what was added since it was last
//    taken).
// The op returns the group SUM and what the round was; the model-level rule (WAGMA's
// (sum + x) / (S + 1), eager-SGD's gradient step) lives in Python.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "listener.hpp"
#include "shm_collective.hpp"
#include "step_program.hpp"

namespace harness {

struct WaConfig {
  int64_t count = 0;
  int sync_every = 0;      // 0: never synchronous
  bool accumulate = false;  // eager-SGD: publish adds, contribution consumes
  int quorum = 1;           // arrivals that activate a round (1: the first may_activate arrival)
  std::vector<std::vector<int>> phases;  // this rank's group (world ranks, sorted) per phase
  int64_t ring_threshold_bytes = 64 * 1024;
  // The shared-memory channel of this rank's group per phase, and of all ranks for the
  // synchronous rounds; null where the members do not share a host (or have no segment).
  std::vector<std::shared_ptr<ShmChannel>> shm_phases;
  std::shared_ptr<ShmChannel> shm_sync;
};

struct RoundInfo {
  int64_t round = -1;
  bool sync = false;
  int group_size = 0;
  int64_t staleness = 0;   // round minus the round of the buffer this rank contributed
  bool joined_early = false;  // the progress thread joined before the caller arrived
  double t_join = 0, t_done = 0;
};

struct WaShared {
  std::mutex mu;
  std::vector<float> published;
  int64_t published_round = -1;
  struct Arrival {
    int64_t round;
    bool may_activate;
    float* out;
    std::shared_ptr<OpState> state;
    std::shared_ptr<RoundInfo> info;
  };
  std::deque<Arrival> arrivals;
  bool close_requested = false;
  std::optional<CommError> error;  // why the op failed: later arrivals fail at once with it
};

inline bool wa_is_sync_round(int64_t k, int sync_every) {
  return sync_every > 0 && k % sync_every == sync_every - 1;
}

class WaitAvoidingOp : public ListenerOp {
 public:
  WaitAvoidingOp(std::shared_ptr<OpState> st, SharedComm comm, int rank, int size, int tag_ub, WaConfig cfg,
                 std::shared_ptr<WaShared> shared);
  bool progress(Engine& e) override;
  bool finished() const override { return finished_; }
  bool passive() const override { return rounds_.empty() && act_sends_.empty() && !closing_; }

 private:
  struct Slot {
    std::shared_ptr<float[]> work;
    std::optional<StepExecutor> exec;
    std::unique_ptr<ShmTurn> turn;  // the round's allreduce on the shared-memory path instead
    bool done = false;
    RoundInfo info;
    float* out = nullptr;
    std::shared_ptr<OpState> state;
    std::shared_ptr<RoundInfo> info_out;
    int64_t bytes = 0;
  };

  void join(Engine& e, int64_t k);
  // Whether round k's allreduce takes the group's shared-memory channel (every member on this
  // host, nothing emulated among them, ShmChannel::wins); then its turn is taken.
  bool join_on_shm(Engine& e, Slot& slot, const std::vector<int>& members, const StepProgram& program);
  void activate(Engine& e, int64_t k);
  void on_activation(Engine& e, int64_t k);
  void notify_arrival(Engine& e, int64_t k);  // quorum > 1: this rank's caller arrived at k
  void count_arrival(Engine& e, int64_t k);   // quorum > 1: one more arrival at k (own or notice)
  void apply_quorum(Engine& e);               // quorum > 1: activates the latest round that has it
  void send_to_all(Engine& e, int64_t value);  // on the activation channel, synchronous sends
  bool deliver(Engine& e, int64_t k, Slot& slot);  // true if handed to the caller
  void post_listener();
  int tag_for(int64_t k) const { return 1 + static_cast<int>(k % (tag_ub_ - 1)); }
  std::shared_ptr<void> surrender_staging() override { return std::move(act_buf_); }
  void abort_rest(Engine& e, const CommError& error) override;

  int rank_, size_, tag_ub_;
  WaConfig cfg_;
  std::shared_ptr<WaShared> shared_;
  int64_t next_join_ = 0;
  std::map<int64_t, Slot> rounds_;
  std::shared_ptr<int64_t> act_buf_;  // the listening receive's buffer
  std::vector<OwnedSend<int64_t>> act_sends_;
  std::map<int64_t, int> arrived_;  // quorum > 1: arrivals counted per round >= next_join_
  bool closing_ = false;
  bool finished_ = false;
};

}  // namespace harness
