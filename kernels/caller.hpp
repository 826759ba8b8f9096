// What the caller sides of the native operations share.
//
// A caller side runs on the calling thread, normally with the GIL released (bindings.cpp
// converts Python arguments first, then releases it): it checks the call, hands work to the
// progress thread and waits. It never touches a Python object, so several Python threads may
// call into it at once; its own bookkeeping is guarded accordingly.
#pragma once

#include <cstdint>
#include <string>

#include "engine.hpp"

namespace harness {

// A float32 buffer lent by the caller: for one call, or for one operation while the caller's
// handle keeps the memory alive.
struct FloatSpan {
  float* data;
  int64_t count;
};

// Throws unless 0 <= r < size; `what` names the argument in the message.
inline void check_rank(int r, int size, const char* what) {
  if (r < 0 || r >= size)
    throw CommError(std::string(what) + " " + std::to_string(r) + " out of range [0, " + std::to_string(size) + ")");
}

// Ends a persistent op from its caller: asks the progress thread to close it (through the
// `mu` / `close_requested` pair of the op's shared state), waits until it has finished, and
// throws the error it ended with. An op that failed earlier (a peer's error, a shutdown)
// reports it here too, so a user who only closes still learns why the op failed.
template <class Shared>
void close_persistent_op(Engine& engine, Shared& shared, OpState& op) {
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    shared.close_requested = true;
  }
  engine.wake();
  op.wait(-1);
  op.throw_if_failed();
}

}  // namespace harness
