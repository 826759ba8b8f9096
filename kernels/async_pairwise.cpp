#include "async_pairwise.hpp"

#include <cstring>

namespace harness {

PairListenerOp::PairListenerOp(std::shared_ptr<OpState> st, MPI_Comm comm, int64_t count,
                               std::shared_ptr<PairShared> shared)
    : Op("pair_listener", std::move(st)),
      comm_(comm),
      count_(count),
      shared_(std::move(shared)),
      staging_(new float[count > 0 ? count : 1]) {
  post();
}

PairListenerOp::~PairListenerOp() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PairListenerOp::post() {
  check_mpi(MPI_Irecv(staging_.get(), static_cast<int>(count_), MPI_FLOAT, MPI_ANY_SOURCE, kPairRequestTag, comm_,
                      &req_),
            "MPI_Irecv(pair request)");
}

bool PairListenerOp::progress(Engine& e) {
  bool any = false;
  for (;;) {
    // One request at a time, as the reference implementations serve them: the next request is
    // received only once the reply to the previous one has left (its send completed).
    while (!replies_.empty() && e.test_send(*replies_.front().first)) {
      replies_.pop_front();
      any = true;
    }
    if (!replies_.empty()) break;
    if (req_ == MPI_REQUEST_NULL) {
      post();
      any = true;
    }
    int flag = 0;
    MPI_Status status;
    if (int rc = MPI_Test(&req_, &flag, &status); rc != MPI_SUCCESS)
      throw failed_any_source_receive(rc, "pairwise averaging: a rank sent a model longer than " +
                                              std::to_string(count_) + " floats");
    if (!flag) break;
    int got = 0;
    MPI_Get_count(&status, MPI_FLOAT, &got);
    if (got != count_)
      throw CommError("pairwise averaging: rank " + std::to_string(status.MPI_SOURCE) + " sent " +
                      std::to_string(got) + " floats, this rank holds " + std::to_string(count_));
    std::unique_ptr<float[]> reply(new float[count_ > 0 ? count_ : 1]);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      // The agent's view of this rank's model (`published`) moves to the pairwise average at
      // once, so several requests between two publishes compose like sequential averagings.
      float* pub = shared_->published.data();
      float* corr = shared_->correction.data();
      const float* in = staging_.get();
      std::memcpy(reply.get(), pub, sizeof(float) * count_);
      for (int64_t i = 0; i < count_; ++i) {
        float half = 0.5f * (in[i] - pub[i]);
        corr[i] += half;
        pub[i] += half;
      }
      shared_->answered += 1;
    }
    auto send = e.isend(comm_, status.MPI_SOURCE, status.MPI_SOURCE, reply.get(), static_cast<int>(count_), MPI_FLOAT,
                        kPairReplyTag, false, &bytes_sent);
    replies_.emplace_back(std::move(send), std::move(reply));
    req_ = MPI_REQUEST_NULL;  // completed; posted again once this reply has left
    any = true;
  }
  if (!closing_) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    closing_ = shared_->close_requested;
  }
  if (closing_ && replies_.empty()) {
    if (barrier_ == MPI_REQUEST_NULL) {
      check_mpi(MPI_Ibarrier(comm_, &barrier_), "MPI_Ibarrier(pair)");
      any = true;
    }
    int flag = 0;
    check_mpi(MPI_Test(&barrier_, &flag, MPI_STATUS_IGNORE), "MPI_Test(pair barrier)");
    if (flag) {
      if (req_ != MPI_REQUEST_NULL) {
        MPI_Cancel(&req_);
        MPI_Status status;
        MPI_Wait(&req_, &status);
        int cancelled = 0;
        MPI_Test_cancelled(&status, &cancelled);
        if (!cancelled) throw CommError("pairwise averaging: a request arrived after close()");
      }
      finished_ = true;
      any = true;
    }
  }
  return any;
}

void PairListenerOp::abort(Engine& e, const std::string& reason) {
  (void)e;
  if (req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&req_);
    MPI_Request_free(&req_);
    staging_.release();  // MPI may still write into it
  }
  for (auto& r : replies_) {
    r.first->cancelled = true;
    if (r.first->posted && !r.first->complete) r.second.release();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->error = reason;
}

}  // namespace harness
