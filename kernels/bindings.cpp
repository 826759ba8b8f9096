// pybind11 bindings: the private module harness._core behind harness.comm.
//
// Glue only. Every entry point converts its Python arguments with the GIL held, then releases
// the GIL and calls the operation's caller side (communicator.hpp, *_caller.hpp), so Python
// threads and the progress thread never block each other. What must outlive a call (the
// Python buffers an operation still uses) is kept here, in handles and the graveyard.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <type_traits>

#include "communicator.hpp"
#include "mpi_library.hpp"

namespace py = pybind11;
using namespace harness;

namespace {

FloatSpan float_buffer_checked(const py::object& obj, bool writable, const char* what);

// Checks that `obj` is a C-contiguous float32 buffer (and writable if asked). The common case
// asks the exporter for exactly that (no shape or stride vectors: every blocking call passes
// here); anything else takes the checked path, which says what is wrong.
FloatSpan float_buffer(const py::object& obj, bool writable, const char* what) {
  Py_buffer view;
  const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    return float_buffer_checked(obj, writable, what);
  }
  const bool plain = view.itemsize == 4 && view.format && view.format[0] == 'f' && view.format[1] == 0 &&
                     view.len / 4 <= INT_MAX;
  FloatSpan span{static_cast<float*>(view.buf), static_cast<int64_t>(view.len / 4)};
  PyBuffer_Release(&view);
  return plain ? span : float_buffer_checked(obj, writable, what);
}

FloatSpan float_buffer_checked(const py::object& obj, bool writable, const char* what) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    // A CPU torch tensor (no buffer protocol): its numpy view, or the error saying what is wrong
    // (harness.comm.buffers). The view shares the tensor's memory, which the caller holds.
    py::object view = py::module_::import("harness.comm.buffers").attr("as_float32_buffer")(obj, what);
    if (view.ptr() != obj.ptr()) return float_buffer(view, writable, what);
  }
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

// Runs `f` with the GIL released (the caller sides never touch Python objects).
template <class F>
auto without_gil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

