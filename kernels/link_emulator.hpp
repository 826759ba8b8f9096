// Emulated slow links: per (src -> dst) latency and bandwidth, applied by the sender.
//
// A message of b bytes posted at time t on link L starts when L is free,
// start = max(t, free_at[L]), occupies L for b / bandwidth (links carry their messages one
// after another), and is handed to MPI at start + latency + b / bandwidth: it is delivered no
// earlier than that. Links with zero latency and unlimited bandwidth add nothing.
#pragma once

#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace harness {

struct LinkParams {
  double latency_s = 0.0;
  double bandwidth_Bps = std::numeric_limits<double>::infinity();
  bool is_free() const { return latency_s <= 0.0 && !(bandwidth_Bps < std::numeric_limits<double>::infinity()); }
};

class LinkEmulator {
 public:
  void set_self(int world_rank) { self_ = world_rank; }

  // Replaces the outgoing-link table of this rank (entries whose src is another rank are
  // kept out by the caller). Takes effect for messages posted afterwards.
  void set_links(const std::unordered_map<int, LinkParams>& out_links) {
    std::lock_guard<std::mutex> lock(mu_);
    links_ = out_links;
    free_at_.clear();
  }

  std::unordered_map<int, LinkParams> links() const {
    std::lock_guard<std::mutex> lock(mu_);
    return links_;
  }

  // Time at which a message of `bytes` posted now to world rank `dst` may be handed to MPI;
  // returns `now_s` (no delay) when the link is not emulated. Reserves the link.
  double release_time(int dst, double bytes, double now_s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(dst);
    if (it == links_.end() || it->second.is_free() || dst == self_) return now_s;
    const LinkParams& p = it->second;
    double& free_at = free_at_[dst];
    double start = free_at > now_s ? free_at : now_s;
    double transfer = bytes / p.bandwidth_Bps;  // 0 for infinite bandwidth
    free_at = start + transfer;
    return start + p.latency_s + transfer;
  }

 private:
  int self_ = -1;
  mutable std::mutex mu_;
  std::unordered_map<int, LinkParams> links_;
  std::unordered_map<int, double> free_at_;
};

}  // namespace harness
