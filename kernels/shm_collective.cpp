#include "shm_collective.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "mpi_comm.hpp"

namespace harness {

namespace {

// The chunks of a copy (broadcast, allgather, gather) alternate between the two halves of a
// slot, so that a member writes one while the others copy the one before: a pipeline of about
// kPipelineChunks chunks per call, each of at least kMinPipelineChunkBytes and at most half a
// slot. (bench collectives, 2 ranks: broadcast of 64 KiB 1.1x MPI pipelined, 0.8x not.)
constexpr int64_t kPipelineChunks = 4;
constexpr int64_t kMinPipelineChunkBytes = 16 << 10;

bool pipelined(const ShmCall& call) {
  return call.kind == ShmKind::kBroadcast || call.kind == ShmKind::kAllgather || call.kind == ShmKind::kGather;
}

// A gather, scatter or allgather block of at least kDirectBytes goes from the sender's buffer
// into the receiver's in one read (ShmSegment::read_from), where the members may read each
// other's memory: one copy instead of two through a slot. (bench collectives, 2 ranks:
// allgather of 256 KiB, 1 MiB, 16 MiB 1.2x, 1.4x, 1.9x MPI direct; 0.77x, 0.76x, 1.08x through
// the slots.) A broadcast only of at least kDirectBroadcastBytes and only where the host's
// members outnumber its cores: there each chunk of the pipeline costs the readers a wake-up
// (4 ranks on 2 cores, 1 MiB / 16 MiB: 0.84x / 1.30x MPI direct, 0.59x / 0.52x pipelined);
// with a core each the pipeline won (2 ranks, 256 KiB / 1 MiB: 0.9x / 1.5x pipelined, 0.5x /
// 0.7x direct).
constexpr int64_t kDirectBytes = 16 << 10;
constexpr int64_t kDirectBroadcastBytes = 256 << 10;

int64_t per_chunk(const ShmSegment& seg, const ShmCall& call) {
  const int64_t slot_elems = seg.slot_bytes() / call.esz;
  // reduce_scatter packs every member's sub-block of a chunk into its own slot
  if (call.kind == ShmKind::kReduceScatter) return slot_elems / seg.members();
  if (pipelined(call)) {
    const int64_t want = std::max((call.count + kPipelineChunks - 1) / kPipelineChunks,
                                  kMinPipelineChunkBytes / call.esz);
    return std::max<int64_t>(1, std::min(slot_elems / 2, want));
  }
  return slot_elems;
}

}  // namespace

ShmCollective::ShmCollective(std::shared_ptr<ShmSegment> seg, ShmCall call, std::string what)
    : seg_(std::move(seg)), call_(call), what_(std::move(what)) {
  per_chunk_ = per_chunk(*seg_, call_);
  chunks_ = generations(*seg_, call_);
  direct_ = direct(*seg_, call_);
}

bool ShmCollective::direct(const ShmSegment& seg, const ShmCall& call) {
  if (!seg.direct() || seg.members() == 1) return false;
  const int64_t bytes = call.count * call.esz;
  switch (call.kind) {
    case ShmKind::kAllgather:
    case ShmKind::kGather:
    case ShmKind::kScatter: return bytes >= kDirectBytes;
    case ShmKind::kBroadcast: return !seg.may_spin() && bytes >= kDirectBroadcastBytes;
    default: return false;
  }
}

int64_t ShmCollective::generations(const ShmSegment& seg, const ShmCall& call) {
  if (call.kind == ShmKind::kBarrier || direct(seg, call)) return 1;
  const int64_t c = per_chunk(seg, call);
  if (c <= 0) throw CommError("shared segment too small for " + std::to_string(seg.members()) + " members");
  return (call.count + c - 1) / c;
}

bool ShmCollective::writes_slot() const {
  switch (call_.kind) {
    case ShmKind::kBroadcast:
    case ShmKind::kScatter: return seg_->me() == call_.root;
    case ShmKind::kBarrier: return false;
    default: return true;
  }
}

bool ShmCollective::waits_for_all_done() const {
  return call_.kind == ShmKind::kAllreduce || (call_.kind == ShmKind::kReduce && seg_->me() == call_.root);
}

bool ShmCollective::ready(ShmFlag& flag, int m, uint32_t target, bool block, const std::function<void()>& check) {
  if (reached(flag.value.load(std::memory_order_acquire), target)) return true;
  if (block) {
    seg_->wait(flag, m, target, what_, check);
    return true;
  }
  // Polled by the progress thread: a member that died is noticed within kLivenessCheckS.
  const double t = now();
  if (next_check_ < 0) {
    next_check_ = t + ShmSegment::kLivenessCheckS;
  } else if (t >= next_check_) {
    seg_->check_alive(m, what_);
    next_check_ = t + ShmSegment::kLivenessCheckS;
  }
  return false;
}

void ShmCollective::check_count(int m, uint32_t g) const {
  ShmFlag& f = seg_->arrived(m);
  // A member already in a later generation has overwritten what it said of this one.
  if (f.value.load(std::memory_order_acquire) != g) return;
  const int64_t theirs = f.info.load(std::memory_order_relaxed);
  if (theirs == kGaveUp)
    throw CommError(what_ + " was given up by member " + std::to_string(m) + " (rank " +
                    std::to_string(seg_->world_rank(m)) + "), which failed first: its own error says why");
  if (theirs != call_.count)
    throw CommError("size mismatch in " + what_ + ": member " + std::to_string(m) + " (rank " +
                    std::to_string(seg_->world_rank(m)) + ") has " + std::to_string(theirs) +
                    " elements, this rank " + std::to_string(call_.count) + " (buffer lengths differ across ranks)");
}

bool ShmCollective::arrivals_ready(uint32_t g, bool block, const std::function<void()>& check) {
  const bool from_root = call_.kind == ShmKind::kBroadcast || call_.kind == ShmKind::kScatter;
  if (from_root) {
    if (seg_->me() == call_.root) return true;
    if (!ready(seg_->arrived(call_.root), call_.root, g, block, check)) return false;
    check_count(call_.root, g);
    return true;
  }
  for (; cursor_ < seg_->members(); ++cursor_) {
    if (!ready(seg_->arrived(cursor_), cursor_, g, block, check)) return false;
    check_count(cursor_, g);
  }
  return true;
}

bool ShmCollective::all_done(uint32_t g, bool block, const std::function<void()>& check) {
  for (; cursor_ < seg_->members(); ++cursor_)
    if (!ready(seg_->done(cursor_), cursor_, g, block, check)) return false;
  return true;
}

void ShmCollective::write(int64_t e0, int64_t c) {
  const ShmSegment& s = *seg_;
  const int p = s.members(), me = s.me(), esz = call_.esz;
  const auto* in = static_cast<const char*>(call_.in);
  switch (call_.kind) {
    case ShmKind::kBroadcast:
      if (me == call_.root) std::memcpy(s.slot(me) + half_offset(), in + e0 * esz, static_cast<size_t>(c * esz));
      break;
    case ShmKind::kAllreduce:
    case ShmKind::kReduce:
      std::memcpy(s.slot(me), in + e0 * esz, static_cast<size_t>(c * esz));
      break;
    case ShmKind::kAllgather:
    case ShmKind::kGather:
      if (call_.kind == ShmKind::kGather && me == call_.root) break;  // the root copies its own block directly
      std::memcpy(s.slot(me) + half_offset(), in + e0 * esz, static_cast<size_t>(c * esz));
      break;
    case ShmKind::kScatter:  // the root fills every member's slot with its block's chunk
      if (me != call_.root) break;
      for (int m = 0; m < p; ++m) std::memcpy(s.slot(m), in + (m * call_.count + e0) * esz, static_cast<size_t>(c * esz));
      break;
    case ShmKind::kReduceScatter:  // every block's chunk, packed
      for (int m = 0; m < p; ++m)
        std::memcpy(s.slot(me) + m * c * esz, in + (m * call_.count + e0) * esz, static_cast<size_t>(c * esz));
      break;
    case ShmKind::kBarrier: break;
  }
}

void ShmCollective::compute(int64_t e0, int64_t c) {
  const ShmSegment& s = *seg_;
  const int p = s.members(), me = s.me(), esz = call_.esz;
  auto* out = static_cast<char*>(call_.out);
  auto reduce_into = [&](char* dst, int64_t offset, int64_t n) {
    std::memcpy(dst, s.slot(0) + offset, static_cast<size_t>(n * esz));
    for (int m = 1; m < p; ++m) call_.reduce(dst, s.slot(m) + offset, n);
    if (call_.divide && call_.divide_by > 1) call_.divide(dst, n, call_.divide_by);
  };
  switch (call_.kind) {
    case ShmKind::kAllreduce:
    case ShmKind::kReduce: {  // this member's share of the chunk, into the result area
      const int64_t lo = c * me / p, hi = c * (me + 1) / p;
      if (hi > lo) reduce_into(s.result() + lo * esz, lo * esz, hi - lo);
      break;
    }
    case ShmKind::kReduceScatter:
      if (c > 0) reduce_into(out + e0 * esz, me * c * esz, c);
      break;
    case ShmKind::kBroadcast:
      if (me != call_.root)
        std::memcpy(out + e0 * esz, s.slot(call_.root) + half_offset(), static_cast<size_t>(c * esz));
      break;
    case ShmKind::kScatter:
      if (me != call_.root) std::memcpy(out + e0 * esz, s.slot(me), static_cast<size_t>(c * esz));
      else std::memmove(out + e0 * esz, static_cast<const char*>(call_.in) + (me * call_.count + e0) * esz,
                        static_cast<size_t>(c * esz));
      break;
    case ShmKind::kAllgather:
    case ShmKind::kGather:
      if (call_.kind == ShmKind::kGather && me != call_.root) break;
      for (int m = 0; m < p; ++m) {
        char* dst = out + (m * call_.count + e0) * esz;
        if (m != me) {
          std::memcpy(dst, s.slot(m) + half_offset(), static_cast<size_t>(c * esz));
        } else {  // its own block from its input (which may be that very place of the output)
          const char* src = static_cast<const char*>(call_.in) + e0 * esz;
          if (src != dst) std::memmove(dst, src, static_cast<size_t>(c * esz));
        }
      }
      break;
    case ShmKind::kBarrier: break;
  }
}

int64_t ShmCollective::half_offset() const {
  return pipelined(call_) ? (chunk_ % 2) * (seg_->slot_bytes() / 2) : 0;
}

void ShmCollective::copy_out(int64_t e0, int64_t c) {
  std::memcpy(static_cast<char*>(call_.out) + e0 * call_.esz, seg_->result(), static_cast<size_t>(c * call_.esz));
}

void ShmCollective::alone() {
  // One member: every result is its own input, in place or moved to the output.
  const auto* in = static_cast<const char*>(call_.in);
  auto* out = static_cast<char*>(call_.out);
  const size_t bytes = static_cast<size_t>(call_.count * call_.esz);
  switch (call_.kind) {
    case ShmKind::kAllgather:
    case ShmKind::kGather:
    case ShmKind::kScatter:
    case ShmKind::kReduceScatter:
      if (in != out) std::memmove(out, in, bytes);
      break;
    default: break;  // in place: allreduce and reduce of one (divided by 1), broadcast, barrier
  }
  chunk_ = chunks_;
}

void ShmCollective::announce_giving_up() {
  if (seg_->members() > 1 && chunk_ == 0 && stage_ == 0)
    ShmSegment::publish(seg_->arrived(seg_->me()), gen0_, kGaveUp);
}

bool ShmCollective::advance_direct(bool block, const std::function<void()>& check) {
  // One generation: every member publishes where its data lies, reads what it needs straight
  // from the others' buffers, publishes `done`, and returns once every member is done (its own
  // buffer may be read until then).
  ShmSegment& s = *seg_;
  const int p = s.members(), me = s.me(), root = call_.root;
  const uint32_t g = gen0_;
  const size_t bytes = static_cast<size_t>(call_.count * call_.esz);
  const auto* in = static_cast<const char*>(call_.in);
  auto* out = static_cast<char*>(call_.out);
  if (stage_ == 0) {
    ShmSegment::publish(s.arrived(me), g, call_.count, reinterpret_cast<uint64_t>(in));
    stage_ = 1;
    cursor_ = 0;
    next_check_ = -1;
  }
  if (stage_ == 1) {
    auto read_block = [&](int m, int64_t their_offset, char* dst) -> bool {
      if (!ready(s.arrived(m), m, g, block, check)) return false;
      check_count(m, g);
      s.read_from(m, s.arrived(m).addr.load(std::memory_order_relaxed) + static_cast<uint64_t>(their_offset), dst,
                  bytes, what_);
      return true;
    };
    switch (call_.kind) {
      case ShmKind::kBroadcast:
        if (me != root && cursor_ == 0 && !read_block(root, 0, out)) return false;
        break;
      case ShmKind::kScatter:
        if (me == root) {
          if (in + me * bytes != out) std::memmove(out, in + me * bytes, bytes);
        } else if (cursor_ == 0 && !read_block(root, me * static_cast<int64_t>(bytes), out)) {
          return false;
        }
        break;
      case ShmKind::kAllgather:
      case ShmKind::kGather:
        if (call_.kind == ShmKind::kGather && me != root) break;
        for (; cursor_ < p; ++cursor_) {
          char* dst = out + cursor_ * bytes;
          if (cursor_ == me) {
            if (in != dst) std::memmove(dst, in, bytes);
          } else if (!read_block(cursor_, 0, dst)) {
            return false;
          }
        }
        break;
      default: break;
    }
    cursor_ = 0;
    ShmSegment::publish(s.done(me), g);
    stage_ = 2;
    next_check_ = -1;
  }
  if (!all_done(g, block, check)) return false;
  chunk_ = chunks_;
  return true;
}

bool ShmCollective::advance(bool block, const std::function<void()>& check) {
  ShmSegment& s = *seg_;
  const int me = s.me();
  if (s.members() == 1 && chunk_ < chunks_) alone();
  if (direct_ && chunk_ < chunks_) return advance_direct(block, check);
  while (chunk_ < chunks_) {
    const uint32_t g = gen0_ + static_cast<uint32_t>(chunk_);
    const int64_t e0 = chunk_ * per_chunk_;
    const int64_t c = std::min(per_chunk_, call_.count - e0);
    if (stage_ == 0) {  // write this member's part once every member is done with the last generation
      // (a pipelined chunk after the first: with the generation before the last, which used the
      // same half of the slot)
      const uint32_t free_after = pipelined(call_) && chunk_ > 0 ? g - 2 : g - 1;
      if (writes_slot() && !all_done(free_after, block, check)) return false;
      write(e0, c);
      ShmSegment::publish(s.arrived(me), g, call_.count);
      stage_ = 1;
      cursor_ = 0;
      next_check_ = -1;
    }
    if (stage_ == 1) {
      if (!arrivals_ready(g, block, check)) return false;
      compute(e0, c);
      ShmSegment::publish(s.done(me), g);
      stage_ = 2;
      cursor_ = 0;
      next_check_ = -1;
    }
    if (waits_for_all_done()) {
      if (!all_done(g, block, check)) return false;
      copy_out(e0, c);
    }
    stage_ = 0;
    cursor_ = 0;
    next_check_ = -1;
    ++chunk_;
  }
  return true;
}

// -- the channel -------------------------------------------------------------------------------

std::shared_ptr<ShmChannel> ShmChannel::open(MPI_Comm comm, std::vector<int> world_ranks, int64_t slot_bytes,
                                             std::string* why_not) {
  auto seg = ShmSegment::create(comm, std::move(world_ranks), slot_bytes, why_not);
  if (!seg) return nullptr;
  auto channel = std::make_shared<ShmChannel>();
  channel->seg_ = std::move(seg);
  return channel;
}

bool shm_turned_off() {
  const char* env = std::getenv("HARNESS_SHM");
  return env && std::string(env) == "0";
}

MpiComm members_on_this_host(MPI_Comm comm) {
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  return MpiComm(local);
}

std::shared_ptr<ShmChannel> ShmChannel::open_on_host(MPI_Comm comm, std::vector<int> world_ranks,
                                                     std::string* why_not) {
  MpiComm on_host = members_on_this_host(comm);
  int size = 0, local_size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_size(on_host.get(), &local_size);
  int wanted = shm_turned_off() ? 0 : 1, all = 0;
  // Every member decides alike: one host (each member sees the whole group on its host) and
  // nobody turned the path off.
  wanted = wanted && local_size == size;
  check_mpi(MPI_Allreduce(&wanted, &all, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(shared path)");
  if (!all) return nullptr;
  return open(comm, std::move(world_ranks), kSlotBytes, why_not);
}

ShmChannel::Ticket ShmChannel::take(const ShmCall& call) {
  const int64_t gens = ShmCollective::generations(*seg_, call);
  Ticket t{next_seq_++, next_gen_};
  next_gen_ += static_cast<uint32_t>(gens);
  return t;
}

bool ShmChannel::my_turn(uint64_t seq) {
  if (turn_.load(std::memory_order_acquire) != seq) return false;
  if (broken_flag_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    throw *broken_;
  }
  return true;
}

void ShmChannel::wait_turn(uint64_t seq, const std::function<void()>& check) {
  if (turn_.load(std::memory_order_acquire) != seq) {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1);
    while (turn_.load() != seq) {
      // Earlier operations run on the progress thread; they end (or fail) by themselves.
      cv_.wait_for(lock, std::chrono::duration<double>(ShmSegment::kLivenessCheckS));
      if (turn_.load() != seq && check) {
        lock.unlock();
        try {
          check();
        } catch (...) {
          sleepers_.fetch_sub(1);
          throw;
        }
        lock.lock();
      }
    }
    sleepers_.fetch_sub(1);
  }
  if (broken_flag_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    throw *broken_;
  }
}

void ShmChannel::break_with(const CommError& failure) {
  if (!broken_)
    broken_ = CommError("an earlier shared-memory collective of this group failed: " + std::string(failure.what()),
                        failure.kind());
  broken_flag_.store(true, std::memory_order_release);
}

void ShmChannel::skip_cancelled() {
  uint64_t next = turn_.load();
  while (cancelled_.erase(next)) ++next;
  cancelled_count_.store(static_cast<int>(cancelled_.size()));
  turn_.store(next, std::memory_order_release);
}

void ShmChannel::advance_turn() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    turn_.fetch_add(1);
    skip_cancelled();
  }
  cv_.notify_all();
}

