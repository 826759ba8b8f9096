// The caller side of a push channel (the protocol is in push_channel.hpp): sends, drains and
// the collective flush / close.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "caller.hpp"
#include "push_channel.hpp"

namespace harness {

class PushChannel {
 public:
  // Collective over the engine's ranks: the channel gets a duplicate communicator of its own,
  // whose tag space carries the rounds.
  PushChannel(std::shared_ptr<Engine> engine, int64_t count);
  int64_t count() const { return count_; }

  // Pushes `buf` to every rank of `peers` (a rank listed twice gets two messages) as round
  // `round`. The buffer is copied before this returns: the caller keeps updating its model
  // while the push is in flight.
  std::shared_ptr<OpState> send(FloatSpan buf, const std::vector<int>& peers, int64_t round);

  // Adds what arrived into `out` and forgets it; returns the number of messages. With `round`,
  // only that round's messages (waiting for at least `min_messages` of them); without, every
  // round's (waiting for at least `min_messages` in all). The order of the additions is fixed
  // (round, source rank, arrival from that source), so equal arrivals give bit-equal sums.
  int64_t drain(FloatSpan out, int64_t min_messages, std::optional<double> timeout, std::optional<int64_t> round);

  // Messages arrived and not drained: of `round`, or of all rounds.
  int64_t pending(std::optional<int64_t> round);

  // Collective: after it, every message pushed before it by any rank is in its receiver's
  // accumulator. Callers must have waited for their own sends. With `close`, the channel ends.
  void flush(bool close);

 private:
  int64_t arrived(std::optional<int64_t> round) const;  // caller holds shared_->mu
  void check_open() const;

  std::shared_ptr<Engine> engine_;
  int64_t count_;
  SharedComm comm_;
  std::shared_ptr<PushShared> shared_;
  std::shared_ptr<OpState> listener_;
  std::atomic<bool> closed_{false};
};

}  // namespace harness
