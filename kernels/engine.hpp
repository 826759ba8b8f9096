// The progress engine: one thread that owns all MPI traffic of the native layer.
//
// Callers (Python, GIL released) submit Op objects through a queue and get an OpState to wait
// on. The progress thread advances every active op with non-blocking MPI calls. When nothing is
// active it sleeps on a condition variable; while ops wait for remote data it polls with a short
// spin window and then exponentially growing sleeps, because ranks usually outnumber cores and a
// spinning progress thread would steal the compute threads' CPU.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "link_emulator.hpp"
#include "mpi_comm.hpp"
#include "quarantine.hpp"

namespace harness {

class Engine;

// One send, possibly held back by link emulation before it is handed to MPI.
struct SendReq {
  MPI_Request req = MPI_REQUEST_NULL;
  bool posted = false;
  bool complete = false;
  bool cancelled = false;  // owner gone: drop it if still deferred
  // Why MPI refused it when the link emulator released it (the peer died meanwhile): the
  // owner's next test_send throws it, so it becomes the owning op's error.
  std::optional<CommError> error;
};

// Record of one finished operation, for traces and the simulator.
struct OpRecord {
  std::string op;
  double post, start, end;
  int64_t bytes;  // bytes this rank sent
  int64_t round;  // round / sequence where meaningful, else -1
};

// Something the progress thread advances. Runs only on the progress thread.
class Op {
 public:
  Op(std::string name, std::shared_ptr<OpState> state) : name_(std::move(name)), state_(std::move(state)) {}
  virtual ~Op() = default;
  // Advance as far as possible without blocking; true if anything happened.
  virtual bool progress(Engine& engine) = 0;
  virtual bool finished() const = 0;
  // Passive ops (listeners) wait for messages that may never come; they don't keep the
  // engine polling fast.
  virtual bool passive() const { return false; }
  // Give up: hand every request MPI may still use to the engine's quarantine (Engine::abandon_*)
  // and fail the callers' states the op owns. The engine then finishes state() with `error`.
  virtual void abort(Engine& engine, const CommError& error) { (void)engine; (void)error; }
  // Whether the engine should record this op in the trace when it finishes.
  virtual bool traced() const { return true; }

  const std::string& name() const { return name_; }
  const std::shared_ptr<OpState>& state() const { return state_; }
  int64_t bytes_sent = 0;
  int64_t round = -1;

 protected:
  std::string name_;
  std::shared_ptr<OpState> state_;
};

// The defaults are chosen by harness.comm.Communicator, which always passes these.
struct EngineOptions {
  double spin_s = 0;       // keep polling this long after the last progress before sleeping
  double max_sleep_s = 0;  // longest sleep while an active op waits
  double passive_sleep_s = 1e-3;  // longest sleep while only listeners wait
};

class Engine {
 public:
  // Duplicates `parent` for its own traffic. Collective over `parent`.
  Engine(MPI_Comm parent, EngineOptions options);
  // Stops the progress thread; MPI must not be finalized yet (harness.comm closes every
  // communicator at exit, before mpi4py finalizes).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_->get(); }
  const SharedComm& shared_comm() const { return comm_; }
  int tag_ub() const { return tag_ub_; }
  bool running() const { return !stopped_.load(); }

  // Caller side --------------------------------------------------------------------------
  std::shared_ptr<OpState> submit(std::unique_ptr<Op> op);
  void wake();  // interrupt a sleeping progress thread (new work for a persistent op)
  // Stops the thread; ops still running fail with `reason`. Idempotent.
  void shutdown(const std::string& reason = "communicator was shut down");
  LinkEmulator& links() { return links_; }
  std::vector<OpRecord> drain_records();
  void add_record(OpRecord rec);
  // Duplicates the engine's communicator (collective); used by persistent ops that need a
  // private tag space.
  SharedComm dup_comm();

  // Progress-thread side -----------------------------------------------------------------
  // Posts a send of `count` floats to `peer` of `comm`, whose world rank is `world_peer`
  // (for link emulation). `synchronous` uses MPI_Issend (completes when matched).
  std::shared_ptr<SendReq> isend(MPI_Comm comm, int peer, int world_peer, const void* buf, int count,
                                 MPI_Datatype type, int tag, bool synchronous, int64_t* bytes_counter);
  // True once the send completed; throws the error MPI failed it with.
  bool test_send(SendReq& s);

  // The one policy for an aborting op's requests (see quarantine.hpp). `keep` owns the memory
  // the request uses (null: the caller's only), `lender` is the op whose caller lent memory to
  // it (null: none).
  // A send: dropped while link emulation still holds it, else quarantined until it completes.
  void abandon_send(SendReq& s, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender = nullptr);
  // A receive: cancelled and quarantined until the cancel (or a match) completes.
  void abandon_recv(MPI_Request& req, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender = nullptr);
  // A nonblocking collective (MPI_Ibarrier): neither cancelled nor freed (erroneous for those),
  // quarantined until it completes.
  void abandon_collective(MPI_Request& req);

 private:
  struct Deferred {
    double release;
    uint64_t seq;  // FIFO among equal release times keeps MPI's non-overtaking order
    MPI_Comm comm;
    int peer;
    const void* buf;
    int count;
    MPI_Datatype type;
    int tag;
    bool synchronous;
    std::shared_ptr<SendReq> send;
    bool operator>(const Deferred& o) const { return release != o.release ? release > o.release : seq > o.seq; }
  };

  void run();
  void serve(std::string& reason);  // the loop of run(), until a shutdown
  void fail_all(const CommError& error);
  bool release_due_sends(double t);
  // Hands the send to MPI; a refusal is kept in the send (SendReq::error), never thrown: a
  // deferred send is posted outside any op.
  void post_send(const Deferred& d);
  void finish_op(Op& op, std::optional<CommError> error);

  SharedComm comm_;
  int rank_ = 0, size_ = 1, tag_ub_ = 32767;
  EngineOptions opt_;
  LinkEmulator links_;

  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<std::unique_ptr<Op>> incoming_;
  bool stop_requested_ = false;
  bool woken_ = false;
  std::string stop_reason_;
  std::atomic<bool> stopped_{false};
  std::mutex join_mu_;  // several callers may shut down at once; one joins

  std::vector<std::unique_ptr<Op>> active_;  // progress thread only
  std::priority_queue<Deferred, std::vector<Deferred>, std::greater<Deferred>> deferred_;
  uint64_t deferred_seq_ = 0;
  Quarantine quarantine_;  // progress thread only

  std::mutex rec_mu_;
  std::vector<OpRecord> records_;
  std::thread thread_;
};

}  // namespace harness
