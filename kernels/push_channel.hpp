// Push-sum gossip channel: sends go to any set of out-peers; whatever arrives from in-peers is
// kept by the progress thread, whenever it arrives, without the receiver posting anything. The
// caller drains what arrived when it wants (optionally waiting for a number of messages).
//
// Every message is tagged with its gossip round (the MPI tag carries the round modulo
// kPushRoundModulus; the listener restores the full round from the newest round it has seen, so
// rounds in flight at once must span fewer than half the modulus). Arrivals are kept per round
// and per source, and a drain adds them in a fixed order (round, then source rank, then arrival
// order from that source), never in arrival order: float addition is not associative, and a
// run must not depend on which in-peer happened to be faster. Draining one round (SGP's blocking
// mix of round t) leaves later rounds' early arrivals for their own round.
//
// Sends are synchronous (MPI_Issend), so a completed send has been matched by its receiver.
// flush() and close() are collective: every rank first waits for its own sends, then an
// ibarrier; after it every pushed message has been matched (by the listener's probe), so
// stopping the listener receives at most that last matched message and nothing else can come.
// That makes the mass in the accumulators exact at quiescent points.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "listener.hpp"
#include "step_program.hpp"

namespace harness {

struct PushShared {
  std::mutex mu;
  std::condition_variable cv;
  // Arrived, not yet drained: round -> (source rank, arrival index) -> message. std::map keeps
  // both levels sorted, which is the drain order.
  std::map<int64_t, std::map<std::pair<int, int64_t>, std::unique_ptr<float[]>>> rounds;
  int64_t messages = 0;  // received and not yet drained, all rounds
  int64_t total_received = 0;
  int64_t newest_round = 0;  // the newest round any arrival carried (restores rounds from tags)
  std::optional<CommError> error;  // why the listener failed
  struct Command {
    bool close;
    std::shared_ptr<OpState> state;
  };
  std::deque<Command> commands;
};

class PushListenerOp : public ListenerOp {
 public:
  PushListenerOp(std::shared_ptr<OpState> st, SharedComm comm, int64_t count, std::shared_ptr<PushShared> shared);
  bool progress(Engine& e) override;
  bool finished() const override { return finished_; }
  bool passive() const override { return !current_.state; }

 private:
  void post();
  void keep(const MPI_Status& status);
  std::shared_ptr<void> surrender_staging() override { return std::shared_ptr<float[]>(std::move(staging_)); }
  void abort_rest(Engine& e, const CommError& error) override;

  int64_t count_;
  std::shared_ptr<PushShared> shared_;
  std::unique_ptr<float[]> staging_;
  PushShared::Command current_{false, nullptr};
  bool finished_ = false;
};

// The MPI tag of a push is its round modulo this (MPI guarantees tags up to 32767).
constexpr int kPushRoundModulus = 32768;

// The full round of a message whose tag is `tag`, given the newest round seen so far: the round
// congruent to `tag` nearest to `newest` (rounds in flight span far less than half the modulus).
inline int64_t restore_round(int tag, int64_t newest) {
  int64_t delta = ((static_cast<int64_t>(tag) - newest) % kPushRoundModulus + kPushRoundModulus) % kPushRoundModulus;
  if (delta >= kPushRoundModulus / 2) delta -= kPushRoundModulus;
  return newest + delta;
}

}  // namespace harness
