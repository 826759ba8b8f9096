#include "communicator.hpp"

#include <algorithm>
#include <unordered_map>

namespace harness {

Communicator::Communicator(MPI_Comm parent, EngineOptions options, int64_t ring_threshold_bytes,
                           int64_t tree_chunk_bytes)
    : engine_(std::make_shared<Engine>(parent, options)), ring_threshold_(ring_threshold_bytes) {
  if (tree_chunk_bytes <= 0)
    throw CommError("tree_chunk_bytes must be > 0 (got " + std::to_string(tree_chunk_bytes) + ")");
  // Every allreduce takes it from its plan (the link emulator hands out the plans).
  engine_->links().set_tree_chunk_bytes(tree_chunk_bytes);
  exchange_comm_ = engine_->dup_comm();
  everyone_.resize(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) everyone_[i] = i;
  SharedComm layout = engine_->dup_comm();  // for the collective set-up below only
  shm_ = ShmChannel::open_on_host(layout->get(), everyone_, &shm_why_not_);
  hier_ = HostHierarchy::open(layout->get(), everyone_, ring_threshold_, &shm_why_not_);
}

ShmChannel* Communicator::shm_for(ShmKind kind, int64_t bytes) const {
  if (!shm_ || !shm_->wins(kind, bytes) || engine_->links().message_path_among(everyone_)) return nullptr;
  return shm_.get();
}

HostHierarchy* Communicator::hierarchy_for(ShmKind kind, int64_t bytes) const {
  if (!hier_ || !hier_->wins(kind, bytes) || engine_->links().message_path_among(everyone_)) return nullptr;
  return hier_.get();
}

StepProgram Communicator::allreduce_steps(FloatSpan buf, const std::string& op) const {
  StepProgram s = allreduce_program(size(), rank(), buf.data, buf.count, ring_threshold_,
                                    engine_->links().allreduce_plan(everyone_));
  s.result = buf.data;
  s.count = buf.count;
  s.divide_by = op == "mean" ? size() : 1;
  return s;
}

ShmCall Communicator::allreduce_call(ShmChannel& shm, FloatSpan buf, const std::string& op) const {
  ShmCall call{ShmKind::kAllreduce, buf.data, buf.data, buf.count, 4, reduce_fn(DType::kF32, ReduceOp::kSum, "allreduce")};
  if (op == "mean") {
    call.divide = divide_fn(DType::kF32, "allreduce");
    call.divide_by = size();
  }
  call.record_bytes = shm.record_bytes(call, [&] { return allreduce_steps(buf, op); });
  return call;
}

ShmCall Communicator::broadcast_call(ShmChannel& shm, FloatSpan buf, int root) const {
  ShmCall call{ShmKind::kBroadcast, buf.data, buf.data, buf.count, 4};
  call.root = root;
  call.record_bytes = shm.record_bytes(call, [&] { return binomial_bcast(size(), rank(), root, buf.data, buf.count); });
  return call;
}

namespace {
void check_allreduce_op(const std::string& op) {
  if (op != "sum" && op != "mean") throw CommError("allreduce op must be 'sum' or 'mean' (got '" + op + "')");
}
}  // namespace

void Communicator::wait_for(const std::shared_ptr<OpState>& st) {
  st->wait(-1);
  st->throw_if_failed();
}

void Communicator::allreduce(FloatSpan buf, const std::string& op) {
  check_open();
  check_allreduce_op(op);
  if (ShmChannel* shm = shm_for(ShmKind::kAllreduce, buf.count * 4))
    return shm->run(*engine_, "allreduce", allreduce_call(*shm, buf, op));
  wait_for(iallreduce(buf, op));
}

void Communicator::broadcast(FloatSpan buf, int root) {
  check_open();
  check_rank(root, size(), "broadcast root");
  if (ShmChannel* shm = shm_for(ShmKind::kBroadcast, buf.count * 4))
    return shm->run(*engine_, "broadcast", broadcast_call(*shm, buf, root));
  wait_for(ibroadcast(buf, root));
}

void Communicator::barrier() {
  check_open();
  if (ShmChannel* shm = shm_for(ShmKind::kBarrier, 0)) return shm->run(*engine_, "barrier", ShmCall{});
  wait_for(ibarrier());
}

std::shared_ptr<OpState> Communicator::iallreduce(FloatSpan buf, const std::string& op) {
  check_open();
  check_allreduce_op(op);
  if (ShmChannel* shm = shm_for(ShmKind::kAllreduce, buf.count * 4)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(shm->op("allreduce", st, allreduce_call(*shm, buf, op)));
    return st;
  }
  if (HostHierarchy* h = hierarchy_for(ShmKind::kAllreduce, buf.count * 4)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(h->allreduce("allreduce", st, allreduce_call(h->local(), buf, op), elem_type(DType::kF32)));
    return st;
  }
  return submit("allreduce", allreduce_steps(buf, op));
}

std::shared_ptr<OpState> Communicator::ibroadcast(FloatSpan buf, int root) {
  check_open();
  check_rank(root, size(), "broadcast root");
  if (ShmChannel* shm = shm_for(ShmKind::kBroadcast, buf.count * 4)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(shm->op("broadcast", st, broadcast_call(*shm, buf, root)));
    return st;
  }
  return submit("broadcast", binomial_bcast(size(), rank(), root, buf.data, buf.count));
}

std::shared_ptr<OpState> Communicator::ibarrier() {
  check_open();
  // A barrier's messages are empty: its record counts no bytes on either path.
  if (ShmChannel* shm = shm_for(ShmKind::kBarrier, 0)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(shm->op("barrier", st, ShmCall{}));
    return st;
  }
  if (HostHierarchy* h = hierarchy_for(ShmKind::kBarrier, 0)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(h->barrier("barrier", st));
    return st;
  }
  return submit("barrier", dissemination_barrier(size(), rank()));
}

std::shared_ptr<OpState> Communicator::iexchange(FloatSpan send, FloatSpan recv, int peer) {
  check_open();
  check_rank(peer, size(), "exchange peer");
  if (peer == rank())
    throw CommError("exchange peer must be another rank (got this rank, " + std::to_string(peer) + ")");
  if (send.count != recv.count)
    throw CommError("exchange buffers differ in length (" + std::to_string(send.count) + " vs " +
                    std::to_string(recv.count) + ")");
  if (send.data == recv.data) throw CommError("exchange send and receive buffers must not be the same memory");
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(seq_mu_);
    seq = exchange_seq_[peer]++;
  }
  StepProgram sch;
  sch.steps.push_back({{{1, send.data, send.count}}, {{1, recv.data, recv.count}}, {}});
  auto st = std::make_shared<OpState>();
  const int me = rank();
  engine_->submit(std::make_unique<StepProgramOp>(
      "exchange", st,
      StepExecutor(exchange_comm_, {me, peer}, {me, peer}, static_cast<int>(seq % engine_->tag_ub()), std::move(sch))));
  return st;
}

