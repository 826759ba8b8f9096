// Push-sum gossip channel: sends go to any set of out-peers; whatever arrives from in-peers is
// added into an accumulator by the progress thread, whenever it arrives, without the receiver
// posting anything. The caller drains the accumulator when it wants (optionally waiting for a
// number of messages).
//
// Sends are synchronous (MPI_Issend), so a completed send has been matched by its receiver.
// flush() and close() are collective: every rank first waits for its own sends, then an
// ibarrier; after it every pushed message has been matched, so cancelling the one posted
// receive either succeeds (nothing left) or yields the last message. That makes the mass in
// the accumulators exact at quiescent points.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "schedule.hpp"

namespace harness {

struct PushShared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<float> accum;
  int64_t messages = 0;  // received and not yet drained
  int64_t total_received = 0;
  std::string error;
  struct Command {
    bool close;
    std::shared_ptr<OpState> state;
  };
  std::deque<Command> commands;
};

class PushListenerOp : public Op {
 public:
  PushListenerOp(std::shared_ptr<OpState> st, MPI_Comm comm, int64_t count, std::shared_ptr<PushShared> shared);
  ~PushListenerOp() override;
  bool progress(Engine& e) override;
  bool finished() const override { return finished_; }
  bool passive() const override { return !current_.state; }
  void abort(Engine& e, const std::string& reason) override;
  bool traced() const override { return false; }

 private:
  void post();
  void accumulate(const MPI_Status& status);

  MPI_Comm comm_;
  int64_t count_;
  std::shared_ptr<PushShared> shared_;
  std::unique_ptr<float[]> staging_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  PushShared::Command current_{false, nullptr};
  MPI_Request barrier_ = MPI_REQUEST_NULL;
  bool finished_ = false;
};

constexpr int kPushTag = 11;

}  // namespace harness
