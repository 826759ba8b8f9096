// pybind11 bindings: the private module harness._core behind harness.comm.
//
// Every entry point checks its arguments with the GIL held, then releases the GIL before
// submitting to the progress thread or waiting, so Python threads and the progress thread
// never block each other.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <optional>

#include "async_pairwise.hpp"
#include "push_channel.hpp"
#include "wait_avoiding.hpp"

namespace py = pybind11;
using namespace harness;

namespace {

struct FloatBuf {
  float* ptr;
  int64_t count;
};

// Checks that `obj` is a C-contiguous float32 buffer (and writable if asked).
FloatBuf float_buffer(const py::object& obj, bool writable, const char* what) {
  py::buffer_info info;
  try {
    info = py::reinterpret_borrow<py::buffer>(obj).request(writable);
  } catch (py::error_already_set& e) {
    std::string why = writable ? "a writable, C-contiguous float32 buffer" : "a C-contiguous float32 buffer";
    throw CommError(std::string(what) + " must be " + why + " (numpy array or CPU torch tensor); got " +
                    std::string(py::str(py::type::of(obj).attr("__name__"))) + ": " + e.what());
  }
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != 4)
    throw CommError(std::string(what) + " must have dtype float32 (got buffer format '" + info.format + "')");
  int64_t expected = info.itemsize;
  for (int d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected)
      throw CommError(std::string(what) + " must be C-contiguous");
    expected *= info.shape[d];
  }
  if (info.size > INT_MAX) throw CommError(std::string(what) + " has more than 2^31-1 elements");
  return {static_cast<float*>(info.ptr), static_cast<int64_t>(info.size)};
}

bool is_buffer(const py::object& o) { return PyObject_CheckBuffer(o.ptr()); }

// Buffers of operations whose handle was dropped before the operation ended. The progress
// thread may still touch that memory, so the buffer objects are parked here (touched only with
// the GIL held) until their operation is done. One per communicator.
struct Graveyard {
  std::vector<std::pair<std::shared_ptr<OpState>, py::object>> items;
  void sweep() {
    items.erase(std::remove_if(items.begin(), items.end(), [](auto& it) { return it.first->is_done(); }),
                items.end());
  }
};

class Handle {
 public:
  Handle(std::shared_ptr<OpState> st, py::object keep, std::shared_ptr<Graveyard> graveyard)
      : st_(std::move(st)), keep_(std::move(keep)), graveyard_(std::move(graveyard)) {
    graveyard_->sweep();
  }
  ~Handle() {
    // Never block here (the op may wait for a peer that is gone); never free a buffer the
    // op may still use.
    if (st_ && !st_->is_done() && !keep_.is_none()) graveyard_->items.emplace_back(st_, std::move(keep_));
  }
  void wait(std::optional<double> timeout) {
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = st_->wait(timeout ? *timeout : -1.0);
    }
    if (!ok) throw CommError("operation did not complete within " + std::to_string(*timeout) + " s");
    std::lock_guard<std::mutex> lock(st_->mu);
    if (!st_->error.empty()) throw CommError(st_->error);
  }
  bool done() { return st_->is_done(); }
  py::tuple times() {
    std::lock_guard<std::mutex> lock(st_->mu);
    return py::make_tuple(st_->t_post, st_->t_start, st_->t_end);
  }

 protected:
  std::shared_ptr<OpState> st_;
  py::object keep_;
  std::shared_ptr<Graveyard> graveyard_;
};

class RoundHandle : public Handle {
 public:
  RoundHandle(std::shared_ptr<OpState> st, py::object keep, std::shared_ptr<Graveyard> g,
              std::shared_ptr<RoundInfo> info)
      : Handle(std::move(st), std::move(keep), std::move(g)), info_(std::move(info)) {}
  py::dict info() {
    wait(std::nullopt);
    py::dict d;
    d["round"] = info_->round;
    d["sync"] = info_->sync;
    d["group_size"] = info_->group_size;
    d["staleness"] = info_->staleness;
    d["joined_early"] = info_->joined_early;
    d["t_join"] = info_->t_join;
    d["t_done"] = info_->t_done;
    return d;
  }

 private:
  std::shared_ptr<RoundInfo> info_;
};

struct P2P {
  MPI_Comm comm = MPI_COMM_NULL;
  std::map<int, int64_t> seq;  // exchanges with each peer so far (both sides count alike)
};