std::unique_ptr<PushChannel> Communicator::push_channel(int64_t count) {
  check_open();
  return std::make_unique<PushChannel>(engine_, count);
}

std::unique_ptr<WaitAvoiding> Communicator::wait_avoiding(FloatSpan initial, int sync_every, bool accumulate,
                                                          std::vector<std::vector<int>> phases, int quorum) {
  check_open();
  return std::make_unique<WaitAvoiding>(engine_, initial, sync_every, accumulate, std::move(phases), ring_threshold_,
                                        quorum);
}

std::unique_ptr<PairwiseAverager> Communicator::pairwise_averager(FloatSpan initial) {
  check_open();
  return std::make_unique<PairwiseAverager>(engine_, initial);
}

std::unique_ptr<Group> Communicator::group(std::vector<int> world_ranks) {
  check_open();
  return std::make_unique<Group>(engine_, std::move(world_ranks), ring_threshold_);
}

void Communicator::set_links(const std::vector<std::tuple<int, double, double>>& links,
                             std::vector<std::pair<int, int>> emulated_pairs) {
  for (auto& [src, dst] : emulated_pairs) {
    check_rank(src, size(), "emulated link source");
    check_rank(dst, size(), "emulated link destination");
  }
  std::unordered_map<int, LinkParams> table;
  for (auto& [dst, lat, bw] : links) {
    check_rank(dst, size(), "link destination");
    if (!(lat >= 0)) throw CommError("link latency must be >= 0 s (got " + std::to_string(lat) + ")");
    if (!(bw > 0)) throw CommError("link bandwidth must be > 0 B/s (got " + std::to_string(bw) + ")");
    table[dst] = LinkParams{lat, bw};
  }
  engine_->links().set_links(table);
  engine_->links().set_emulated_pairs(std::move(emulated_pairs));
}

void Communicator::set_allreduce(const std::string& algorithm) {
  check_open();
  engine_->links().set_allreduce(allreduce_algorithm_named(algorithm));
}

void Communicator::set_topology(const std::vector<int>& node_of, std::tuple<double, double> intra,
                                std::tuple<double, double> nic, double fabric_Bps) {
  check_open();
  if (static_cast<int>(node_of.size()) != size())
    throw CommError("topology: " + std::to_string(node_of.size()) + " node ids for " + std::to_string(size()) + " ranks");
  int nodes = 0;
  for (int n : node_of) {
    if (n < 0) throw CommError("topology: node ids must be >= 0 (got " + std::to_string(n) + ")");
    nodes = std::max(nodes, n + 1);
  }
  auto params = [](std::tuple<double, double> t, const char* what) {
    auto [lat, bw] = t;
    if (!(lat >= 0) || !(bw > 0))
      throw CommError(std::string("topology: ") + what + " needs latency >= 0 s and bandwidth > 0 B/s");
    return LinkParams{lat, bw};
  };
  Topology topo{node_of, params(intra, "intra-node link"), params(nic, "NIC"), fabric_Bps};
  if (!(fabric_Bps > 0)) throw CommError("topology: fabric bandwidth must be > 0 B/s");
  // Collective: every rank maps the same table (or none does: the decision is the same everywhere).
  std::shared_ptr<SharedNics> nics;
  if (topo.shares_resources()) nics = SharedNics::create(engine_->dup_comm()->get(), nodes);
  engine_->links().set_topology(std::move(topo), std::move(nics));
}

void Communicator::shutdown() {
  engine_->shutdown();
  closed_ = true;
}

void Communicator::check_open() const {
  if (closed()) throw CommError("communicator is shut down");
}

std::shared_ptr<OpState> Communicator::submit(const char* name, StepProgram s) {
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(seq_mu_);
    seq = collective_seq_++;
  }
  auto st = std::make_shared<OpState>();
  // The engine's communicator duplicates the world: members are world ranks as well.
  const int tag = static_cast<int>(seq % engine_->tag_ub());
  engine_->submit(std::make_unique<StepProgramOp>(
      name, st, StepExecutor(engine_->shared_comm(), everyone_, everyone_, tag, std::move(s))));
  return st;
}

}  // namespace harness
