// The mode on a C++ dispatch key (csrc/mode.cpp): the key, the tests that make the mode pass
// a call through untouched, and the pass-through itself. csrc/hit.cpp serves the rest.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/ThreadLocalDebugInfo.h>

namespace eagerdecomp::mode {

// The one place the mode's key is chosen (docs/internals.md, "The mode on a dispatch key").
// Fake is a functionality key between BackendSelect and Python: below autograd,
// ADInplaceOrView and Functionalize (they record the user's op first), above BackendSelect (so
// factory calls with no tensor argument reach it, as they reach a Python mode), and no
// composite kernel is registered for it, so its fallback sees every op a Python mode would.
// It is free in torch 2.10-2.13 and reserved upstream for the C++ FakeTensor: load time
// checks it is still free (slot_taken) and the mode keeps its Python path if not.
constexpr c10::DispatchKey kKey = c10::DispatchKey::Fake;

// The witness's key (eagerdecomp.testing.KernelWitness): a backend key, below BackendSelect
// and so below the mode, free in CPU and CUDA builds.
constexpr c10::DispatchKey kWitnessKey = c10::DispatchKey::FPGA;

// The kind under which the active mode's state rides in c10::ThreadLocalDebugInfo: that list
// travels in at::ThreadLocalState (autograd's worker threads, at::launch), as the included key
// does, where a C++ thread_local would not. (A kind is the address of a static name.)
inline constexpr std::string_view kStateName = "eagerdecomp::mode";
inline const c10::DebugInfoKind kStateKind(&kStateName);

// Whether the mode leaves this call alone: fake, meta or Python-key tensors (torch.compile's
// tracing, FakeTensorMode, subclasses), Meta in the thread's included set, or the Python key
// excluded (no_dispatch(), _DisableTorchDispatch: where a Python mode would not see the call).
bool passes_by(const c10::OperatorHandle& op, const torch::jit::Stack* stack);

// Runs the call below the mode's key, with the key excluded while the kernel runs (its own
// at:: calls are not the user's, as a Python mode pops itself around func(*args)).
void pass_below(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

}  // namespace eagerdecomp::mode

namespace eagerdecomp::mode {

// What holds the slot of `k` in this process ("" when it is free): a fallback, or the first op
// with a kernel registered for it.
std::string slot_taken(c10::DispatchKey k);

// The thread's included key and state, set by enter and put back exactly by leave (the
// returned token says what was there before).
struct Token {
  bool was_included;
  std::shared_ptr<c10::DebugInfoBase> state;
};
Token enter(std::shared_ptr<c10::DebugInfoBase> state);
void leave(const Token& token);

}  // namespace eagerdecomp::mode