class NativeComm;

class PushChannel {
 public:
  PushChannel(std::shared_ptr<Engine> e, int64_t count, std::shared_ptr<Graveyard> g)
      : engine_(std::move(e)), count_(count), graveyard_(std::move(g)) {
    shared_ = std::make_shared<PushShared>();
    MPI_Comm c = engine_->dup_comm();
    comm_ = c;
    listener_ = engine_->submit(std::make_unique<PushListenerOp>(std::make_shared<OpState>(), c, count, shared_));
  }
  int64_t count() const { return count_; }

  // Pushes `buf` to every rank of `peers` (a rank listed twice gets two messages) as round `round`.
  std::unique_ptr<Handle> send(const py::object& buf, const std::vector<int>& peers, int64_t round) {
    check_open();
    if (round < 0) throw CommError("push round must be >= 0 (got " + std::to_string(round) + ")");
    FloatBuf b = float_buffer(buf, false, "push buffer");
    if (b.count != count_)
      throw CommError("push buffer has " + std::to_string(b.count) + " floats, the channel carries " +
                      std::to_string(count_));
    for (int p : peers)
      if (p < 0 || p >= engine_->size() || p == engine_->rank())
        throw CommError("push peer " + std::to_string(p) + " out of range: must be another rank in [0, " +
                        std::to_string(engine_->size()) + ")");
    Schedule s;
    s.scratch.reset(new float[count_ > 0 ? count_ : 1]);
    Step step;
    std::vector<int> members, world;
    for (size_t i = 0; i < peers.size(); ++i) {
      step.sends.push_back({static_cast<int>(i), s.scratch.get(), count_});
      members.push_back(peers[i]);
      world.push_back(peers[i]);
    }
    s.steps.push_back(std::move(step));
    auto st = std::make_shared<OpState>();
    {
      py::gil_scoped_release nogil;
      // Snapshot: the caller keeps updating its model while the push is in flight.
      std::memcpy(s.scratch.get(), b.ptr, sizeof(float) * count_);
      engine_->submit(std::make_unique<ScheduleOp>(
          "push", st,
          StepExecutor(comm_, members, world, static_cast<int>(round % kPushRoundModulus), std::move(s),
                       /*synchronous_sends=*/true)));
    }
    return std::make_unique<Handle>(st, py::none(), graveyard_);
  }

  // Adds what arrived into `out` and forgets it; returns the number of messages. With `round`,
  // only that round's messages (waiting for at least `min_messages` of them); without, every
  // round's (waiting for at least `min_messages` in all). The order of the additions is fixed
  // (round, source rank, arrival from that source), so equal arrivals give bit-equal sums.
  int64_t drain(const py::object& out, int64_t min_messages, std::optional<double> timeout,
                std::optional<int64_t> round) {
    FloatBuf b = float_buffer(out, true, "drain target");
    if (b.count != count_)
      throw CommError("drain target has " + std::to_string(b.count) + " floats, the channel carries " +
                      std::to_string(count_));
    int64_t got = 0;
    std::string err;
    bool ok = true;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(shared_->mu);
      auto ready = [&] { return arrived(round) >= min_messages || !shared_->error.empty(); };
      if (timeout)
        ok = shared_->cv.wait_for(lock, std::chrono::duration<double>(*timeout), ready);
      else
        shared_->cv.wait(lock, ready);
      err = shared_->error;
      if (ok && err.empty()) {
        auto first = round ? shared_->rounds.lower_bound(*round) : shared_->rounds.begin();
        auto last = round ? shared_->rounds.upper_bound(*round) : shared_->rounds.end();
        for (auto it = first; it != last; ++it) {
          for (auto& entry : it->second) {
            const float* msg = entry.second.get();
            for (int64_t i = 0; i < count_; ++i) b.ptr[i] += msg[i];
            ++got;
          }
        }
        shared_->rounds.erase(first, last);
        shared_->messages -= got;
      }
    }
    if (!err.empty()) throw CommError("push channel failed: " + err);
    if (!ok)
      throw CommError("push channel: fewer than " + std::to_string(min_messages) + " messages" +
                      (round ? " of round " + std::to_string(*round) : std::string()) + " arrived within " +
                      std::to_string(*timeout) + " s");
    return got;
  }

  // Messages arrived and not drained: of `round`, or of all rounds.
  int64_t pending(std::optional<int64_t> round) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return arrived(round);
  }

  // Collective: after it, every message pushed before it by any rank is in its receiver's
  // accumulator. Callers must have waited for their own sends.
  void flush(bool close) {
    check_open();
    auto st = std::make_shared<OpState>();
    st->t_post = now();
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->commands.push_back({close, st});
    }
    engine_->wake();
    {
      py::gil_scoped_release nogil;
      st->wait(-1);
      if (close) listener_->wait(-1);
    }
    if (close) closed_ = true;
    std::lock_guard<std::mutex> lock(st->mu);
    if (!st->error.empty()) throw CommError(st->error);
  }

 private:
  // Caller holds shared_->mu.
  int64_t arrived(std::optional<int64_t> round) const {
    if (!round) return shared_->messages;
    auto it = shared_->rounds.find(*round);
    return it == shared_->rounds.end() ? 0 : static_cast<int64_t>(it->second.size());
  }
  void check_open() {
    if (closed_) throw CommError("push channel is closed");
    if (!engine_->running()) throw CommError("communicator is shut down");
  }
  std::shared_ptr<Engine> engine_;
  int64_t count_;
  MPI_Comm comm_;
  std::shared_ptr<PushShared> shared_;
  std::shared_ptr<OpState> listener_;
  std::shared_ptr<Graveyard> graveyard_;
  bool closed_ = false;
};

