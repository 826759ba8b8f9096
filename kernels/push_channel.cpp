#include "push_channel.hpp"

namespace harness {

PushListenerOp::PushListenerOp(std::shared_ptr<OpState> st, MPI_Comm comm, int64_t count,
                               std::shared_ptr<PushShared> shared)
    : Op("push_listener", std::move(st)),
      comm_(comm),
      count_(count),
      shared_(std::move(shared)),
      staging_(new float[count > 0 ? count : 1]) {
  post();
}

PushListenerOp::~PushListenerOp() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PushListenerOp::post() {
  // Any tag: the channel owns its communicator, and the tag is the message's round.
  check_mpi(MPI_Irecv(staging_.get(), static_cast<int>(count_), MPI_FLOAT, MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &req_),
            "MPI_Irecv(push)");
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
  for (;;) {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&req_, &flag, &status);
    if (rc != MPI_SUCCESS)
      throw failed_any_source_receive(rc, "push channel: a rank pushed a buffer longer than the channel's " +
                                              std::to_string(count_) + " floats");
    if (!flag) break;
    keep(status);
    post();
    any = true;
  }
  if (!current_.state) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->commands.empty()) {
      current_ = shared_->commands.front();
      shared_->commands.pop_front();
      current_.state->t_start = now();
    }
  }
  if (current_.state) {
    if (barrier_ == MPI_REQUEST_NULL) {
      check_mpi(MPI_Ibarrier(comm_, &barrier_), "MPI_Ibarrier(push)");
      any = true;
    }
    int flag = 0;
    check_mpi(MPI_Test(&barrier_, &flag, MPI_STATUS_IGNORE), "MPI_Test(push barrier)");
    if (flag) {
      // Every pushed message is matched by now; at most the posted receive holds one.
      MPI_Status status;
      MPI_Cancel(&req_);
      check_mpi(MPI_Wait(&req_, &status), "MPI_Wait(push)");
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) keep(status);
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

void PushListenerOp::abort(Engine& e, const std::string& reason) {
  (void)e;
  if (req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&req_);
    MPI_Request_free(&req_);
    staging_.release();  // MPI may still write into it: leak rather than free
  }
  if (current_.state) current_.state->finish(reason);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (auto& c : shared_->commands) c.state->finish(reason);
    shared_->commands.clear();
    shared_->error = reason;
  }
  shared_->cv.notify_all();
}

}  // namespace harness
