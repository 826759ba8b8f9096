#include "group.hpp"

#include <algorithm>
#include <cstring>

namespace harness {

namespace {

constexpr int kCreateGroupTag = 7001;

char* at(void* base, int64_t elements, int esz) { return static_cast<char*>(base) + elements * esz; }

std::string op_what(const char* op, DType dtype) { return std::string(op) + " of " + elem_type(dtype).name; }

void check_count(int64_t count, const char* what) {
  if (count < 0 || count > INT32_MAX)
    throw CommError(std::string(what) + ": " + std::to_string(count) + " elements is out of range [0, 2^31)");
}

}  // namespace

Group::Group(std::shared_ptr<Engine> engine, std::vector<int> world_ranks, int64_t ring_threshold_bytes)
    : engine_(std::move(engine)), world_(std::move(world_ranks)), ring_threshold_(ring_threshold_bytes) {
  if (world_.empty()) throw CommError("a group needs at least one member");
  const int me = engine_->rank();
  auto it = std::find(world_.begin(), world_.end(), me);
  if (it == world_.end())
    throw CommError("rank " + std::to_string(me) + " builds a group it is not a member of");
  rank_ = static_cast<int>(it - world_.begin());
  for (int r : world_) check_rank(r, engine_->size(), "group member");
  std::vector<int> sorted = world_;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) throw CommError("group lists a rank twice");
  members_.resize(world_.size());
  for (size_t i = 0; i < world_.size(); ++i) members_[i] = static_cast<int>(i);
  MPI_Group world_group, group;
  check_mpi(MPI_Comm_group(engine_->comm(), &world_group), "MPI_Comm_group");
  int rc = MPI_Group_incl(world_group, static_cast<int>(world_.size()), world_.data(), &group);
  MPI_Group_free(&world_group);
  check_mpi(rc, "MPI_Group_incl");
  MPI_Comm created = MPI_COMM_NULL;
  rc = MPI_Comm_create_group(engine_->comm(), group, kCreateGroupTag, &created);
  MPI_Group_free(&group);
  check_mpi(rc, "MPI_Comm_create_group");
  MpiComm owned(created);
  p2p_comm_ = share(MpiComm::dup(owned.get()));
  comm_ = share(std::move(owned));
  shm_ = ShmChannel::open_on_host(comm_->get(), world_, &shm_why_not_);
  hier_ = HostHierarchy::open(comm_->get(), world_, ring_threshold_, &shm_why_not_);
}

ShmChannel* Group::shm_for(ShmKind kind, int64_t bytes, int tag) const {
  if (!shm_ || !shm_->wins(kind, bytes)) return nullptr;
  if (tag >= (engine_->tag_ub() + 1) / 2) return nullptr;  // a collective posted from a callback
  return engine_->links().message_path_among(world_) ? nullptr : shm_.get();
}

HostHierarchy* Group::hierarchy_for(ShmKind kind, int64_t bytes, int tag) const {
  if (!hier_ || !hier_->wins(kind, bytes)) return nullptr;
  if (tag >= (engine_->tag_ub() + 1) / 2) return nullptr;  // a collective posted from a callback
  return engine_->links().message_path_among(world_) ? nullptr : hier_.get();
}

template <class Build>
std::shared_ptr<OpState> Group::via_shm(const char* name, ShmCall call, bool block, Build&& build) {
  call.record_bytes = shm_->record_bytes(call, build);
  auto st = std::make_shared<OpState>();
  if (!block) {
    engine_->submit(shm_->op(name, st, call));
    return st;
  }
  st->t_post = now();
  st->mark_started();
  shm_->run(*engine_, name, call);
  st->finish();
  return st;
}

void Group::check_open(const char* what) const {
  if (!engine_->running()) throw CommError(std::string(what) + ": communicator is shut down");
}