class WaitAvoiding {
 public:
  WaitAvoiding(std::shared_ptr<Engine> e, WaConfig cfg, const float* initial, std::shared_ptr<Graveyard> g)
      : engine_(std::move(e)),
        graveyard_(std::move(g)), count_(cfg.count), sync_every_(cfg.sync_every), accumulate_(cfg.accumulate) {
    shared_ = std::make_shared<WaShared>();
    shared_->published.assign(initial, initial + cfg.count);
    MPI_Comm c = engine_->dup_comm();
    op_state_ = engine_->submit(std::make_unique<WaitAvoidingOp>(std::make_shared<OpState>(), c, engine_->rank(),
                                                                 engine_->size(), engine_->tag_ub(), std::move(cfg),
                                                                 shared_));
  }

  std::unique_ptr<RoundHandle> iround(const py::object& buf, const py::object& out, bool may_activate) {
    if (closed_) throw CommError("wait-avoiding allreduce is closed");
    if (!engine_->running()) throw CommError("communicator is shut down");
    FloatBuf b = float_buffer(buf, false, "published buffer");
    FloatBuf o = float_buffer(out, true, "result buffer");
    if (b.count != count_ || o.count != count_)
      throw CommError("wait-avoiding allreduce carries " + std::to_string(count_) + " floats; got buffers of " +
                      std::to_string(b.count) + " and " + std::to_string(o.count));
    auto st = std::make_shared<OpState>();
    auto info = std::make_shared<RoundInfo>();
    int64_t k = next_round_++;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(shared_->mu);
      float* pub = shared_->published.data();
      if (accumulate_)
        for (int64_t i = 0; i < count_; ++i) pub[i] += b.ptr[i];
      else
        std::memcpy(pub, b.ptr, sizeof(float) * count_);
      shared_->published_round = k;
      st->t_post = now();
      shared_->arrivals.push_back({k, may_activate, o.ptr, st, info});
    }
    engine_->wake();
    return std::make_unique<RoundHandle>(st, py::make_tuple(buf, out), graveyard_, info);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->close_requested = true;
    }
    engine_->wake();
    py::gil_scoped_release nogil;
    op_state_->wait(-1);
  }

  int64_t next_round() const { return next_round_; }
  bool is_sync_round(int64_t k) const { return wa_is_sync_round(k, sync_every_); }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Graveyard> graveyard_;
  int64_t count_;
  int sync_every_;
  bool accumulate_;
  std::shared_ptr<WaShared> shared_;
  std::shared_ptr<OpState> op_state_;
  int64_t next_round_ = 0;
  bool closed_ = false;
};

class PairwiseAverager {
 public:
  PairwiseAverager(std::shared_ptr<Engine> e, const float* initial, int64_t count, std::shared_ptr<Graveyard> g)
      : engine_(std::move(e)), count_(count), graveyard_(std::move(g)) {
    shared_ = std::make_shared<PairShared>();
    shared_->published.assign(initial, initial + count);
    shared_->correction.assign(static_cast<size_t>(count), 0.0f);
    comm_ = engine_->dup_comm();
    listener_ = engine_->submit(std::make_unique<PairListenerOp>(std::make_shared<OpState>(), comm_, count, shared_));
  }

