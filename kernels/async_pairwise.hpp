// Asynchronous pairwise averaging of AD-PSGD: active ranks ask, passive ranks' progress threads
// answer, so a passive rank never stops computing to gossip.
//
// request(x, peer) (active side): x goes to the passive peer, whose progress thread replies with
// its view of the passive model (last published plus corrections since), moves that view to the
// pairwise average and records the move as a pending correction. It serves one request at a
// time, as the reference implementations do (the WAGMA-SGD repository's AD-PSGD probes, swaps
// and averages before it probes again): a request that arrives while a reply is still leaving
// waits for it. The active side gets the peer's model and moves its own half-way there; the
// passive caller adds the pending corrections whenever it drains them. Both end up at the
// pairwise average, each applied to its current (possibly newer) model, as in Lian et al. 2018.
//
// close() is collective: active callers have waited for their requests (a request completes
// only after its reply arrived, i.e. after the passive side matched it); replies are waited
// for; an ibarrier; then the listener is cancelled, so nothing is left in flight.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "listener.hpp"
#include "step_program.hpp"

namespace harness {

struct PairShared {
  std::mutex mu;
  std::vector<float> published;
  std::vector<float> correction;  // sum of pending (x_active - published) / 2
  int64_t answered = 0;           // requests answered since the last drain
  std::optional<CommError> error;  // why the listener failed
  bool close_requested = false;
};

constexpr int kPairRequestTag = 21;
constexpr int kPairReplyTag = 22;

class PairListenerOp : public ListenerOp {
 public:
  PairListenerOp(std::shared_ptr<OpState> st, SharedComm comm, int64_t count, std::shared_ptr<PairShared> shared);
  bool progress(Engine& e) override;
  bool finished() const override { return finished_; }
  bool passive() const override { return replies_.empty() && !closing_ && listening(); }

 private:
  void post();
  std::shared_ptr<void> surrender_staging() override { return std::move(staging_); }
  void abort_rest(Engine& e, const CommError& error) override;

  int64_t count_;
  std::shared_ptr<PairShared> shared_;
  std::shared_ptr<float[]> staging_;
  std::deque<OwnedSend<float[]>> replies_;
  bool closing_ = false;
  bool finished_ = false;
};

}  // namespace harness