void ShmChannel::end_turn(const std::optional<CommError>& failure) {
  if (failure) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      break_with(*failure);
    }
    advance_turn();
    return;
  }
  // The common case takes no lock: nothing cancelled ahead, nobody asleep for a turn (a thread
  // going to sleep counts itself first and checks turn_ again under the lock, so it either sees
  // the new turn or is counted here; its sleep is bounded by kLivenessCheckS all the same).
  turn_.fetch_add(1);
  if (cancelled_count_.load() != 0 || sleepers_.load() != 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);  // orders the wake-up after a sleeper's check
      skip_cancelled();
    }
    cv_.notify_all();
  }
}

void ShmChannel::cancel(uint64_t seq, const CommError& failure) {
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    break_with(failure);
    if (seq == turn_.load()) {
      now = true;
    } else if (seq > turn_.load()) {
      cancelled_.insert(seq);
      cancelled_count_.store(static_cast<int>(cancelled_.size()));
    }
  }
  if (now) advance_turn();
}

void ShmChannel::run(Engine& engine, const char* name, const ShmCall& call) {
  const double t_post = now();
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = take(call);
  }
  auto check = [&engine] {
    if (!engine.running()) throw CommError("communicator was shut down");
  };
  // Its start is its post unless it waited for an earlier operation (one clock read saved on
  // the path of every blocking call).
  const bool queued = turn_.load(std::memory_order_acquire) != ticket.seq;
  try {
    wait_turn(ticket.seq, check);
  } catch (const CommError& e) {
    cancel(ticket.seq, e);  // a shutdown while waiting, or a broken channel: the turn is given up
    throw;
  }
  const double t_start = queued ? now() : t_post;
  ShmCollective coll(seg_, call, name);
  coll.start_at(ticket.first_gen);
  try {
    coll.advance(true, check);
  } catch (const CommError& e) {
    end_turn(e);
    throw;
  }
  end_turn(std::nullopt);
  engine.add_record({name, t_post, t_start, now(), call.record_bytes, -1});
}