  void publish(const py::object& buf) {
    check_open();
    FloatBuf b = checked(buf, false, "published model");
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(shared_->mu);
    // Corrections not drained yet are part of this rank's model as its agent sees it.
    float* pub = shared_->published.data();
    const float* corr = shared_->correction.data();
    for (int64_t i = 0; i < count_; ++i) pub[i] = b.ptr[i] + corr[i];
  }

  // Active side: send `buf` to `peer`, receive the peer's published model into `out`.
  std::unique_ptr<Handle> request(const py::object& buf, const py::object& out, int peer) {
    check_open();
    FloatBuf b = checked(buf, false, "request model");
    FloatBuf o = checked(out, true, "reply buffer");
    if (peer < 0 || peer >= engine_->size() || peer == engine_->rank())
      throw CommError("pairwise averaging peer " + std::to_string(peer) + " out of range: must be another rank in [0, " +
                      std::to_string(engine_->size()) + ")");
    if (b.ptr == o.ptr) throw CommError("request and reply buffers must not be the same memory");
    Schedule s;
    Step step;
    step.sends.push_back({1, b.ptr, count_, kPairRequestTag});
    step.recvs.push_back({1, o.ptr, count_, kPairReplyTag});
    s.steps.push_back(std::move(step));
    auto st = std::make_shared<OpState>();
    int me = engine_->rank();
    {
      py::gil_scoped_release nogil;
      engine_->submit(std::make_unique<ScheduleOp>(
          "pair_request", st, StepExecutor(comm_, {me, peer}, {me, peer}, kPairRequestTag, std::move(s))));
    }
    return std::make_unique<Handle>(st, py::make_tuple(buf, out), graveyard_);
  }

  // Passive side: add the pending corrections into `out`; returns how many requests they hold.
  int64_t drain(const py::object& out) {
    FloatBuf o = checked(out, true, "drain target");
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->error.empty()) throw CommError("pairwise averaging failed: " + shared_->error);
    float* corr = shared_->correction.data();
    for (int64_t i = 0; i < count_; ++i) {
      o.ptr[i] += corr[i];
      corr[i] = 0.0f;
    }
    int64_t n = shared_->answered;
    shared_->answered = 0;
    return n;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->close_requested = true;
    }
    engine_->wake();
    py::gil_scoped_release nogil;
    listener_->wait(-1);
    std::lock_guard<std::mutex> lock(listener_->mu);
    if (!listener_->error.empty()) throw CommError(listener_->error);
  }

 private:
  void check_open() {
    if (closed_) throw CommError("pairwise averager is closed");
    if (!engine_->running()) throw CommError("communicator is shut down");
  }
  FloatBuf checked(const py::object& obj, bool writable, const char* what) {
    FloatBuf b = float_buffer(obj, writable, what);
    if (b.count != count_)
      throw CommError(std::string(what) + " has " + std::to_string(b.count) + " floats, the averager holds " +
                      std::to_string(count_));
    return b;
  }
  std::shared_ptr<Engine> engine_;
  int64_t count_;
  std::shared_ptr<Graveyard> graveyard_;
  std::shared_ptr<PairShared> shared_;
  MPI_Comm comm_;
  std::shared_ptr<OpState> listener_;
  bool closed_ = false;
};