std::shared_ptr<OpState> Group::submit(const char* name, StepProgram s, bool p2p, int tag) {
  int64_t seq = tag >= 0 ? tag : 0;
  if (!p2p && tag < 0) {
    std::lock_guard<std::mutex> lock(seq_mu_);
    seq = seq_++;
  }
  auto st = std::make_shared<OpState>();
  const int mpi_tag = static_cast<int>(seq % engine_->tag_ub());
  engine_->submit(std::make_unique<StepProgramOp>(
      name, st, StepExecutor(p2p ? p2p_comm_ : comm_, members_, world_, mpi_tag, std::move(s))));
  return st;
}

std::shared_ptr<OpState> Group::allreduce(TypedSpan buf, DType dtype, ReduceOp op, int tag, bool block) {
  const std::string what = op_what("allreduce", dtype);
  check_open(what.c_str());
  check_count(buf.count, what.c_str());
  const ElemType et = elem_type(dtype);
  ReduceFn fn = reduce_fn(dtype, op, what);
  const int p = size();
  auto build = [&] {
    StepProgram s = allreduce_program(p, rank_, buf.data, buf.count, ring_threshold_, engine_->links().allreduce_plan(world_),
                                    et.size);
    s.elem = et;
    s.reduce = fn;
    s.result = buf.data;
    s.count = buf.count;
    if (op == ReduceOp::kAvg) {
      s.divide = divide_fn(dtype, what);
      s.divide_by = p;
    }
    return s;
  };
  if (shm_for(ShmKind::kAllreduce, buf.count * et.size, tag)) {
    ShmCall call{ShmKind::kAllreduce, buf.data, buf.data, buf.count, et.size, fn};
    if (op == ReduceOp::kAvg) {
      call.divide = divide_fn(dtype, what);
      call.divide_by = p;
    }
    return via_shm("allreduce", call, block, build);
  }
  if (HostHierarchy* h = hierarchy_for(ShmKind::kAllreduce, buf.count * et.size, tag)) {
    ShmCall call{ShmKind::kAllreduce, buf.data, buf.data, buf.count, et.size, fn};
    if (op == ReduceOp::kAvg) {
      call.divide = divide_fn(dtype, what);
      call.divide_by = p;
    }
    call.record_bytes = h->local().record_bytes(call, build);
    auto st = std::make_shared<OpState>();
    engine_->submit(h->allreduce("allreduce", st, call, et));
    return st;
  }
  return submit("allreduce", build(), false, tag);
}

std::shared_ptr<OpState> Group::broadcast(TypedSpan buf, DType dtype, int root, int tag, bool block) {
  const std::string what = op_what("broadcast", dtype);
  check_open(what.c_str());
  check_count(buf.count, what.c_str());
  check_rank(root, size(), "broadcast root");
  const ElemType et = elem_type(dtype);
  auto build = [&] {
    StepProgram s = binomial_bcast(size(), rank_, root, buf.data, buf.count, et.size);
    s.elem = et;
    return s;
  };
  if (shm_for(ShmKind::kBroadcast, buf.count * et.size, tag)) {
    ShmCall call{ShmKind::kBroadcast, buf.data, buf.data, buf.count, et.size};
    call.root = root;
    return via_shm("broadcast", call, block, build);
  }
  return submit("broadcast", build(), false, tag);
}

