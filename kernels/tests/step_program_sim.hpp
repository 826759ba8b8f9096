// Runs the step programs of all members of a collective together, in one process, without MPI:
// what the executor (StepExecutor) would do on p ranks, so that step program tests check the data
// that actually arrives, not only the shape of the steps.
//
// Model (stricter than MPI, so a step program that passes cannot deadlock under it): a member posts
// all receives and sends of its current step; the k-th send from a to b matches the k-th receive
// at b from a (MPI's non-overtaking order on one tag); a send completes only once matched (as a
// rendezvous send does); a step ends when all its messages are matched, then its reductions run.
// Data is copied when a send meets its receive; that equals MPI's copy at any time within the
// step as long as no receive of a step writes memory that the step sends or receives elsewhere,
// which check_step verifies. A round in which no member can move while some have steps left is
// a deadlock.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "step_program.hpp"

namespace harness_test {

// dst[i] += src[i] for n elements of the simulated element type.
using AddFn = void (*)(void* dst, const void* src, int64_t n);

struct SimMember {
  harness::StepProgram sched;
  char* buf = nullptr;  // the member's buffer (owned by the caller), n elements of esz bytes
  size_t cur = 0;       // current step
  bool posted = false;
  std::vector<bool> send_done, recv_done;  // of the current step
  std::set<int> heard;                     // members whose data has (transitively) reached this one
  std::set<int> incoming;                  // heard by the current step's receives, applied at its end
  // What the member's receives wrote into its own buffer (element index -> times), and what its
  // reductions added into it, over the whole run: coverage properties.
  std::vector<int> recv_into_buf, reduced_into_buf;
};

struct SimResult {
  bool ok = true;
  std::string error;  // the first violation: a deadlock, a mismatch, a bad peer, aliasing
  int rounds = 0;
};

class Simulation {
 public:
  // members[m].sched and .buf set by the caller; n elements of esz bytes per buffer.
  Simulation(std::vector<SimMember>& members, int64_t n, int esz, AddFn add)
      : m_(members), n_(n), esz_(esz), add_(add) {}

  SimResult run() {
    const int p = static_cast<int>(m_.size());
    for (int i = 0; i < p; ++i) {
      m_[i].heard = {i};
      m_[i].recv_into_buf.assign(static_cast<size_t>(n_), 0);
      m_[i].reduced_into_buf.assign(static_cast<size_t>(n_), 0);
      for (size_t s = 0; s < m_[i].sched.steps.size(); ++s)
        if (!check_step(i, s)) return res_;
    }
    for (;;) {
      bool moved = false, left = false;
      for (int i = 0; i < p; ++i) {
        SimMember& me = m_[i];
        if (me.cur >= me.sched.steps.size()) continue;
        left = true;
        if (!me.posted) {
          post(i);
          moved = true;
          if (!res_.ok) return res_;
        }
        if (step_done(me)) {
          finish_step(i);
          moved = true;
        }
      }
      ++res_.rounds;
      if (!left) break;
      if (!moved) return failed("deadlock: " + stuck());
    }
    for (const auto& q : sends_)
      if (!q.second.empty()) return failed("a send from member " + std::to_string(q.first.first) + " to " +
                                           std::to_string(q.first.second) + " was never received");
    for (const auto& q : recvs_)
      if (!q.second.empty()) return failed("a receive at member " + std::to_string(q.first.second) + " from " +
                                           std::to_string(q.first.first) + " never got a message");
    return res_;
  }

 private:
  struct Pending {
    int member;
    size_t xfer;  // index in the step's sends or recvs
  };
  using Channel = std::pair<int, int>;  // (sender, receiver)

  SimResult failed(const std::string& why) {
    if (res_.ok) res_ = {false, why, res_.rounds};
    return res_;
  }

  // Where a transfer of member i points: its buffer (returns the element offset) or elsewhere
  // (scratch: -1). A transfer that starts in the buffer must end inside it.
  int64_t buf_offset(int i, const void* ptr, int64_t count, bool* ok) const {
    const char* c = static_cast<const char*>(ptr);
    const char* b = m_[i].buf;
    *ok = true;
    if (b == nullptr || c < b || c >= b + n_ * esz_) return -1;
    const int64_t off = (c - b);
    *ok = off % esz_ == 0 && off / esz_ + count <= n_;
    return off / esz_;
  }