class NativeComm {
 public:
  // World communicator over an mpi4py communicator handle.
  NativeComm(uintptr_t handle, double spin_us, double max_sleep_us, int64_t ring_threshold_bytes)
      : ring_threshold_(ring_threshold_bytes) {
    EngineOptions opt;
    opt.spin_s = spin_us * 1e-6;
    opt.max_sleep_s = max_sleep_us * 1e-6;
    MPI_Comm parent = static_cast<MPI_Comm>(handle);
    {
      py::gil_scoped_release nogil;
      engine_ = std::make_shared<Engine>(parent, opt);
      p2p_ = std::make_shared<P2P>();
      graveyard_ = std::make_shared<Graveyard>();
      p2p_->comm = engine_->dup_comm();
    }
    comm_ = engine_->comm();
    rank_ = engine_->rank();
    size_ = engine_->size();
    for (int r = 0; r < size_; ++r) world_.push_back(r);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::vector<int> world_ranks() const { return world_; }
  bool is_world() const { return !sub_; }

  std::unique_ptr<Handle> iallreduce(const py::object& buf, const std::string& op) {
    check_open();
    if (op != "sum" && op != "mean") throw CommError("allreduce op must be 'sum' or 'mean' (got '" + op + "')");
    FloatBuf b = float_buffer(buf, true, "allreduce buffer");
    Schedule s = allreduce_schedule(size_, rank_, b.ptr, b.count, ring_threshold_);
    s.result = b.ptr;
    s.count = b.count;
    s.divide_by = op == "mean" ? size_ : 1;
    return submit("allreduce", std::move(s), buf);
  }

  std::unique_ptr<Handle> ibroadcast(const py::object& buf, int root) {
    check_open();
    check_rank(root, "broadcast root");
    FloatBuf b = float_buffer(buf, true, "broadcast buffer");
    return submit("broadcast", binomial_bcast(size_, rank_, root, b.ptr, b.count), buf);
  }

  std::unique_ptr<Handle> ibarrier() {
    check_open();
    return submit("barrier", dissemination_barrier(size_, rank_), py::none());
  }

  std::unique_ptr<Handle> iexchange(const py::object& send, const py::object& recv, int peer) {
    check_open();
    check_rank(peer, "exchange peer");
    if (peer == rank_) throw CommError("exchange peer must be another rank (got this rank, " + std::to_string(peer) + ")");
    FloatBuf s = float_buffer(send, false, "exchange send buffer");
    FloatBuf r = float_buffer(recv, true, "exchange receive buffer");
    if (s.count != r.count)
      throw CommError("exchange buffers differ in length (" + std::to_string(s.count) + " vs " +
                      std::to_string(r.count) + ")");
    if (s.ptr == r.ptr) throw CommError("exchange send and receive buffers must not be the same memory");
    int wpeer = world_[peer], wme = world_[rank_];
    int64_t seq = p2p_->seq[wpeer]++;
    Schedule sch;
    sch.steps.push_back({{{1, s.ptr, s.count}}, {{1, r.ptr, r.count}}, {}});
    auto st = std::make_shared<OpState>();
    {
      py::gil_scoped_release nogil;
      engine_->submit(std::make_unique<ScheduleOp>(
          "exchange", st,
          StepExecutor(p2p_->comm, {wme, wpeer}, {wme, wpeer}, static_cast<int>(seq % engine_->tag_ub()),
                       std::move(sch))));
    }
    return std::make_unique<Handle>(st, py::make_tuple(send, recv), graveyard_);
  }

  // Collective over `ranks` (world ranks, this rank included); only members call it.
  std::unique_ptr<NativeComm> subgroup(std::vector<int> ranks) {
    check_open();
    if (!is_world()) throw CommError("subgroups are created from the world communicator");
    std::vector<int> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw CommError("subgroup ranks contain duplicates");
    for (int r : ranks) check_rank(r, "subgroup rank");
    if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end())
      throw CommError("this rank (" + std::to_string(rank_) + ") is not a member of the subgroup it creates");
    auto g = std::unique_ptr<NativeComm>(new NativeComm(*this));
    {
      py::gil_scoped_release nogil;
      g->comm_ = engine_->create_group_comm(ranks);
    }
    g->sub_ = true;
    g->world_ = ranks;
    MPI_Comm_rank(g->comm_, &g->rank_);
    MPI_Comm_size(g->comm_, &g->size_);
    g->seq_ = 0;
    return g;
  }

  std::unique_ptr<PushChannel> push_channel(int64_t count) {
    check_open();
    if (!is_world()) throw CommError("push channels are created on the world communicator");
    if (count < 0 || count > INT_MAX) throw CommError("push channel length must be in [0, 2^31-1]");
    py::gil_scoped_release nogil;
    return std::make_unique<PushChannel>(engine_, count, graveyard_);
  }

