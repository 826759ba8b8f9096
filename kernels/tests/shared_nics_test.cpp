// Tests of the job-wide NIC table (kernels/shared_nics.hpp) on real ranks: run under mpiexec
// with 2 or 3 ranks (.ci/native_checks.sh). What is checked: every rank maps the same table
// (a write on one is seen by all), its slots are distinct and start at zero, the process-shared
// mutex keeps the ranks' updates apart, the emulators of ranks on one node queue on its NIC
// across processes, no name is left in /dev/shm, and a process that dies holding the lock does
// not deadlock the others (the robust mutex). Every test runs on every rank; a failure on any
// rank fails the run.
#include <dirent.h>
#include <mpi.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "check.hpp"
#include "mpi_main.hpp"
#include "link_emulator.hpp"
#include "shared_nics.hpp"

using harness::CommError;
using harness::SharedNics;

namespace {

int rank_, size_;

std::vector<double> gather_all(double x) {
  std::vector<double> all(static_cast<size_t>(size_));
  MPI_Allgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

}  // namespace

TEST(every_rank_maps_one_zeroed_table) {
  auto nics = SharedNics::create(MPI_COMM_WORLD, 3);
  CHECK_EQ(nics->nodes(), 3);
  {
    SharedNics::Lock lock(*nics);
    CHECK_EQ(nics->fabric(), 0.0);
    for (int n = 0; n < 3; ++n) CHECK(nics->egress(n) == 0.0 && nics->ingress(n) == 0.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) {
    SharedNics::Lock lock(*nics);
    nics->fabric() = 1;
    for (int n = 0; n < 3; ++n) {
      nics->egress(n) = 10 + n;
      nics->ingress(n) = 20 + n;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  SharedNics::Lock lock(*nics);
  CHECK_EQ(nics->fabric(), 1.0);
  for (int n = 0; n < 3; ++n) {
    CHECK_EQ(nics->egress(n), 10.0 + n);
    CHECK_EQ(nics->ingress(n), 20.0 + n);
  }
}

TEST(no_name_is_left_in_dev_shm) {
  int pid0 = static_cast<int>(getpid());
  MPI_Bcast(&pid0, 1, MPI_INT, 0, MPI_COMM_WORLD);
  auto nics = SharedNics::create(MPI_COMM_WORLD, 2);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string prefix = "harness-nics-" + std::to_string(pid0) + "-";
  DIR* d = opendir("/dev/shm");
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) CHECK_MSG(std::string(e->d_name).rfind(prefix, 0) != 0, e->d_name);
  closedir(d);
}

TEST(the_lock_keeps_ranks_updates_apart) {
  auto nics = SharedNics::create(MPI_COMM_WORLD, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  const int rounds = 20000;
  for (int i = 0; i < rounds; ++i) {
    SharedNics::Lock lock(*nics);
    // A read-modify-write spread over two slots: without mutual exclusion increments get lost.
    const double e = nics->egress(0);
    nics->ingress(0) += 1;
    nics->egress(0) = e + 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  SharedNics::Lock lock(*nics);
  CHECK_EQ(nics->egress(0), static_cast<double>(rounds) * size_);
  CHECK_EQ(nics->ingress(0), static_cast<double>(rounds) * size_);
}

TEST(ranks_of_one_node_queue_on_its_nic_across_processes) {
  // Every rank on node 0 sends 1000 bytes to the last rank, alone on node 1, at the same time.
  std::vector<int> node_of(static_cast<size_t>(size_), 0);
  node_of.back() = 1;
  std::shared_ptr<SharedNics> nics(SharedNics::create(MPI_COMM_WORLD, 2));
  harness::LinkEmulator e;
  e.set_self(rank_);
  harness::Topology t;
  t.node_of = node_of;
  t.nic = harness::LinkParams{0.002, 1e6};
  e.set_topology(t, nics);
  MPI_Barrier(MPI_COMM_WORLD);
  const double r = rank_ == size_ - 1 ? -1 : e.release_time(size_ - 1, 1000, 10.0);
  std::vector<double> all = gather_all(r);
  all.pop_back();
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i)  // one after another on node 0's NIC out: 1 ms apart
    CHECK_MSG(std::fabs(all[i] - (10.0 + 0.001 * static_cast<double>(i + 1) + 0.002)) < 1e-12,
              "release " + std::to_string(all[i]));
}

TEST(a_rank_dying_with_the_lock_does_not_deadlock_the_others) {
  auto nics = SharedNics::create(MPI_COMM_WORLD, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) {
    pid_t child = fork();
    if (child == 0) {  // takes the lock, sets a time and dies holding it (no MPI here)
      new SharedNics::Lock(*nics);
      nics->fabric() = 42;
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  alarm(20);  // a deadlock ends the run with SIGALRM instead of hanging CI
  for (int i = 0; i < 3; ++i) {
    SharedNics::Lock lock(*nics);
    CHECK_EQ(nics->fabric(), 42.0);  // what the dead owner wrote stays valid
  }
  alarm(0);
}

TEST(bad_node_counts_raise_comm_error_on_every_rank) {
  CHECK_THROWS(CommError, SharedNics::create(MPI_COMM_WORLD, 0));
  auto ok = SharedNics::create(MPI_COMM_WORLD, 1);  // still collective afterwards
  CHECK_EQ(ok->nodes(), 1);
}

int main(int argc, char** argv) { return harness_test::run_mpi_tests(argc, argv, rank_, size_); }
