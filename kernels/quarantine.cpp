#include "quarantine.hpp"

#include <algorithm>

namespace harness {

void Quarantine::admit(MPI_Request req, bool cancel, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender) {
  if (req == MPI_REQUEST_NULL) return;
  if (cancel) MPI_Cancel(&req);
  if (lender) {
    std::lock_guard<std::mutex> lock(lender->mu);
    ++lender->quarantined;
  }
  held_.push_back({req, std::move(keep), std::move(lender)});
}

void Quarantine::release(Held& h) {
  h.keep.reset();
  if (h.lender) {
    std::lock_guard<std::mutex> lock(h.lender->mu);
    --h.lender->quarantined;
  }
  h.lender.reset();
}

bool Quarantine::sweep() {
  bool any = false;
  for (Held& h : held_) {
    int flag = 0;
    // A request that fails (its peer is gone) is complete as well: MPI is done with its memory.
    const int rc = MPI_Test(&h.req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      release(h);
      h.req = MPI_REQUEST_NULL;
      any = true;
    }
  }
  held_.erase(std::remove_if(held_.begin(), held_.end(), [](const Held& h) { return h.req == MPI_REQUEST_NULL; }),
              held_.end());
  return any;
}

void Quarantine::abandon() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) sweep();
  if (held_.empty()) return;
  // MPI may still use this memory: it is never returned to the allocator. Kept reachable (not
  // merely leaked) so that a leak checker does not report it; shared by every engine.
  static std::mutex mu;
  static auto* kept_for_good = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mu);
  for (Held& h : held_) kept_for_good->push_back(std::move(h.keep));
  held_.clear();
}

}  // namespace harness