std::shared_ptr<OpState> Group::reduce(TypedSpan buf, DType dtype, ReduceOp op, int root, int tag, bool block) {
  const std::string what = op_what("reduce", dtype);
  check_open(what.c_str());
  check_count(buf.count, what.c_str());
  check_rank(root, size(), "reduce root");
  const ElemType et = elem_type(dtype);
  const int p = size(), esz = et.size;
  const int64_t n = buf.count;
  auto build = [&] {
    StepProgram s;
    s.elem = et;
    s.reduce = reduce_fn(dtype, op, what);
    s.count = n;
    const bool is_root = rank_ == root;
    if (is_root && op == ReduceOp::kAvg) {
      s.divide = divide_fn(dtype, what);
      s.divide_by = p;
    }
    // Binomial tree towards root over virtual ranks v = (me - root) mod p; a non-root reduces in
    // a copy so that its own buffer stays as it was.
    char* tmp = alloc_scratch(s, 2 * n * esz);
    void* work = is_root ? buf.data : tmp + n * esz;
    if (!is_root) std::memcpy(work, buf.data, static_cast<size_t>(n * esz));
    s.result = work;
    const int v = (rank_ - root + p) % p;
    auto real = [&](int vr) { return (vr + root) % p; };
    for (int mask = 1; mask < p; mask <<= 1) {
      if (v & mask) {
        s.steps.push_back({{{real(v - mask), work, n}}, {}, {}});
        break;
      }
      if (v + mask < p) s.steps.push_back({{}, {{real(v + mask), tmp, n}}, {{work, tmp, n}}});
    }
    return s;
  };
  if (shm_for(ShmKind::kReduce, n * esz, tag)) {
    ShmCall call{ShmKind::kReduce, buf.data, buf.data, n, esz, reduce_fn(dtype, op, what)};
    call.root = root;
    if (op == ReduceOp::kAvg) {
      call.divide = divide_fn(dtype, what);
      call.divide_by = p;
    }
    return via_shm("reduce", call, block, build);
  }
  return submit("reduce", build(), false, tag);
}

std::shared_ptr<OpState> Group::allgather(TypedSpan in, TypedSpan out, DType dtype, int tag, bool block) {
  const std::string what = op_what("allgather", dtype);
  check_open(what.c_str());
  check_count(out.count, what.c_str());
  const int p = size();
  const int64_t n = in.count;
  if (out.count != n * p)
    throw CommError(what + ": the output holds " + std::to_string(out.count) + " elements, not " +
                    std::to_string(p) + " x " + std::to_string(n));
  const ElemType et = elem_type(dtype);
  const int esz = et.size;
  auto build = [&] {
    char* mine = at(out.data, rank_ * n, esz);
    if (mine != in.data) std::memmove(mine, in.data, static_cast<size_t>(n * esz));
    StepProgram s;
    s.elem = et;
    s.count = out.count;
    const int right = (rank_ + 1) % p, left = (rank_ + p - 1) % p;
    auto chunk = [&](int k) { return at(out.data, ((k % p + p) % p) * n, esz); };
    for (int st = 0; st < p - 1; ++st)
      s.steps.push_back({{{right, chunk(rank_ - st), n}}, {{left, chunk(rank_ - st - 1), n}}, {}});
    return s;
  };
  if (shm_for(ShmKind::kAllgather, out.count * esz, tag)) {
    ShmCall call{ShmKind::kAllgather, in.data, out.data, n, esz};
    return via_shm("allgather", call, block, build);
  }
  return submit("allgather", build(), false, tag);
}

std::shared_ptr<OpState> Group::reduce_scatter(TypedSpan in, TypedSpan out, DType dtype, ReduceOp op, int tag,
                                              bool block) {
  const std::string what = op_what("reduce_scatter", dtype);
  check_open(what.c_str());
  check_count(in.count, what.c_str());
  const int p = size();
  const int64_t n = out.count;
  if (in.count != n * p)
    throw CommError(what + ": the input holds " + std::to_string(in.count) + " elements, not " + std::to_string(p) +
                    " x " + std::to_string(n));
  const ElemType et = elem_type(dtype);
  const int esz = et.size;
  auto build = [&] {
    StepProgram s;
    s.elem = et;
    s.reduce = reduce_fn(dtype, op, what);
    // Ring reduce-scatter in a copy of the input: at step t a member sends chunk (me - t - 1) to
    // its right and adds the chunk (me - t - 2) its left sends; after p - 1 steps its chunk `me`
    // holds every member's contribution.
    char* work = alloc_scratch(s, (in.count + n) * esz);
    char* tmp = work + in.count * esz;
    std::memcpy(work, in.data, static_cast<size_t>(in.count * esz));
    const int right = (rank_ + 1) % p, left = (rank_ + p - 1) % p;
    auto chunk = [&](int k) { return work + ((k % p + p) % p) * n * esz; };
    for (int st = 0; st < p - 1; ++st)
      s.steps.push_back({{{right, chunk(rank_ - st - 1), n}}, {{left, tmp, n}}, {{chunk(rank_ - st - 2), tmp, n}}});
    s.result = chunk(rank_);
    s.count = n;
    if (op == ReduceOp::kAvg) {
      s.divide = divide_fn(dtype, what);
      s.divide_by = p;
    }
    void* result = s.result;
    void* dst = out.data;
    const size_t bytes = static_cast<size_t>(n * esz);
    s.on_done = [result, dst, bytes] { std::memcpy(dst, result, bytes); };
    return s;
  };
  if (shm_for(ShmKind::kReduceScatter, in.count * esz, tag)) {
    ShmCall call{ShmKind::kReduceScatter, in.data, out.data, n, esz, reduce_fn(dtype, op, what)};
    if (op == ReduceOp::kAvg) {
      call.divide = divide_fn(dtype, what);
      call.divide_by = p;
    }
    return via_shm("reduce_scatter", call, block, build);
  }
  return submit("reduce_scatter", build(), false, tag);
}

