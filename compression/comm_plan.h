// What a compressor does for one call, described by the compressor itself: the collectives it issues
// (kind and tensor bytes, in order), the local arithmetic of its encode and decode, and the state it
// keeps afterwards. GradReducer::plan (grad_reducer.h) and ActCodec's encode/decode arithmetic
// (act_codec.h) fill these from the same rules their runtime code follows (which tensors go raw,
// which collective carries what), so the analytic traffic model and the simulator
// (harness/perfmodel/traffic_estimate.h, simulator.h) only add plans up and never restate a compressor.
// A test runs every registered compressor through both and compares bytes, calls and state bytes
// (tests/unit/compressor_plans_test.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "harness/parallel/link_emulator.h"  // CollectiveKind

namespace optcc {

/// One operation behind the byte counts, as the runtime issues it: a collective on the group the
/// operation belongs to, or local arithmetic of a compressor.
struct CommStep {
  bool compute = false;                               // false: a collective
  CollectiveKind kind = CollectiveKind::kAllReduce;   // collective: its kind
  int64_t bytes = 0;           // collective: the tensor bytes X the Communicator gets (all_gather: this
                               // rank's input; the 16-bit `none` wire: its buffer padded to the group, as
                               // its all-to-all and all-gather carry it); one rank sends
                               // LinkEmulator::ring_send_bytes(kind, X, n)
  double flops = 0;            // compute: FLOPs of the compressor's arithmetic
  double memory_bytes = 0;     // compute: bytes it reads and writes (element-wise work)
  std::string codec;           // compute: the compressor ("powersgd", "lowrank", ...) whose throughput applies
  std::string what;            // a label for reports ("P all-reduce", "P = MQ", ...)
};

/// A collective step of `bytes` (the tensor bytes the Communicator gets).
CommStep collective_step(CollectiveKind kind, int64_t bytes, std::string what);
/// An arithmetic step of compressor `codec`: `flops` and `memory_bytes` read and written.
CommStep arithmetic_step(std::string codec, double flops, double memory_bytes, std::string what);

/// How a plan is asked for.
struct PlanContext {
  /// The global optimizer step of the call (reducers with a warm-up reduce raw before it ends).
  /// Default: after any warm-up.
  int64_t step = std::numeric_limits<int64_t>::max();
  /// Bytes per element of the fp32 gradient messages (PowerSGD's P, Q and raw all-reduces, the
  /// element-wise reducers' raw all-reduce, `none`). 0: as the runtime sends them (4; `none` with a
  /// 16-bit wire: its own). N > 0: every such message counted at N bytes per element (the traffic
  /// model's --element-bytes, e.g. 2 for the paper's all-fp16 runs).
  int64_t element_bytes = 0;
  /// The gradients live on the CPU and the group is Gloo (the bf16 reducer then all-gathers).
  bool host_gloo = false;
  /// The reference's PowerSGD rule (every >= 2-D gradient compressed: min_compression_rate read as
  /// 0, docs/design.md §6.2), for `optcc traffic --reference-powersgd`: the plan of a reducer built
  /// with that rate. Other reducers ignore it.
  bool compress_every_matrix = false;
  /// Ranks in the group. Plans list the same collectives whatever its size (a group of one rank
  /// sends nothing, and the runtime skips or no-ops them); only the 16-bit `none` wire's padding
  /// depends on it.
  int64_t group_size = 1;
};

/// A reducer's call: its operations in order, and the persistent state it holds afterwards.
struct ReducerPlan {
  std::vector<CommStep> steps;
  int64_t error_feedback_bytes = 0;  // GradReducer::error_feedback_bytes() after the call
  int64_t factor_bytes = 0;          // GradReducer::factor_bytes() after the call
};

/// Σ bytes (X) over the collectives of `steps`.
int64_t collective_bytes(const std::vector<CommStep>& steps);
/// The number of collectives in `steps`.
int64_t collective_count(const std::vector<CommStep>& steps);

}  // namespace optcc