  // Static properties of step s of member i: peers in range and not itself, counts >= 0, buffer
  // transfers inside the buffer, and no receive that overlaps another receive or a send of the
  // same step (MPI may read a send buffer, and write a receive buffer, at any time in the step).
  bool check_step(int i, size_t s) {
    const int p = static_cast<int>(m_.size());
    const harness::Step& st = m_[i].sched.steps[s];
    const std::string where = "member " + std::to_string(i) + " step " + std::to_string(s) + ": ";
    if (st.sends.empty() && st.recvs.empty()) return failed(where + "a step without messages").ok;
    auto check_xfer = [&](const harness::Xfer& x, const char* kind) {
      if (x.peer < 0 || x.peer >= p || x.peer == i)
        return failed(where + kind + " peer " + std::to_string(x.peer) + " of " + std::to_string(p)).ok;
      if (x.count < 0) return failed(where + kind + " of a negative count").ok;
      bool ok = true;
      buf_offset(i, x.buf, x.count, &ok);
      if (!ok) return failed(where + kind + " runs past the end of the buffer").ok;
      return true;
    };
    for (const auto& x : st.sends)
      if (!check_xfer(x, "send")) return false;
    for (const auto& x : st.recvs)
      if (!check_xfer(x, "receive")) return false;
    auto overlap = [&](const harness::Xfer& a, const harness::Xfer& b) {
      const char* a0 = static_cast<const char*>(a.buf);
      const char* b0 = static_cast<const char*>(b.buf);
      return a.count > 0 && b.count > 0 && a0 < b0 + b.count * esz_ && b0 < a0 + a.count * esz_;
    };
    for (size_t r = 0; r < st.recvs.size(); ++r) {
      for (size_t q = r + 1; q < st.recvs.size(); ++q)
        if (overlap(st.recvs[r], st.recvs[q])) return failed(where + "two receives into the same memory").ok;
      for (const auto& x : st.sends)
        if (overlap(st.recvs[r], x)) return failed(where + "a receive into memory the step sends").ok;
    }
    return true;
  }

  void post(int i) {
    SimMember& me = m_[i];
    const harness::Step& st = me.sched.steps[me.cur];
    me.posted = true;
    me.send_done.assign(st.sends.size(), false);
    me.recv_done.assign(st.recvs.size(), false);
    me.incoming.clear();
    for (size_t k = 0; k < st.sends.size(); ++k) {
      sends_[{i, st.sends[k].peer}].push_back({i, k});
      match({i, st.sends[k].peer});
    }
    for (size_t k = 0; k < st.recvs.size(); ++k) {
      recvs_[{st.recvs[k].peer, i}].push_back({i, k});
      match({st.recvs[k].peer, i});
    }
  }

  void match(Channel c) {
    auto& sq = sends_[c];
    auto& rq = recvs_[c];
    while (!sq.empty() && !rq.empty() && res_.ok) {
      const Pending s = sq.front(), r = rq.front();
      sq.pop_front();
      rq.pop_front();
      SimMember& from = m_[s.member];
      SimMember& to = m_[r.member];
      const harness::Xfer& sx = from.sched.steps[from.cur].sends[s.xfer];
      const harness::Xfer& rx = to.sched.steps[to.cur].recvs[r.xfer];
      if (sx.count != rx.count) {
        failed("member " + std::to_string(s.member) + " step " + std::to_string(from.cur) + " sends " +
               std::to_string(sx.count) + " elements to member " + std::to_string(r.member) + ", whose step " +
               std::to_string(to.cur) + " receives " + std::to_string(rx.count));
        return;
      }
      if (sx.count > 0) std::memmove(rx.buf, sx.buf, static_cast<size_t>(sx.count * esz_));
      bool ok = true;
      const int64_t off = buf_offset(r.member, rx.buf, rx.count, &ok);
      if (off >= 0)
        for (int64_t e = 0; e < rx.count; ++e) ++to.recv_into_buf[static_cast<size_t>(off + e)];
      to.incoming.insert(from.heard.begin(), from.heard.end());
      from.send_done[s.xfer] = true;
      to.recv_done[r.xfer] = true;
    }
  }

  static bool step_done(const SimMember& me) {
    if (!me.posted) return false;
    for (bool d : me.send_done)
      if (!d) return false;
    for (bool d : me.recv_done)
      if (!d) return false;
    return true;
  }

  void finish_step(int i) {
    SimMember& me = m_[i];
    for (const harness::Reduce& r : me.sched.steps[me.cur].reduces) {
      add_(r.dst, r.src, r.count);
      bool ok = true;
      const int64_t off = buf_offset(i, r.dst, r.count, &ok);
      if (off >= 0)
        for (int64_t e = 0; e < r.count; ++e) ++me.reduced_into_buf[static_cast<size_t>(off + e)];
    }
    me.heard.insert(me.incoming.begin(), me.incoming.end());
    ++me.cur;
    me.posted = false;
  }

  std::string stuck() const {
    std::string s;
    for (size_t i = 0; i < m_.size(); ++i)
      if (m_[i].cur < m_[i].sched.steps.size())
        s += "member " + std::to_string(i) + " at step " + std::to_string(m_[i].cur) + "; ";
    return s;
  }

  std::vector<SimMember>& m_;
  int64_t n_;
  int esz_;
  AddFn add_;
  std::map<Channel, std::deque<Pending>> sends_, recvs_;
  SimResult res_;
};

}  // namespace harness_test
