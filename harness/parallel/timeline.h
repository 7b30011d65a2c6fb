// Timeline: per-rank events with start and end, for the steps `log.timeline_steps` selects,
// to show where an emulated step's time goes. Written to /timeline of the results (harness/train/timeline_records.h), exported as Chrome
// trace-event JSON and reduced to the Fig. 10 breakdown by `optcc trace` (harness/tools/trace.h, harness/train/breakdown.h).
//
// Recording is pull-free and cheap when off: every hook is a TimelineScope (or a Communicator
// check) that reads one thread-local pointer, Timeline::active(), and does nothing when it is null.
// It is non-null only inside a Timeline::StepGuard of a selected step, on the thread that created
// the guard (the rank's training thread; ranks as threads each have their own). So a run without
// timeline_steps reads no clock and stores nothing beyond what it did before.
//
// Clock: one per run. Events are stored in ns on CLOCK_MONOTONIC and reported in µs relative to
// the run's origin, which every rank takes right after a common world barrier (set_origin): the
// ranks' origins then differ by the barrier's exit skew (tens of µs on one host). CLOCK_MONOTONIC
// is not shared between hosts, which is why the origin is agreed by a barrier and not broadcast.
//
// Kinds and streams (the /timeline columns `kind`, `stream`; names in kind_name()/stream_name()
// and in the results' root attributes timeline_kinds / timeline_streams):
//   step         the whole training step of this rank (stream step)
//   forward, backward   one micro-batch on this stage (compute)
//   send, recv   one point-to-point message (stream = its traffic class); a receive starts when
//                the sender posted (known from the emulation/timeline header, communicator.h), so the
//                time spent waiting for the peer to get there is not counted as transfer
//   collective   one all-reduce / all-gather / reduce-scatter / broadcast (stream = its class)
//   compress, decompress   codec work on pipeline messages (compression stream); with a
//                compressing DP reducer its whole reduction is a `compress` span on the dp stream
//                (the collectives inside it are separate events)
//   lep_update   the LEP error-buffer update of a compressed backward send (compression)
//   dp_reduce    the whole uncompressed DP reduction (dp stream; its collectives inside it)
//   optimizer, evaluation, checkpoint   (compute)
//   emulated_wait   time slept by link emulation at the end of an operation (the op's stream)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optcc {

enum class EventKind : int32_t {
  kStep, kForward, kBackward, kSend, kRecv, kCollective, kCompress, kDecompress, kLepUpdate,
  kDpReduce, kOptimizer, kEvaluation, kCheckpoint, kEmulatedWait,
};
constexpr int kNumEventKinds = 14;

/// Streams 2..7 follow the Traffic enum (communicator.h): stream = 2 + traffic index.
enum class Stream : int32_t {
  kStep, kCompute, kTensorParallel, kPipelineForward, kPipelineBackward, kDataParallel, kEmbedding,
  kControl, kCompression,
};
constexpr int kNumStreams = 9;

const char* kind_name(EventKind k);   // "step", "forward", ..., "emulated_wait"
const char* stream_name(Stream s);    // "step", "compute", "tp", "pp_fwd", "pp_bwd", "dp", ...
std::vector<std::string> kind_names();
std::vector<std::string> stream_names();

struct TimelineEvent {
  int64_t step = 0;
  EventKind kind = EventKind::kStep;
  Stream stream = Stream::kCompute;
  int32_t microbatch = -1;  // -1: not tied to a micro-batch
  double start_us = 0;      // µs since the run's origin
  double end_us = 0;        // >= start_us
};

/// An event with the global rank that recorded it (gathered to rank 0, read back from /timeline).
struct RankedEvent {
  int rank = 0;
  TimelineEvent event;
};

class Timeline {
 public:
  /// `steps`: the selected steps (1-based). Nothing is recorded for other steps.
  explicit Timeline(std::vector<int64_t> steps);
  bool selected(int64_t step) const;
  bool empty() const { return steps_.empty(); }

  /// The run's clock zero (ns, CLOCK_MONOTONIC). Call on every rank right after a world barrier.
  void set_origin(int64_t origin_ns) { origin_ns_ = origin_ns; }
  int64_t origin_ns() const { return origin_ns_; }

  /// While alive, and when `step` is selected, this timeline is the calling thread's recorder.
  class StepGuard {
   public:
    StepGuard(Timeline* t, int64_t step);
    ~StepGuard();
    StepGuard(const StepGuard&) = delete;
    StepGuard& operator=(const StepGuard&) = delete;
    bool recording() const { return installed_; }

   private:
    Timeline* previous_ = nullptr;
    bool installed_ = false;
  };

  /// The calling thread's recorder, or null (the one branch of every hook).
  static Timeline* active();
  /// Records one event of the current step. Times in ns on CLOCK_MONOTONIC.
  void add(EventKind kind, Stream stream, int microbatch, int64_t start_ns, int64_t end_ns);
  /// The events recorded so far, removed from the timeline.
  std::vector<TimelineEvent> take_events();

  /// The micro-batch that hooks without their own use (-1 outside a MicrobatchContext).
  static int current_microbatch();

 private:
  std::vector<int64_t> steps_;
  int64_t origin_ns_ = 0;
  int64_t step_ = 0;
  std::vector<TimelineEvent> events_;
};

/// An event from construction to destruction, when a recorder is active; otherwise nothing
/// (one thread-local read). `microbatch` -1 = Timeline::current_microbatch().
class TimelineScope {
 public:
  TimelineScope(EventKind kind, Stream stream, int microbatch = -1);
  ~TimelineScope();
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  Timeline* timeline_;
  EventKind kind_;
  Stream stream_;
  int microbatch_;
  int64_t start_ns_ = 0;
};

/// Sets the calling thread's current micro-batch while alive (pipeline messages and codec work
/// take it from here), when a recorder is active.
class MicrobatchContext {
 public:
  explicit MicrobatchContext(int microbatch);
  ~MicrobatchContext();
  MicrobatchContext(const MicrobatchContext&) = delete;
  MicrobatchContext& operator=(const MicrobatchContext&) = delete;

 private:
  int previous_;
  bool set_ = false;
};

}  // namespace optcc