// Buffers of operations whose handle was dropped before the operation ended, or while MPI may
// still use them after it ended (a request of a failed op in the engine's quarantine). The
// buffer objects are parked here (touched only with the GIL held) until the memory is free
// (OpState::buffers_free). One per communicator.
struct Graveyard {
  std::vector<std::pair<std::shared_ptr<OpState>, py::object>> items;
  void sweep() {
    items.erase(std::remove_if(items.begin(), items.end(), [](auto& it) { return it.first->buffers_free(); }),
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
    // op or MPI may still use.
    if (st_ && !st_->buffers_free() && !keep_.is_none()) graveyard_->items.emplace_back(st_, std::move(keep_));
  }
  void wait(std::optional<double> timeout) {
    bool ok = without_gil([&] { return st_->wait(timeout ? *timeout : -1.0); });
    if (!ok) throw CommError("operation did not complete within " + std::to_string(*timeout) + " s", ErrorKind::kTimeout);
    st_->throw_if_failed();
  }
  bool done() { return st_->is_done(); }
  // Pushes `id` into `cq` once the op is done (at once if it is).
  void notify(std::shared_ptr<CompletionQueue> cq, int64_t id) {
    st_->when_done([cq = std::move(cq), id] { cq->push(id); });
  }
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
  RoundHandle(WaitAvoiding::Round round, py::object keep, std::shared_ptr<Graveyard> g)
      : Handle(std::move(round.state), std::move(keep), std::move(g)), info_(std::move(round.info)) {}
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

// A native object as Python holds it: its caller side, and the graveyard of its communicator,
// where the handles it returns park their buffers. The graveyard is declared first so that it
// is released last: parked buffers outlive the engine a last reference shuts down.
template <class T>
struct Held {
  std::shared_ptr<Graveyard> graveyard;
  std::unique_ptr<T> native;
};

using PyComm = Held<Communicator>;
using PyPushChannel = Held<PushChannel>;
using PyWaitAvoiding = Held<WaitAvoiding>;
using PyPairwiseAverager = Held<PairwiseAverager>;
using PyGroup = Held<Group>;

// A tensor's memory as harness.dist lends it: its address and element count (the Python side
// checked that it is contiguous host memory of the dtype it names and keeps it alive).
// An MPI_Comm from mpi4py's handle (MPI._handleof): an integer under the MPICH ABI, a pointer
// under Open MPI.
template <typename Comm = MPI_Comm>
Comm comm_of_handle(uintptr_t handle) {
  if constexpr (std::is_pointer_v<Comm>) {
    return reinterpret_cast<Comm>(handle);
  } else {
    return static_cast<Comm>(handle);
  }
}

TypedSpan span(uintptr_t ptr, int64_t count) { return {reinterpret_cast<void*>(ptr), count}; }

// The Python exception class of each error kind (common.hpp); the kind itself rides along as
// the exception's `kind` attribute.
PyObject* exception_of(ErrorKind kind, const py::exception<CommError>& comm_error,
                       const py::exception<CommError>& peer_lost_error) {
  switch (kind) {
    case ErrorKind::kPeerLost: return peer_lost_error.ptr();
    case ErrorKind::kLocal:
    case ErrorKind::kTimeout:
    case ErrorKind::kInternal: return comm_error.ptr();
  }
  return comm_error.ptr();
}

// Throws the CommError of `kind` with `message`: how the mapping of kinds to Python exceptions
// is tested without making MPI fail.
void raise_error(ErrorKind kind, const std::string& message) { throw CommError(message, kind); }

// The allreduce's steps as member `me` of `p` runs them for `count` floats with `algorithm`
// (member_nodes: the node of every member, for "hierarchical" and "tree"; tree_chunk_bytes: the
// tree's chunk size, harness.schedules.TREE_CHUNK_BYTES): per step, its sends and receives as
// (member, floats). The simulator's decomposition is tested against it.
py::list allreduce_steps(int p, int me, int64_t count, int64_t ring_threshold_bytes,
                         const std::vector<int>& member_nodes, const std::string& algorithm,
                         int64_t tree_chunk_bytes) {
  if (p < 1 || me < 0 || me >= p || count < 0)
    throw CommError("allreduce_steps: need 0 <= me < p and count >= 0 (p=" + std::to_string(p) +
                    ", me=" + std::to_string(me) + ", count=" + std::to_string(count) + ")");
  std::vector<float> buf(static_cast<size_t>(count > 0 ? count : 1));
  AllreducePlan plan{allreduce_algorithm_named(algorithm), member_nodes, tree_chunk_bytes};
  StepProgram s = allreduce_program(p, me, buf.data(), count, ring_threshold_bytes, plan);
  py::list steps;
  for (const Step& step : s.steps) {
    py::list sends, recvs;
    for (const Xfer& x : step.sends) sends.append(py::make_tuple(x.peer, x.count));
    for (const Xfer& x : step.recvs) recvs.append(py::make_tuple(x.peer, x.count));
    steps.append(py::make_tuple(sends, recvs));
  }
  return steps;
}

// Release times of messages (src, dst, bytes, post time) offered in that order to the native
// link emulators of `ranks` ranks that share one NIC table in this process: the emulator's rule
// without MPI, which the simulator's network model is tested against.
std::vector<double> emulated_releases(int ranks, const std::vector<std::tuple<int, int, double, double>>& pair_links,
                                      const std::vector<int>& node_of, std::tuple<double, double> intra,
                                      std::tuple<double, double> nic, double fabric_Bps,
                                      const std::vector<std::tuple<int, int, double, double>>& messages) {
  std::vector<LinkEmulator> emulators(static_cast<size_t>(ranks));
  std::shared_ptr<SharedNics> nics;
  Topology topo{node_of, {std::get<0>(intra), std::get<1>(intra)}, {std::get<0>(nic), std::get<1>(nic)}, fabric_Bps};
  if (!node_of.empty()) {
    if (static_cast<int>(node_of.size()) != ranks) throw CommError("emulated_releases: one node per rank needed");
    if (topo.shares_resources()) nics = SharedNics::local(*std::max_element(node_of.begin(), node_of.end()) + 1);
  }
  std::vector<std::unordered_map<int, LinkParams>> tables(static_cast<size_t>(ranks));
  for (auto& [src, dst, lat, bw] : pair_links) tables.at(static_cast<size_t>(src))[dst] = LinkParams{lat, bw};
  for (int r = 0; r < ranks; ++r) {
    emulators[r].set_self(r);
    emulators[r].set_links(tables[r]);
    if (!node_of.empty()) emulators[r].set_topology(topo, nics);
  }
  std::vector<double> out;
  for (auto& [src, dst, bytes, post] : messages) out.push_back(emulators.at(static_cast<size_t>(src)).release_time(dst, bytes, post));
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Native collective layer of harness (private: use harness.comm)";
  // The codes Python passes across: kept here only, Python reads them from the module.
  py::enum_<ErrorKind>(m, "ErrorKind", "What kind of failure a CommError reports (its `kind`).")
      .value("LOCAL", ErrorKind::kLocal)
      .value("PEER_LOST", ErrorKind::kPeerLost)
      .value("TIMEOUT", ErrorKind::kTimeout)
      .value("INTERNAL", ErrorKind::kInternal);
  py::enum_<DType> dtypes(m, "DType", "Element types of the typed collectives, by torch's dtype names.");
  for (DType d : kAllDTypes) dtypes.value(elem_type(d).name, d);
  py::enum_<ReduceOp> reduce_ops(m, "ReduceOp", "Reduction operators, by torch.distributed.ReduceOp's names.");
  for (ReduceOp op : kAllReduceOps) reduce_ops.value(reduce_op_name(op), op);
  py::enum_<AllreduceAlgorithm> algorithms(m, "AllreduceAlgorithm", "Allreduce algorithms, by their scenario names.");
  for (const NamedAllreduceAlgorithm& a : kAllreduceAlgorithms) algorithms.value(a.name, a.algorithm);

  static py::exception<CommError> comm_error(m, "CommError");
  // A CommError about another rank's death (ErrorKind::kPeerLost), not this rank's own: the
  // worker reports it to the watchdog as a consequence.
  static py::exception<CommError> peer_lost_error(m, "PeerLostError", comm_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CommError& e) {
      PyObject* type = exception_of(e.kind(), comm_error, peer_lost_error);
      py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
      exc.attr("kind") = py::cast(e.kind());
      PyErr_SetObject(type, exc.ptr());
    }
  });
  m.def("raise_error", &raise_error, py::arg("kind"), py::arg("message"),
        "Raise the exception of a native CommError of `kind` (what the error translation is tested with).");
  m.def("now", &now, "Seconds on CLOCK_MONOTONIC (the clock of time.monotonic()).");
  m.def(
      "mpi_build",
      [] {
        const MpiBuild b = mpi_build();
        py::dict d;
        d["family"] = b.family;
        d["compiled_with"] = b.compiled_with;
        d["mpicc"] = b.mpicc;
        d["mpi_version"] = b.mpi_version;
        return d;
      },
      "The MPI the layer was built against: family (mpich/openmpi), headers' version, wrapper (empty: the wheel).");
  m.def("mpi_library_version", &mpi_library_version, "MPI_Get_library_version of the library the layer calls.");
  m.def("mpi_library_path", &mpi_library_path, "The file of the MPI library the layer calls.");
  m.def("mpi_libraries_loaded", &mpi_libraries_loaded, "Every MPI library file mapped into this process.");
  m.def("mpi_cuda_support", &mpi_cuda_support,
        "MPIX_Query_cuda_support(): 1, 0, or -1 when the library has no such function (after MPI_Init).");
  m.def("is_sync_round", &wa_is_sync_round, py::arg("round"), py::arg("sync_every"));
  m.def("allreduce_steps", &allreduce_steps, py::arg("p"), py::arg("me"), py::arg("count"),
        py::arg("ring_threshold_bytes"), py::arg("member_nodes") = std::vector<int>{},
        py::arg("algorithm") = std::string("auto"), py::arg("tree_chunk_bytes") = 0);
  m.def("emulated_releases", &emulated_releases, py::arg("ranks"), py::arg("pair_links"), py::arg("node_of"),
        py::arg("intra"), py::arg("nic"), py::arg("fabric_Bps"), py::arg("messages"));

