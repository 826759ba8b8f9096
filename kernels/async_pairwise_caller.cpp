#include "async_pairwise_caller.hpp"

namespace harness {

PairwiseAverager::PairwiseAverager(std::shared_ptr<Engine> engine, FloatSpan initial)
    : engine_(std::move(engine)), count_(initial.count), shared_(std::make_shared<PairShared>()) {
  shared_->published.assign(initial.data, initial.data + count_);
  shared_->correction.assign(static_cast<size_t>(count_), 0.0f);
  comm_ = engine_->dup_comm();
  listener_ = engine_->submit(std::make_unique<PairListenerOp>(std::make_shared<OpState>(), comm_, count_, shared_));
}

void PairwiseAverager::publish(FloatSpan buf) {
  check_open();
  check_length(buf, "published model");
  std::lock_guard<std::mutex> lock(shared_->mu);
  // Corrections not drained yet are part of this rank's model as its agent sees it.
  float* pub = shared_->published.data();
  const float* corr = shared_->correction.data();
  for (int64_t i = 0; i < count_; ++i) pub[i] = buf.data[i] + corr[i];
}

std::shared_ptr<OpState> PairwiseAverager::request(FloatSpan buf, FloatSpan out, int peer) {
  check_open();
  check_length(buf, "request model");
  check_length(out, "reply buffer");
  if (peer < 0 || peer >= engine_->size() || peer == engine_->rank())
    throw CommError("pairwise averaging peer " + std::to_string(peer) + " out of range: must be another rank in [0, " +
                    std::to_string(engine_->size()) + ")");
  if (buf.data == out.data) throw CommError("request and reply buffers must not be the same memory");
  StepProgram s;
  Step step;
  step.sends.push_back({1, buf.data, count_, kPairRequestTag});
  step.recvs.push_back({1, out.data, count_, kPairReplyTag});
  s.steps.push_back(std::move(step));
  auto st = std::make_shared<OpState>();
  const int me = engine_->rank();
  engine_->submit(std::make_unique<StepProgramOp>(
      "pair_request", st, StepExecutor(comm_, {me, peer}, {me, peer}, kPairRequestTag, std::move(s))));
  return st;
}

int64_t PairwiseAverager::drain(FloatSpan out) {
  check_length(out, "drain target");
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (shared_->error) throw shared_->error->in_context("pairwise averaging failed: ");
  float* corr = shared_->correction.data();
  for (int64_t i = 0; i < count_; ++i) {
    out.data[i] += corr[i];
    corr[i] = 0.0f;
  }
  int64_t n = shared_->answered;
  shared_->answered = 0;
  return n;
}

void PairwiseAverager::close() {
  if (closed_.exchange(true)) return;
  close_persistent_op(*engine_, *shared_, *listener_);
}

void PairwiseAverager::check_open() const {
  if (closed_) throw CommError("pairwise averager is closed");
  if (!engine_->running()) throw CommError("communicator is shut down");
}

void PairwiseAverager::check_length(FloatSpan buf, const char* what) const {
  if (buf.count != count_)
    throw CommError(std::string(what) + " has " + std::to_string(buf.count) + " floats, the averager holds " +
                    std::to_string(count_));
}

}  // namespace harness
