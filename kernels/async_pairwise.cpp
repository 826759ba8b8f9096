#include "async_pairwise.hpp"

#include <cstring>

namespace harness {

PairListenerOp::PairListenerOp(std::shared_ptr<OpState> st, SharedComm comm, int64_t count,
                               std::shared_ptr<PairShared> shared)
    : ListenerOp("pair_listener", std::move(st), std::move(comm)),
      count_(count),
      shared_(std::move(shared)),
      staging_(new float[count > 0 ? count : 1]) {
  post();
}

void PairListenerOp::post() {
  listen(staging_.get(), static_cast<int>(count_), MPI_FLOAT, kPairRequestTag, "MPI_Irecv(pair request)");
}

bool PairListenerOp::progress(Engine& e) {
  bool any = false;
  for (;;) {
    // One request at a time, as the reference implementations serve them: the next request is
    // received only once the reply to the previous one has left (its send completed).
    while (!replies_.empty() && e.test_send(*replies_.front().req)) {
      replies_.pop_front();
      any = true;
    }
    if (!replies_.empty()) break;
    if (!listening()) {
      post();
      any = true;
    }
    MPI_Status status;
    if (!heard(status, "pairwise averaging: a rank sent a model longer than " + std::to_string(count_) + " floats"))
      break;
    int got = 0;
    MPI_Get_count(&status, MPI_FLOAT, &got);
    if (got != count_)
      throw CommError("pairwise averaging: rank " + std::to_string(status.MPI_SOURCE) + " sent " +
                      std::to_string(got) + " floats, this rank holds " + std::to_string(count_));
    std::shared_ptr<float[]> reply(new float[count_ > 0 ? count_ : 1]);
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
    auto send = e.isend(comm(), status.MPI_SOURCE, status.MPI_SOURCE, reply.get(), static_cast<int>(count_), MPI_FLOAT,
                        kPairReplyTag, false, &bytes_sent);
    replies_.push_back({std::move(send), std::move(reply)});
    any = true;  // the receive completed; it is posted again once this reply has left
  }
  if (!closing_) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    closing_ = shared_->close_requested;
  }
  if (closing_ && replies_.empty()) {
    if (!closing_barrier_posted()) any = true;
    if (closing_barrier_done("MPI_Ibarrier(pair)")) {
      MPI_Status status;
      if (stop_listening(status, "MPI_Wait(pair request)"))
        throw CommError("pairwise averaging: a request arrived after close()");
      finished_ = true;
      any = true;
    }
  }
  return any;
}

void PairListenerOp::abort_rest(Engine& e, const CommError& error) {
  for (auto& r : replies_) e.abandon_send(*r.req, r.buf);
  replies_.clear();
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->error = error;
}

}  // namespace harness