std::shared_ptr<OpState> Group::gather(TypedSpan in, TypedSpan out, DType dtype, int root, int tag, bool block) {
  const std::string what = op_what("gather", dtype);
  check_open(what.c_str());
  check_count(in.count, what.c_str());
  check_rank(root, size(), "gather root");
  const int p = size();
  const int64_t n = in.count;
  const ElemType et = elem_type(dtype);
  if (rank_ == root && out.count != n * p)
    throw CommError(what + ": the root's output holds " + std::to_string(out.count) + " elements, not " +
                    std::to_string(p) + " x " + std::to_string(n));
  auto build = [&] {
    StepProgram s;
    s.elem = et;
    Step step;
    if (rank_ == root) {
      std::memmove(at(out.data, rank_ * n, et.size), in.data, static_cast<size_t>(n * et.size));
      for (int m = 0; m < p; ++m)
        if (m != rank_) step.recvs.push_back({m, at(out.data, m * n, et.size), n});
    } else {
      step.sends.push_back({root, in.data, n});
    }
    if (p > 1) s.steps.push_back(std::move(step));
    return s;
  };
  if (shm_for(ShmKind::kGather, n * p * et.size, tag)) {
    ShmCall call{ShmKind::kGather, in.data, out.data, n, et.size};
    call.root = root;
    return via_shm("gather", call, block, build);
  }
  return submit("gather", build(), false, tag);
}

std::shared_ptr<OpState> Group::scatter(TypedSpan in, TypedSpan out, DType dtype, int root, int tag, bool block) {
  const std::string what = op_what("scatter", dtype);
  check_open(what.c_str());
  check_count(out.count, what.c_str());
  check_rank(root, size(), "scatter root");
  const int p = size();
  const int64_t n = out.count;
  const ElemType et = elem_type(dtype);
  if (rank_ == root && in.count != n * p)
    throw CommError(what + ": the root's input holds " + std::to_string(in.count) + " elements, not " +
                    std::to_string(p) + " x " + std::to_string(n));
  auto build = [&] {
    StepProgram s;
    s.elem = et;
    Step step;
    if (rank_ == root) {
      std::memmove(out.data, at(in.data, rank_ * n, et.size), static_cast<size_t>(n * et.size));
      for (int m = 0; m < p; ++m)
        if (m != rank_) step.sends.push_back({m, at(in.data, m * n, et.size), n});
    } else {
      step.recvs.push_back({root, out.data, n});
    }
    if (p > 1) s.steps.push_back(std::move(step));
    return s;
  };
  if (shm_for(ShmKind::kScatter, n * p * et.size, tag)) {
    ShmCall call{ShmKind::kScatter, in.data, out.data, n, et.size};
    call.root = root;
    return via_shm("scatter", call, block, build);
  }
  return submit("scatter", build(), false, tag);
}

