// The shared-memory path (kernels/shm_segment.*, kernels/shm_collective.*) on real ranks of one
// host: run under mpiexec with 2 or 3 ranks (.ci/native_checks.sh, plain, under ASan + UBSan and
// under ThreadSanitizer). What is checked: exact sums over several chunks of a slot, bitwise the
// same on every rank; the caller's blocking calls and the progress thread's nonblocking ones on
// one channel at once, from two caller threads, in posting order; a segment that cannot be made
// falls back to the message path with its reason; no file is left in the segment directory.
#include <dirent.h>
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "communicator.hpp"
#include "mpi_main.hpp"

using namespace harness;

namespace {

int rank_, size_;
const EngineOptions kOptions{2e-5, 1e-3, 1e-3};  // spin, longest sleep, longest passive sleep

std::unique_ptr<Communicator> communicator() {
  return std::make_unique<Communicator>(MPI_COMM_WORLD, kOptions, 64 << 10, 1 << 20);
}

// Rank r's element i: a small integer, so that every sum is exact in float32.
std::vector<float> data(int64_t n, int r, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 7 + r * 3 + seed) % 11);
  return v;
}

std::vector<float> sum_of_all(int64_t n, int seed) {
  std::vector<float> total(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < size_; ++r) {
    auto d = data(n, r, seed);
    for (int64_t i = 0; i < n; ++i) total[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
  }
  return total;
}

int files_named(const char* prefix) {
  int n = 0;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir))
      if (std::strncmp(e->d_name, prefix, std::strlen(prefix)) == 0) ++n;
    closedir(dir);
  }
  return n;
}

}  // namespace

TEST(blocking_allreduce_is_exact_over_several_chunks) {
  auto comm = communicator();
  CHECK(comm->shm_fallback_reason().empty());
  // 1, a count that is not a multiple of anything, and three slots' worth and a bit
  for (int64_t n : {int64_t{1}, int64_t{1001}, 3 * (ShmChannel::kSlotBytes / 4) + 5}) {
    auto x = data(n, rank_, 1);
    comm->allreduce({x.data(), n}, "sum");
    CHECK(x == sum_of_all(n, 1));
    // bitwise the same on every rank: compare with rank 0's
    std::vector<float> first(x);
    MPI_Bcast(first.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(std::memcmp(first.data(), x.data(), x.size() * 4) == 0);
  }
  comm->shutdown();
}

TEST(posted_and_blocking_calls_share_a_channel_in_posting_order) {
  auto comm = communicator();
  constexpr int kRounds = 200;
  constexpr int64_t kN = 300;
  // The main thread posts nonblocking allreduces (progress thread) and waits for them only
  // after a blocking one, so both kinds are in flight on the channel at once.
  std::vector<std::vector<float>> posted(kRounds), blocking(kRounds);
  for (int k = 0; k < kRounds; ++k) {
    posted[static_cast<size_t>(k)] = data(kN, rank_, k);
    blocking[static_cast<size_t>(k)] = data(kN, rank_, k + 1000);
    auto st = comm->iallreduce({posted[static_cast<size_t>(k)].data(), kN}, "sum");
    comm->allreduce({blocking[static_cast<size_t>(k)].data(), kN}, "sum");
    st->wait(-1);
    st->throw_if_failed();
  }
  for (int k = 0; k < kRounds; ++k) {
    CHECK(posted[static_cast<size_t>(k)] == sum_of_all(kN, k));
    CHECK(blocking[static_cast<size_t>(k)] == sum_of_all(kN, k + 1000));
  }
  comm->shutdown();
}

TEST(two_caller_threads_on_two_groups_at_once) {
  // Each thread has a group of its own (a channel each), as torch's process groups do; records
  // are drained by a third thread meanwhile.
  auto comm = communicator();
  std::vector<int> all(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) all[static_cast<size_t>(i)] = i;
  auto a = comm->group(all), b = comm->group(all);
  std::atomic<bool> stop{false};
  std::thread drainer([&] {
    while (!stop) comm->drain_records();
  });
  auto work = [&](Group& g, int seed) {
    for (int k = 0; k < 100; ++k) {
      auto x = data(257, rank_, seed + k);
      g.allreduce({x.data(), 257}, DType::kF32, ReduceOp::kSum, -1, /*block=*/k % 2 == 0)->wait(-1);
      CHECK(x == sum_of_all(257, seed + k));
    }
  };
  std::thread ta([&] { work(*a, 0); });
  std::thread tb([&] { work(*b, 5000); });
  ta.join();
  tb.join();
  stop = true;
  drainer.join();
  comm->shutdown();
}

TEST(a_segment_that_cannot_be_made_falls_back_with_its_reason) {
  setenv("HARNESS_SHM_DIR", "/nonexistent-harness-shm-dir", 1);
  auto comm = communicator();
  unsetenv("HARNESS_SHM_DIR");
  CHECK(comm->shm_fallback_reason().find("/nonexistent-harness-shm-dir") != std::string::npos);
  auto x = data(1001, rank_, 3);
  comm->allreduce({x.data(), 1001}, "sum");  // the message path
  CHECK(x == sum_of_all(1001, 3));
  comm->shutdown();
}

TEST(no_segment_file_is_left_behind) {
  // Rank 0 names the files after its pid: this job's, not another job's running meanwhile.
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  auto comm = communicator();
  comm->shutdown();
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_EQ(files_named(("harness-shm-" + std::to_string(pid) + "-").c_str()), 0);
}

int main(int argc, char** argv) { return harness_test::run_mpi_tests(argc, argv, rank_, size_); }
