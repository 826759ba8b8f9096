// The caller side of AD-PSGD's asynchronous pairwise averaging (the protocol is in
// async_pairwise.hpp): the passive side publishes and drains, the active side requests.
#pragma once

#include <atomic>
#include <memory>

#include "async_pairwise.hpp"
#include "caller.hpp"

namespace harness {

class PairwiseAverager {
 public:
  // Collective over the engine's ranks: the averager gets a duplicate communicator of its own.
  // `initial` is the model this rank's progress thread answers with until the first publish.
  PairwiseAverager(std::shared_ptr<Engine> engine, FloatSpan initial);

  // Passive side: `buf` becomes the model the progress thread answers with.
  void publish(FloatSpan buf);
  // Active side: sends `buf` to `peer`, receives the peer's published model into `out`. Both
  // buffers must stay alive until the returned state is done.
  std::shared_ptr<OpState> request(FloatSpan buf, FloatSpan out, int peer);
  // Passive side: adds the pending corrections into `out`; returns how many requests they hold.
  int64_t drain(FloatSpan out);
  // Collective: returns once every request has been answered; throws the op's error.
  void close();

 private:
  void check_open() const;
  void check_length(FloatSpan buf, const char* what) const;

  std::shared_ptr<Engine> engine_;
  int64_t count_;
  std::shared_ptr<PairShared> shared_;
  SharedComm comm_;
  std::shared_ptr<OpState> listener_;
  std::atomic<bool> closed_{false};
};

}  // namespace harness
