// The progress thread under concurrency, for ThreadSanitizer (.ci/native_checks.sh builds this
// with -fsanitize=thread and runs it under mpiexec with 2 ranks; it passes uninstrumented too).
// Python cannot be run under TSan usefully (the interpreter and MPICH are not instrumented), so
// this drives the engine as the bindings do, from several caller threads at once: one-shot
// collectives submitted while the progress thread runs others, link emulation and the shared NIC
// table changed under it, records drained meanwhile, a shutdown with operations in flight, and
// the persistent operations (wait-avoiding allreduce, push channel, pairwise averaging) whose
// state the caller and the progress thread share. Results are checked too, so a race that
// corrupts data fails even without the sanitizer.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "mpi_main.hpp"
#include "communicator.hpp"
#include "step_program.hpp"

using namespace harness;

namespace {

int rank_, size_;
const EngineOptions kOptions{2e-5, 1e-3, 1e-3};  // spin, longest sleep, longest passive sleep

std::vector<int> everyone() {
  std::vector<int> v(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// One allreduce on `engine`'s communicator with its own tag, as Communicator::iallreduce posts it.
std::shared_ptr<OpState> post_allreduce(Engine& engine, float* buf, int64_t n, int tag, int64_t threshold) {
  StepProgram s = allreduce_program(size_, rank_, buf, n, threshold, engine.links().allreduce_plan(everyone()));
  auto st = std::make_shared<OpState>();
  engine.submit(std::make_unique<StepProgramOp>("allreduce", st,
                                             StepExecutor(engine.shared_comm(), everyone(), everyone(), tag, std::move(s))));
  return st;
}

void sleep_us(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

}  // namespace

TEST(callers_on_several_threads_while_links_change) {
  Engine engine(MPI_COMM_WORLD, kOptions);
  // Every rank a node of its own, NICs shared through the table: the progress thread takes the
  // table's lock for every message while the caller threads post more.
  Topology topo;
  topo.node_of = everyone();
  topo.nic = LinkParams{2e-5, 5e8};
  engine.links().set_topology(topo, std::shared_ptr<SharedNics>(SharedNics::create(MPI_COMM_WORLD, size_)));
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  const int threads = 3, ops = 60;
  for (int t = 0; t < threads; ++t)
    callers.emplace_back([&, t] {
      const int64_t n = t == 0 ? 1 : (t == 1 ? 300 : 5000);
      std::vector<float> buf(static_cast<size_t>(n));
      for (int k = 0; k < ops; ++k) {
        for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<float>(rank_ + k + i % 3);
        auto st = post_allreduce(engine, buf.data(), n, 100 + t, t == 2 ? 0 : 1 << 20);
        st->wait(-1);
        if (st->error || buf[0] != static_cast<float>(size_ * (size_ - 1) / 2 + size_ * k)) ++wrong;
      }
    });
  std::thread fiddler([&] {  // changes the emulated links and drains records meanwhile
    int i = 0;
    while (!done.load()) {
      std::unordered_map<int, LinkParams> links;
      if (i++ % 2) links[(rank_ + 1) % size_] = LinkParams{1e-5, 1e9};
      engine.links().set_links(links);
      engine.drain_records();
      sleep_us(200);
    }
  });
  for (auto& c : callers) c.join();
  done = true;
  fiddler.join();
  CHECK_EQ(wrong.load(), 0);
  engine.shutdown();
}

TEST(shutdown_fails_operations_in_flight) {
  Engine engine(MPI_COMM_WORLD, kOptions);
  // A receive nobody sends: the op stays in flight until the shutdown.
  float x = 0;
  StepProgram s;
  s.steps.push_back({{}, {{(rank_ + 1) % size_, &x, 1, 999}}, {}});
  auto st = std::make_shared<OpState>();
  engine.submit(
      std::make_unique<StepProgramOp>("never", st, StepExecutor(engine.shared_comm(), everyone(), everyone(), 999, std::move(s))));
  std::string seen;
  std::thread waiter([&] {
    st->wait(-1);
    std::lock_guard<std::mutex> lock(st->mu);
    seen = st->error ? st->error->what() : "";
  });
  CHECK(!st->wait(0.02));
  engine.shutdown("stopped by the test");
  waiter.join();
  CHECK_MSG(seen.find("stopped by the test") != std::string::npos, seen);
  CHECK(!engine.running());
  float y = 0;
  CHECK_THROWS(CommError, post_allreduce(engine, &y, 1, 5, 0));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(persistent_operations_shared_with_the_progress_thread) {
  Communicator comm(MPI_COMM_WORLD, kOptions, 64 * 1024, 64 * 1024);
  const int64_t n = 257;
  // Wait-avoiding allreduce: rank 0 lags, so the others' arrivals activate rounds its progress
  // thread joins while its caller is away.
  std::vector<float> init(static_cast<size_t>(n), 0.0f), buf(init), out(init);
  auto wa = comm.wait_avoiding({init.data(), n}, 4, false, {everyone()});
  const int rounds = 16;
  for (int k = 0; k < rounds; ++k) {
    if (rank_ == 0) sleep_us(300);
    std::fill(buf.begin(), buf.end(), static_cast<float>(rank_ + 1));
    auto r = wa->iround({buf.data(), n}, {out.data(), n}, true);
    r.state->wait(-1);
    CHECK_MSG(!r.state->error, r.state->error->what());
    CHECK_EQ(r.info->round, int64_t{k});
    // Contributions are 0 (nothing published yet) or rank + 1: the sum lies between.
    CHECK(out[0] >= 0.0f && out[0] <= static_cast<float>(size_ * (size_ + 1) / 2));
    if (wa_is_sync_round(k, 4)) CHECK_EQ(out[n - 1], static_cast<float>(size_ * (size_ + 1) / 2));
  }
  wa->close();

  // Push channel: every rank pushes to every other, drains while pushes still arrive, flushes.
  auto ch = comm.push_channel(n);
  std::vector<int> others;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) others.push_back(r);
  std::vector<float> acc(static_cast<size_t>(n), 0.0f);
  int64_t got = 0;
  const int pushes = 20;
  for (int k = 0; k < pushes; ++k) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    auto st = ch->send({buf.data(), n}, others, k);
    std::fill(buf.begin(), buf.end(), -5.0f);  // copied before send returned: must not arrive
    st->wait(-1);
    CHECK(!st->error);
    got += ch->drain({acc.data(), n}, 0, 0.0, std::nullopt);
  }
  ch->flush(false);
  got += ch->drain({acc.data(), n}, 0, 0.0, std::nullopt);
  CHECK_EQ(got, int64_t{pushes} * (size_ - 1));
  CHECK_EQ(acc[n / 2], static_cast<float>(pushes * (size_ - 1)));
  ch->flush(true);

  // Pairwise averaging: rank 0 asks rank 1 while rank 1's caller keeps publishing.
  std::vector<float> model(static_cast<size_t>(n), static_cast<float>(rank_));
  auto pa = comm.pairwise_averager({model.data(), n});
  if (size_ >= 2) {
    if (rank_ == 0) {
      std::vector<float> reply(static_cast<size_t>(n));
      for (int k = 0; k < 20; ++k) {
        auto st = pa->request({model.data(), n}, {reply.data(), n}, 1);
        st->wait(-1);
        CHECK_MSG(!st->error, st->error->what());
        CHECK(std::isfinite(reply[0]));
      }
    } else if (rank_ == 1) {
      for (int k = 0; k < 40; ++k) {
        std::fill(model.begin(), model.end(), static_cast<float>(k));
        pa->publish({model.data(), n});
        pa->drain({model.data(), n});
        sleep_us(100);
      }
    }
  }
  pa->close();
  comm.shutdown();
}

int main(int argc, char** argv) { return harness_test::run_mpi_tests(argc, argv, rank_, size_); }