  std::unique_ptr<WaitAvoiding> wait_avoiding(const py::object& initial, int sync_every, bool accumulate,
                                              std::vector<std::vector<int>> phases) {
    check_open();
    if (!is_world()) throw CommError("the wait-avoiding allreduce runs on the world communicator");
    FloatBuf b = float_buffer(initial, false, "initial buffer");
    if (sync_every < 0) throw CommError("sync_every must be >= 0 (got " + std::to_string(sync_every) + ")");
    if (phases.empty()) throw CommError("the wait-avoiding allreduce needs at least one phase of groups");
    for (size_t j = 0; j < phases.size(); ++j) {
      auto& g = phases[j];
      std::sort(g.begin(), g.end());
      for (int r : g) check_rank(r, "group member");
      if (std::adjacent_find(g.begin(), g.end()) != g.end())
        throw CommError("group of phase " + std::to_string(j) + " contains duplicate ranks");
      if (std::find(g.begin(), g.end(), rank_) == g.end())
        throw CommError("group of phase " + std::to_string(j) + " does not contain this rank (" +
                        std::to_string(rank_) + ")");
    }
    WaConfig cfg;
    cfg.count = b.count;
    cfg.sync_every = sync_every;
    cfg.accumulate = accumulate;
    cfg.phases = std::move(phases);
    cfg.ring_threshold_bytes = ring_threshold_;
    std::vector<float> init(b.ptr, b.ptr + b.count);
    if (accumulate) std::fill(init.begin(), init.end(), 0.0f);
    py::gil_scoped_release nogil;
    return std::make_unique<WaitAvoiding>(engine_, std::move(cfg), init.data(), graveyard_);
  }

  std::unique_ptr<PairwiseAverager> pairwise_averager(const py::object& initial) {
    check_open();
    if (!is_world()) throw CommError("the pairwise averager runs on the world communicator");
    FloatBuf b = float_buffer(initial, false, "initial model");
    py::gil_scoped_release nogil;
    return std::make_unique<PairwiseAverager>(engine_, b.ptr, b.count, graveyard_);
  }

  // Outgoing links of this rank: (dst world rank, latency s, bandwidth B/s or inf).
  void set_links(const std::vector<std::tuple<int, double, double>>& links) {
    std::unordered_map<int, LinkParams> table;
    for (auto& [dst, lat, bw] : links) {
      check_rank(dst, "link destination");
      if (!(lat >= 0)) throw CommError("link latency must be >= 0 s (got " + std::to_string(lat) + ")");
      if (!(bw > 0)) throw CommError("link bandwidth must be > 0 B/s (got " + std::to_string(bw) + ")");
      table[dst] = LinkParams{lat, bw};
    }
    engine_->links().set_links(table);
  }

  std::vector<std::tuple<std::string, double, double, double, int64_t, int64_t>> drain_records() {
    std::vector<std::tuple<std::string, double, double, double, int64_t, int64_t>> out;
    for (auto& r : engine_->drain_records()) out.emplace_back(r.op, r.post, r.start, r.end, r.bytes, r.round);
    return out;
  }

  void shutdown() {
    if (sub_) {
      closed_ = true;
      return;
    }
    py::gil_scoped_release nogil;
    engine_->shutdown();
    closed_ = true;
  }

  bool closed() const { return closed_ || !engine_->running(); }

 private:
  NativeComm(const NativeComm&) = default;