ShmTurn::ShmTurn(std::shared_ptr<ShmChannel> channel, uint64_t seq, uint32_t first_gen, ShmCollective coll)
    : channel_(std::move(channel)), seq_(seq), coll_(std::move(coll)) {
  coll_.start_at(first_gen);
}

ShmTurn::~ShmTurn() {
  if (!ended_) channel_->cancel(seq_, CommError("the operation was dropped"));
}

bool ShmTurn::poll(bool* moved) {
  if (moved) *moved = false;
  if (done_) return true;
  if (!started_) {
    if (!channel_->my_turn(seq_)) return false;  // throws when the channel broke
    started_ = true;
    if (moved) *moved = true;
  }
  const int64_t before = coll_.position();
  done_ = coll_.advance(false, nullptr);
  if (moved && (done_ || coll_.position() != before)) *moved = true;
  if (done_) {
    ended_ = true;
    channel_->end_turn(std::nullopt);
  }
  return done_;
}

void ShmTurn::give_up(const CommError& error, bool announce) {
  if (ended_) return;
  ended_ = true;
  if (announce && !started_ && channel_->turn_.load(std::memory_order_acquire) == seq_) started_ = true;
  if (announce && started_) coll_.announce_giving_up();
  // In its turn (started, or refused by a broken channel) it ends the turn; before, it gives
  // its turn up.
  channel_->cancel(seq_, error);
}