  py::class_<Handle>(m, "Handle")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none())
      .def("done", &Handle::done)
      .def("notify", &Handle::notify, py::arg("queue"), py::arg("id"))
      .def("times", &Handle::times);
  py::class_<RoundHandle, Handle>(m, "RoundHandle").def("info", &RoundHandle::info);

  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(m, "CompletionQueue")
      .def(py::init<>())
      .def(
          "pop", [](CompletionQueue& q, std::optional<double> timeout) { return q.pop(timeout ? *timeout : -1.0); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("close", &CompletionQueue::close);

  // Every operation takes `keep` (the tensors whose memory it uses; held until it is done), then
  // addresses and element counts, and returns a Handle.
  auto handle = [](PyGroup& g, std::shared_ptr<OpState> st, py::object keep) {
    return std::make_unique<Handle>(std::move(st), std::move(keep), g.graveyard);
  };
  py::class_<PyGroup>(m, "Group")
      .def_property_readonly("rank", [](PyGroup& g) { return g.native->rank(); })
      .def_property_readonly("size", [](PyGroup& g) { return g.native->size(); })
      .def_property_readonly("world_ranks", [](PyGroup& g) { return g.native->world_ranks(); })
      .def_property_readonly("tag_ub", [](PyGroup& g) { return g.native->tag_ub(); })
      .def_property_readonly("shm_fallback_reason", [](PyGroup& g) { return g.native->shm_fallback_reason(); })
      .def_property_readonly("shm_path", [](PyGroup& g) { return g.native->shm_path(); })
      .def("allreduce",
           [handle](PyGroup& g, py::object keep, uintptr_t ptr, int64_t count, DType dtype, ReduceOp op, int tag, bool block) {
             auto st = without_gil([&] { return g.native->allreduce(span(ptr, count), dtype, op, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("tag"), py::arg("block") = false)
      .def("broadcast",
           [handle](PyGroup& g, py::object keep, uintptr_t ptr, int64_t count, DType dtype, int root, int tag, bool block) {
             auto st = without_gil([&] { return g.native->broadcast(span(ptr, count), dtype, root, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("tag"), py::arg("block") = false)
      .def("reduce",
           [handle](PyGroup& g, py::object keep, uintptr_t ptr, int64_t count, DType dtype, ReduceOp op, int root, int tag, bool block) {
             auto st = without_gil(
                 [&] { return g.native->reduce(span(ptr, count), dtype, op, root, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("tag"), py::arg("block") = false)
      .def("allgather",
           [handle](PyGroup& g, py::object keep, uintptr_t in, int64_t in_count, uintptr_t out, int64_t out_count,
                    DType dtype, int tag, bool block) {
             auto st = without_gil(
                 [&] { return g.native->allgather(span(in, in_count), span(out, out_count), dtype, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("in"), py::arg("in_count"), py::arg("out"), py::arg("out_count"), py::arg("dtype"), py::arg("tag"), py::arg("block") = false)
      .def("reduce_scatter",
           [handle](PyGroup& g, py::object keep, uintptr_t in, int64_t in_count, uintptr_t out, int64_t out_count,
                    DType dtype, ReduceOp op, int tag, bool block) {
             auto st = without_gil([&] {
               return g.native->reduce_scatter(span(in, in_count), span(out, out_count), dtype,
                                               op, tag, block);
             });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("in"), py::arg("in_count"), py::arg("out"), py::arg("out_count"), py::arg("dtype"), py::arg("op"), py::arg("tag"), py::arg("block") = false)
      .def("gather",
           [handle](PyGroup& g, py::object keep, uintptr_t in, int64_t in_count, uintptr_t out, int64_t out_count,
                    DType dtype, int root, int tag, bool block) {
             auto st = without_gil(
                 [&] { return g.native->gather(span(in, in_count), span(out, out_count), dtype, root, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("in"), py::arg("in_count"), py::arg("out"), py::arg("out_count"), py::arg("dtype"), py::arg("root"), py::arg("tag"), py::arg("block") = false)
      .def("scatter",
           [handle](PyGroup& g, py::object keep, uintptr_t in, int64_t in_count, uintptr_t out, int64_t out_count,
                    DType dtype, int root, int tag, bool block) {
             auto st = without_gil(
                 [&] { return g.native->scatter(span(in, in_count), span(out, out_count), dtype, root, tag, block); });
             return handle(g, st, keep);
           },
           py::arg("keep"), py::arg("in"), py::arg("in_count"), py::arg("out"), py::arg("out_count"), py::arg("dtype"), py::arg("root"), py::arg("tag"), py::arg("block") = false)
      .def("alltoall",
           [handle](PyGroup& g, py::object keep, uintptr_t in, int64_t in_count, uintptr_t out, int64_t out_count,
                    DType dtype, const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts, int tag) {
             auto st = without_gil([&] {
               return g.native->alltoall(span(in, in_count), span(out, out_count), dtype, send_counts,
                                         recv_counts, tag);
             });
             return handle(g, st, keep);
           })
      .def("barrier",
           [handle](PyGroup& g, int tag, bool block) {
             auto st = without_gil([&] { return g.native->barrier(tag, block); });
             return handle(g, st, py::none());
           },
           py::arg("tag"), py::arg("block") = false)
      .def("send",
           [handle](PyGroup& g, py::object keep, uintptr_t ptr, int64_t count, DType dtype, int dst, int tag) {
             auto st = without_gil([&] { return g.native->send(span(ptr, count), dtype, dst, tag); });
             return handle(g, st, keep);
           })
      .def("recv", [handle](PyGroup& g, py::object keep, uintptr_t ptr, int64_t count, DType dtype, int src, int tag) {
        auto st = without_gil([&] { return g.native->recv(span(ptr, count), dtype, src, tag); });
        return handle(g, st, keep);
      });

  // No locking needed around `native`: the caller sides guard their own state.
  using release_gil = py::call_guard<py::gil_scoped_release>;

  py::class_<PyPushChannel>(m, "PushChannel")
      .def_property_readonly("count", [](PyPushChannel& c) { return c.native->count(); })
      .def(
          "send",
          [](PyPushChannel& c, const py::object& buf, const std::vector<int>& peers, int64_t round) {
            FloatSpan b = float_buffer(buf, false, "push buffer");
            auto st = without_gil([&] { return c.native->send(b, peers, round); });
            // The channel sends a copy: the caller's buffer need not outlive the call.
            return std::make_unique<Handle>(st, py::none(), c.graveyard);
          },
          py::arg("buf"), py::arg("peers"), py::arg("round") = 0)
      .def(
          "drain",
          [](PyPushChannel& c, const py::object& out, int64_t min_messages, std::optional<double> timeout,
             std::optional<int64_t> round) {
            FloatSpan o = float_buffer(out, true, "drain target");
            return without_gil([&] { return c.native->drain(o, min_messages, timeout, round); });
          },
          py::arg("out"), py::arg("min_messages") = 0, py::arg("timeout") = py::none(), py::arg("round") = py::none())
      .def(
          "pending", [](PyPushChannel& c, std::optional<int64_t> round) { return c.native->pending(round); },
          py::arg("round") = py::none())
      .def(
          "flush", [](PyPushChannel& c, bool close) { c.native->flush(close); }, py::arg("close") = false,
          release_gil());

  py::class_<PyWaitAvoiding>(m, "WaitAvoiding")
      .def(
          "iround",
          [](PyWaitAvoiding& w, const py::object& buf, const py::object& out, bool may_activate) {
            FloatSpan b = float_buffer(buf, false, "published buffer");
            FloatSpan o = float_buffer(out, true, "result buffer");
            auto round = without_gil([&] { return w.native->iround(b, o, may_activate); });
            return std::make_unique<RoundHandle>(std::move(round), py::make_tuple(buf, out), w.graveyard);
          },
          py::arg("buf"), py::arg("out"), py::arg("may_activate") = true)
      .def("close", [](PyWaitAvoiding& w) { w.native->close(); }, release_gil())
      .def_property_readonly("shm_phases", [](PyWaitAvoiding& w) { return w.native->shm_phases(); });

  py::class_<PyPairwiseAverager>(m, "PairwiseAverager")
      .def(
          "publish",
          [](PyPairwiseAverager& a, const py::object& buf) {
            FloatSpan b = float_buffer(buf, false, "published model");
            without_gil([&] { a.native->publish(b); });
          },
          py::arg("buf"))
      .def(
          "request",
          [](PyPairwiseAverager& a, const py::object& buf, const py::object& out, int peer) {
            FloatSpan b = float_buffer(buf, false, "request model");
            FloatSpan o = float_buffer(out, true, "reply buffer");
            auto st = without_gil([&] { return a.native->request(b, o, peer); });
            return std::make_unique<Handle>(st, py::make_tuple(buf, out), a.graveyard);
          },
          py::arg("buf"), py::arg("out"), py::arg("peer"))
      .def(
          "drain",
          [](PyPairwiseAverager& a, const py::object& out) {
            FloatSpan o = float_buffer(out, true, "drain target");
            return without_gil([&] { return a.native->drain(o); });
          },
          py::arg("out"))
      .def("close", [](PyPairwiseAverager& a) { a.native->close(); }, release_gil());

  py::class_<PyComm>(m, "Comm")
      // No defaults here: harness.comm.Communicator holds them, in one place.
      .def(py::init([](uintptr_t handle, double spin_us, double max_sleep_us, int64_t ring_threshold_bytes,
                       int64_t tree_chunk_bytes) {
             EngineOptions opt;
             opt.spin_s = spin_us * 1e-6;
             opt.max_sleep_s = max_sleep_us * 1e-6;
             auto native = without_gil([&] {
               return std::make_unique<Communicator>(comm_of_handle(handle), opt, ring_threshold_bytes,
                                                     tree_chunk_bytes);
             });
             return PyComm{std::make_shared<Graveyard>(), std::move(native)};
           }),
           py::arg("handle"), py::arg("spin_us"), py::arg("max_sleep_us"), py::arg("ring_threshold_bytes"),
           py::arg("tree_chunk_bytes"))
      .def_property_readonly("rank", [](PyComm& c) { return c.native->rank(); })
      .def_property_readonly("size", [](PyComm& c) { return c.native->size(); })
      .def_property_readonly("closed", [](PyComm& c) { return c.native->closed(); })
      .def(
          "iallreduce",
          [](PyComm& c, const py::object& buf, const std::string& op) {
            FloatSpan b = float_buffer(buf, true, "allreduce buffer");
            auto st = without_gil([&] { return c.native->iallreduce(b, op); });
            return std::make_unique<Handle>(st, buf, c.graveyard);
          },
          py::arg("buf"), py::arg("op") = "sum")
      .def(
          "ibroadcast",
          [](PyComm& c, const py::object& buf, int root) {
            FloatSpan b = float_buffer(buf, true, "broadcast buffer");
            auto st = without_gil([&] { return c.native->ibroadcast(b, root); });
            return std::make_unique<Handle>(st, buf, c.graveyard);
          },
          py::arg("buf"), py::arg("root") = 0)
      .def(
          "allreduce",
          [](PyComm& c, const py::object& buf, const std::string& op) {
            FloatSpan b = float_buffer(buf, true, "allreduce buffer");
            without_gil([&] {
              c.native->allreduce(b, op);
              return 0;
            });
          },
          py::arg("buf"), py::arg("op") = "sum")
      .def(
          "broadcast",
          [](PyComm& c, const py::object& buf, int root) {
            FloatSpan b = float_buffer(buf, true, "broadcast buffer");
            without_gil([&] {
              c.native->broadcast(b, root);
              return 0;
            });
          },
          py::arg("buf"), py::arg("root") = 0)
      .def("barrier", [](PyComm& c) { c.native->barrier(); }, release_gil())
      .def_property_readonly("shm_fallback_reason", [](PyComm& c) { return c.native->shm_fallback_reason(); })
      .def_property_readonly("shm_path", [](PyComm& c) { return c.native->shm_path(); })
      .def("ibarrier",
           [](PyComm& c) {
             auto st = without_gil([&] { return c.native->ibarrier(); });
             return std::make_unique<Handle>(st, py::none(), c.graveyard);
           })
      .def(
          "iexchange",
          [](PyComm& c, const py::object& send, const py::object& recv, int peer) {
            FloatSpan s = float_buffer(send, false, "exchange send buffer");
            FloatSpan r = float_buffer(recv, true, "exchange receive buffer");
            auto st = without_gil([&] { return c.native->iexchange(s, r, peer); });
            return std::make_unique<Handle>(st, py::make_tuple(send, recv), c.graveyard);
          },
          py::arg("send"), py::arg("recv"), py::arg("peer"))
      .def(
          "push_channel",
          [](PyComm& c, int64_t count) {
            auto native = without_gil([&] { return c.native->push_channel(count); });
            return PyPushChannel{c.graveyard, std::move(native)};
          },
          py::arg("count"))
      .def(
          "wait_avoiding",
          [](PyComm& c, const py::object& initial, int sync_every, bool accumulate,
             std::vector<std::vector<int>> phases, int quorum) {
            FloatSpan b = float_buffer(initial, false, "initial buffer");
            auto native = without_gil(
                [&] { return c.native->wait_avoiding(b, sync_every, accumulate, std::move(phases), quorum); });
            return PyWaitAvoiding{c.graveyard, std::move(native)};
          },
          py::arg("initial"), py::arg("sync_every"), py::arg("accumulate"), py::arg("phases"), py::arg("quorum") = 1)
      .def(
          "pairwise_averager",
          [](PyComm& c, const py::object& initial) {
            FloatSpan b = float_buffer(initial, false, "initial model");
            auto native = without_gil([&] { return c.native->pairwise_averager(b); });
            return PyPairwiseAverager{c.graveyard, std::move(native)};
          },
          py::arg("initial"))
      .def(
          "group",
          [](PyComm& c, std::vector<int> world_ranks) {
            auto native = without_gil([&] { return c.native->group(std::move(world_ranks)); });
            return PyGroup{c.graveyard, std::move(native)};
          },
          py::arg("world_ranks"))
      .def(
          "set_topology",
          [](PyComm& c, const std::vector<int>& node_of, std::tuple<double, double> intra, std::tuple<double, double> nic,
             double fabric_Bps) {
            without_gil([&] {
              c.native->set_topology(node_of, intra, nic, fabric_Bps);
              return 0;
            });
          },
          py::arg("node_of"), py::arg("intra"), py::arg("nic"), py::arg("fabric_Bps"))
      .def(
          "set_allreduce", [](PyComm& c, const std::string& algorithm) { c.native->set_allreduce(algorithm); },
          py::arg("algorithm"))
      .def(
          "set_links",
          [](PyComm& c, const std::vector<std::tuple<int, double, double>>& links,
             std::vector<std::pair<int, int>> emulated_pairs) { c.native->set_links(links, std::move(emulated_pairs)); },
          py::arg("links"), py::arg("emulated_pairs"))
      .def("drain_records",
           [](PyComm& c) {
             std::vector<std::tuple<std::string, double, double, double, int64_t, int64_t>> out;
             for (auto& r : c.native->drain_records()) out.emplace_back(r.op, r.post, r.start, r.end, r.bytes, r.round);
             return out;
           })
      .def("shutdown", [](PyComm& c) { c.native->shutdown(); }, release_gil());
}
