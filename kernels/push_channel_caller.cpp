#include "push_channel_caller.hpp"

#include <climits>
#include <cstring>

namespace harness {

PushChannel::PushChannel(std::shared_ptr<Engine> engine, int64_t count)
    : engine_(std::move(engine)), count_(count), shared_(std::make_shared<PushShared>()) {
  if (count < 0 || count > INT_MAX) throw CommError("push channel length must be in [0, 2^31-1]");
  comm_ = engine_->dup_comm();
  listener_ = engine_->submit(std::make_unique<PushListenerOp>(std::make_shared<OpState>(), comm_, count, shared_));
}

std::shared_ptr<OpState> PushChannel::send(FloatSpan buf, const std::vector<int>& peers, int64_t round) {
  check_open();
  if (round < 0) throw CommError("push round must be >= 0 (got " + std::to_string(round) + ")");
  if (buf.count != count_)
    throw CommError("push buffer has " + std::to_string(buf.count) + " floats, the channel carries " +
                    std::to_string(count_));
  for (int p : peers)
    if (p < 0 || p >= engine_->size() || p == engine_->rank())
      throw CommError("push peer " + std::to_string(p) + " out of range: must be another rank in [0, " +
                      std::to_string(engine_->size()) + ")");
  StepProgram s;
  s.scratch.reset(new float[count_ > 0 ? count_ : 1]);
  Step step;
  std::vector<int> members;
  for (size_t i = 0; i < peers.size(); ++i) {
    step.sends.push_back({static_cast<int>(i), s.scratch.get(), count_});
    members.push_back(peers[i]);
  }
  s.steps.push_back(std::move(step));
  std::memcpy(s.scratch.get(), buf.data, sizeof(float) * count_);
  auto st = std::make_shared<OpState>();
  // The channel's communicator duplicates the world, so members are world ranks as well.
  engine_->submit(std::make_unique<StepProgramOp>(
      "push", st,
      StepExecutor(comm_, members, members, static_cast<int>(round % kPushRoundModulus), std::move(s),
                   /*synchronous_sends=*/true)));
  return st;
}

int64_t PushChannel::drain(FloatSpan out, int64_t min_messages, std::optional<double> timeout,
                           std::optional<int64_t> round) {
  if (out.count != count_)
    throw CommError("drain target has " + std::to_string(out.count) + " floats, the channel carries " +
                    std::to_string(count_));
  int64_t got = 0;
  std::optional<CommError> err;
  bool ok = true;
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    auto ready = [&] { return arrived(round) >= min_messages || shared_->error.has_value(); };
    if (timeout)
      ok = shared_->cv.wait_for(lock, std::chrono::duration<double>(*timeout), ready);
    else
      shared_->cv.wait(lock, ready);
    err = shared_->error;
    if (ok && !err) {
      auto first = round ? shared_->rounds.lower_bound(*round) : shared_->rounds.begin();
      auto last = round ? shared_->rounds.upper_bound(*round) : shared_->rounds.end();
      for (auto it = first; it != last; ++it) {
        for (auto& entry : it->second) {
          const float* msg = entry.second.get();
          for (int64_t i = 0; i < count_; ++i) out.data[i] += msg[i];
          ++got;
        }
      }
      shared_->rounds.erase(first, last);
      shared_->messages -= got;
    }
  }
  if (err) throw err->in_context("push channel failed: ");
  if (!ok)
    throw CommError("push channel: fewer than " + std::to_string(min_messages) + " messages" +
                        (round ? " of round " + std::to_string(*round) : std::string()) + " arrived within " +
                        std::to_string(*timeout) + " s",
                    ErrorKind::kTimeout);
  return got;
}

int64_t PushChannel::pending(std::optional<int64_t> round) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return arrived(round);
}

void PushChannel::flush(bool close) {
  check_open();
  auto st = std::make_shared<OpState>();
  st->t_post = now();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    // A listener that failed takes no more commands: nothing would ever finish this one.
    if (shared_->error) throw shared_->error->in_context("push channel failed: ");
    shared_->commands.push_back({close, st});
  }
  engine_->wake();
  st->wait(-1);
  if (close) {
    listener_->wait(-1);
    closed_ = true;
  }
  st->throw_if_failed();
}

int64_t PushChannel::arrived(std::optional<int64_t> round) const {
  if (!round) return shared_->messages;
  auto it = shared_->rounds.find(*round);
  return it == shared_->rounds.end() ? 0 : static_cast<int64_t>(it->second.size());
}

void PushChannel::check_open() const {
  if (closed_) throw CommError("push channel is closed");
  if (!engine_->running()) throw CommError("communicator is shut down");
}

}  // namespace harness