// The progress thread's side of a nonblocking call: it waits for its turn, then polls.
class ShmOp : public Op {
 public:
  ShmOp(std::string name, std::shared_ptr<OpState> st, std::unique_ptr<ShmTurn> turn)
      : Op(std::move(name), std::move(st)), turn_(std::move(turn)) {
    bytes_sent = turn_->call().record_bytes;
  }
  bool progress(Engine&) override {
    if (done_) return false;
    bool moved = false;
    done_ = turn_->poll(&moved);
    return moved;
  }
  bool finished() const override { return done_; }
  void abort(Engine&, const CommError& error) override { turn_->give_up(error); }

 private:
  std::unique_ptr<ShmTurn> turn_;
  bool done_ = false;
};

std::vector<std::unique_ptr<ShmTurn>> ShmChannel::turns(const std::vector<std::pair<const char*, ShmCall>>& calls) {
  std::vector<Ticket> tickets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : calls) tickets.push_back(take(c.second));
  }
  std::vector<std::unique_ptr<ShmTurn>> out;
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back(std::make_unique<ShmTurn>(shared_from_this(), tickets[i].seq, tickets[i].first_gen,
                                            ShmCollective(seg_, calls[i].second, calls[i].first)));
  return out;
}

std::unique_ptr<Op> ShmChannel::op(const char* name, std::shared_ptr<OpState> state, const ShmCall& call) {
  return std::make_unique<ShmOp>(name, std::move(state), std::move(turns({{name, call}}).front()));
}

}  // namespace harness