  void check_open() const {
    if (closed()) throw CommError("communicator is shut down");
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size_)
      throw CommError(std::string(what) + " " + std::to_string(r) + " out of range [0, " + std::to_string(size_) + ")");
  }

  std::unique_ptr<Handle> submit(const char* name, Schedule s, py::object keep) {
    int tag = static_cast<int>(seq_++ % engine_->tag_ub());
    auto st = std::make_shared<OpState>();
    {
      py::gil_scoped_release nogil;
      engine_->submit(std::make_unique<ScheduleOp>(name, st, StepExecutor(comm_, members(), world_, tag, std::move(s))));
    }
    return std::make_unique<Handle>(st, std::move(keep), graveyard_);
  }

  std::vector<int> members() const {
    std::vector<int> m(size_);
    for (int i = 0; i < size_; ++i) m[i] = i;
    return m;
  }

  std::shared_ptr<Engine> engine_;
  std::shared_ptr<P2P> p2p_;
  std::shared_ptr<Graveyard> graveyard_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_;  // comm rank -> world rank
  int64_t seq_ = 0;
  int64_t ring_threshold_;
  bool sub_ = false;
  bool closed_ = false;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Native collective layer of harness (private: use harness.comm)";
  static py::exception<CommError> comm_error(m, "CommError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CommError& e) {
      comm_error(e.what());
    }
  });
  m.def("now", &now, "Seconds on CLOCK_MONOTONIC (the clock of time.monotonic()).");
  m.def("is_sync_round", &wa_is_sync_round, py::arg("round"), py::arg("sync_every"));
  // The allreduce's steps as member `me` of `p` runs them for `count` floats: per step, its sends
  // and receives as (member, floats). The simulator's decomposition is tested against it.
  m.def(
      "allreduce_steps",
      [](int p, int me, int64_t count, int64_t ring_threshold_bytes) {
        if (p < 1 || me < 0 || me >= p || count < 0)
          throw CommError("allreduce_steps: need 0 <= me < p and count >= 0 (p=" + std::to_string(p) +
                          ", me=" + std::to_string(me) + ", count=" + std::to_string(count) + ")");
        std::vector<float> buf(static_cast<size_t>(count > 0 ? count : 1));
        Schedule s = allreduce_schedule(p, me, buf.data(), count, ring_threshold_bytes);
        py::list steps;
        for (const Step& step : s.steps) {
          py::list sends, recvs;
          for (const Xfer& x : step.sends) sends.append(py::make_tuple(x.peer, x.count));
          for (const Xfer& x : step.recvs) recvs.append(py::make_tuple(x.peer, x.count));
          steps.append(py::make_tuple(sends, recvs));
        }
        return steps;
      },
      py::arg("p"), py::arg("me"), py::arg("count"), py::arg("ring_threshold_bytes"));

  py::class_<Handle>(m, "Handle")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none())
      .def("done", &Handle::done)
      .def("times", &Handle::times);
  py::class_<RoundHandle, Handle>(m, "RoundHandle").def("info", &RoundHandle::info);

  py::class_<PushChannel>(m, "PushChannel")
      .def_property_readonly("count", &PushChannel::count)
      .def("send", &PushChannel::send, py::arg("buf"), py::arg("peers"), py::arg("round") = 0)
      .def("drain", &PushChannel::drain, py::arg("out"), py::arg("min_messages") = 0, py::arg("timeout") = py::none(),
           py::arg("round") = py::none())
      .def("pending", &PushChannel::pending, py::arg("round") = py::none())
      .def("flush", &PushChannel::flush, py::arg("close") = false);

  py::class_<WaitAvoiding>(m, "WaitAvoiding")
      .def("iround", &WaitAvoiding::iround, py::arg("buf"), py::arg("out"), py::arg("may_activate") = true)
      .def("close", &WaitAvoiding::close)
      .def_property_readonly("next_round", &WaitAvoiding::next_round)
      .def("is_sync_round", &WaitAvoiding::is_sync_round);

  py::class_<PairwiseAverager>(m, "PairwiseAverager")
      .def("publish", &PairwiseAverager::publish, py::arg("buf"))
      .def("request", &PairwiseAverager::request, py::arg("buf"), py::arg("out"), py::arg("peer"))
      .def("drain", &PairwiseAverager::drain, py::arg("out"))
      .def("close", &PairwiseAverager::close);

  py::class_<NativeComm>(m, "Comm")
      // No defaults here: harness.comm.Communicator holds them, in one place.
      .def(py::init<uintptr_t, double, double, int64_t>(), py::arg("handle"), py::arg("spin_us"),
           py::arg("max_sleep_us"), py::arg("ring_threshold_bytes"))
      .def_property_readonly("rank", &NativeComm::rank)
      .def_property_readonly("size", &NativeComm::size)
      .def_property_readonly("world_ranks", &NativeComm::world_ranks)
      .def_property_readonly("closed", &NativeComm::closed)
      .def("iallreduce", &NativeComm::iallreduce, py::arg("buf"), py::arg("op") = "sum")
      .def("ibroadcast", &NativeComm::ibroadcast, py::arg("buf"), py::arg("root") = 0)
      .def("ibarrier", &NativeComm::ibarrier)
      .def("iexchange", &NativeComm::iexchange, py::arg("send"), py::arg("recv"), py::arg("peer"))
      .def("subgroup", &NativeComm::subgroup, py::arg("ranks"))
      .def("push_channel", &NativeComm::push_channel, py::arg("count"))
      .def("wait_avoiding", &NativeComm::wait_avoiding, py::arg("initial"), py::arg("sync_every"),
           py::arg("accumulate"), py::arg("phases"))
      .def("pairwise_averager", &NativeComm::pairwise_averager, py::arg("initial"))
      .def("set_links", &NativeComm::set_links, py::arg("links"))
      .def("drain_records", &NativeComm::drain_records)
      .def("shutdown", &NativeComm::shutdown);
}