std::shared_ptr<OpState> Group::alltoall(TypedSpan in, TypedSpan out, DType dtype,
                                         const std::vector<int64_t>& send_counts,
                                         const std::vector<int64_t>& recv_counts, int tag) {
  const std::string what = op_what("alltoall", dtype);
  check_open(what.c_str());
  const int p = size();
  if (static_cast<int>(send_counts.size()) != p || static_cast<int>(recv_counts.size()) != p)
    throw CommError(what + ": needs one send and one receive count per member (" + std::to_string(p) + ")");
  int64_t send_total = 0, recv_total = 0;
  for (int m = 0; m < p; ++m) {
    check_count(send_counts[m], what.c_str());
    check_count(recv_counts[m], what.c_str());
    send_total += send_counts[m];
    recv_total += recv_counts[m];
  }
  if (send_total != in.count || recv_total != out.count)
    throw CommError(what + ": the counts add up to " + std::to_string(send_total) + " sent and " +
                    std::to_string(recv_total) + " received elements, the tensors hold " + std::to_string(in.count) +
                    " and " + std::to_string(out.count));
  if (send_counts[rank_] != recv_counts[rank_])
    throw CommError(what + ": this rank sends itself " + std::to_string(send_counts[rank_]) + " elements but expects " +
                    std::to_string(recv_counts[rank_]));
  const ElemType et = elem_type(dtype);
  StepProgram s;
  s.elem = et;
  Step step;
  int64_t so = 0, ro = 0;
  for (int m = 0; m < p; ++m) {
    if (m == rank_) {
      std::memmove(at(out.data, ro, et.size), at(in.data, so, et.size), static_cast<size_t>(send_counts[m] * et.size));
    } else {
      step.sends.push_back({m, at(in.data, so, et.size), send_counts[m]});
      step.recvs.push_back({m, at(out.data, ro, et.size), recv_counts[m]});
    }
    so += send_counts[m];
    ro += recv_counts[m];
  }
  if (p > 1) s.steps.push_back(std::move(step));
  return submit("alltoall", std::move(s), false, tag);
}

std::shared_ptr<OpState> Group::barrier(int tag, bool block) {
  check_open("barrier");
  auto build = [&] { return dissemination_barrier(size(), rank_); };
  if (shm_for(ShmKind::kBarrier, 0, tag)) return via_shm("barrier", ShmCall{}, block, build);
  if (HostHierarchy* h = hierarchy_for(ShmKind::kBarrier, 0, tag)) {
    auto st = std::make_shared<OpState>();
    engine_->submit(h->barrier("barrier", st));
    return st;
  }
  return submit("barrier", build(), false, tag);
}

std::shared_ptr<OpState> Group::send(TypedSpan buf, DType dtype, int dst, int tag) {
  const std::string what = op_what("send", dtype);
  check_open(what.c_str());
  check_count(buf.count, what.c_str());
  check_rank(dst, size(), "send destination");
  if (dst == rank_) throw CommError(what + ": a rank cannot send to itself");
  if (tag < 0 || tag > engine_->tag_ub())
    throw CommError(what + ": tag " + std::to_string(tag) + " out of range [0, " + std::to_string(engine_->tag_ub()) + "]");
  StepProgram s;
  s.elem = elem_type(dtype);
  s.steps.push_back({{{dst, buf.data, buf.count, tag}}, {}, {}});
  return submit("send", std::move(s), true);
}

std::shared_ptr<OpState> Group::recv(TypedSpan buf, DType dtype, int src, int tag) {
  const std::string what = op_what("recv", dtype);
  check_open(what.c_str());
  check_count(buf.count, what.c_str());
  check_rank(src, size(), "receive source");
  if (src == rank_) throw CommError(what + ": a rank cannot receive from itself");
  if (tag < 0 || tag > engine_->tag_ub())
    throw CommError(what + ": tag " + std::to_string(tag) + " out of range [0, " + std::to_string(engine_->tag_ub()) + "]");
  StepProgram s;
  s.elem = elem_type(dtype);
  s.steps.push_back({{}, {{src, buf.data, buf.count, tag}}, {}});
  return submit("recv", std::move(s), true);
}

}  // namespace harness
