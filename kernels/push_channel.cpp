#include "push_channel.hpp"

namespace harness {

PushListenerOp::PushListenerOp(std::shared_ptr<OpState> st, SharedComm comm, int64_t count,
                               std::shared_ptr<PushShared> shared)
    : ListenerOp("push_listener", std::move(st), std::move(comm)),
      count_(count),
      shared_(std::move(shared)),
      staging_(new float[count > 0 ? count : 1]) {
  post();
}

void PushListenerOp::post() {
  // Any tag: the channel owns its communicator, and the tag is the message's round.
  listen(staging_.get(), static_cast<int>(count_), MPI_FLOAT, MPI_ANY_TAG, "MPI_Irecv(push)");
}

void PushListenerOp::keep(const MPI_Status& status) {
  int got = 0;
  MPI_Get_count(&status, MPI_FLOAT, &got);
  if (got != count_)
    throw CommError("push channel: rank " + std::to_string(status.MPI_SOURCE) + " pushed " + std::to_string(got) +
                    " floats into a channel of length " + std::to_string(count_));
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    const int64_t round = restore_round(status.MPI_TAG, shared_->newest_round);
    if (round > shared_->newest_round) shared_->newest_round = round;
    // The staging buffer becomes the kept message; the next receive gets a fresh one.
    shared_->rounds[round][{status.MPI_SOURCE, shared_->total_received}] = std::move(staging_);
    shared_->messages += 1;
    shared_->total_received += 1;
  }
  staging_.reset(new float[count_ > 0 ? count_ : 1]);
  shared_->cv.notify_all();
}

bool PushListenerOp::progress(Engine& e) {
  (void)e;
  bool any = false;
  MPI_Status status;
  while (heard(status, "push channel: a rank pushed a buffer longer than the channel's " + std::to_string(count_) +
                           " floats")) {
    keep(status);
    post();
    any = true;
  }
  if (!current_.state) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->commands.empty()) {
      current_ = shared_->commands.front();
      shared_->commands.pop_front();
      current_.state->mark_started();
    }
  }
  if (current_.state) {
    if (!closing_barrier_posted()) any = true;
    if (closing_barrier_done("MPI_Ibarrier(push)")) {
      // Every pushed message is matched by now; at most the posted receive holds one.
      if (stop_listening(status, "MPI_Wait(push)")) keep(status);
      if (current_.close) {
        finished_ = true;
      } else {
        post();
      }
      current_.state->finish();
      current_ = {false, nullptr};
      any = true;
    }
  }
  return any;
}

void PushListenerOp::abort_rest(Engine& e, const CommError& error) {
  (void)e;
  if (current_.state) current_.state->finish(error);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (auto& c : shared_->commands) c.state->finish(error);
    shared_->commands.clear();
    shared_->error = error;
  }
  shared_->cv.notify_all();
}

}  // namespace harness
