// Pipeline schedules as data: action lists, p2p plans, epilogue flags and the all-stage simulation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>

#include "harness/parallel/schedule.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;

std::string actions_of(const std::string& schedule, int stage, int stages, int m) {
  return to_string(make_schedule(schedule)->actions(stage, stages, m));
}

std::string plan_of(const std::string& schedule, int stage, int stages, int m) {
  return to_string(communication_plan(*make_schedule(schedule), stage, stages, m));
}

// Micro-batches whose gradient `stage` sends in a flush call (compressed under epilogue-only).
std::vector<int> epilogue_sends(int stage, int stages, int m) {
  OneFOneBSchedule s;
  std::vector<int> out;
  for (int mb = 0; mb < m; ++mb) {
    if (backward_send_is_epilogue(s, stage, stages, m, mb)) out.push_back(mb);
  }
  return out;
}

std::vector<int> range(int first, int last) {  // [first, last)
  std::vector<int> out;
  for (int i = first; i < last; ++i) out.push_back(i);
  return out;
}

// Every call of a plan in execution order, for breaking plans on purpose.
std::vector<P2PCall*> calls_of(std::vector<StageStep>& plan) {
  std::vector<P2PCall*> out;
  for (StageStep& step : plan) {
    for (P2PCall& c : step.before) out.push_back(&c);
    for (P2PCall& c : step.after) out.push_back(&c);
  }
  return out;
}

std::vector<std::vector<StageStep>> plans_of(int stages, int m) {
  std::vector<std::vector<StageStep>> plans;
  for (int s = 0; s < stages; ++s) {
    plans.push_back(communication_plan(OneFOneBSchedule(), s, stages, m));
  }
  return plans;
}

TEST(Schedule, EveryMicrobatchOnceForwardThenBackwardAndSimulationCompletes) {
  for (const std::string name : {"1f1b", "gpipe"}) {
    const auto schedule = make_schedule(name);
    for (int stages = 1; stages <= 8; ++stages) {
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(::testing::Message() << name << " stages=" << stages << " m=" << m);
        for (int stage = 0; stage < stages; ++stage) {
          const std::vector<PipeAction> acts = schedule->actions(stage, stages, m);
          ASSERT_EQ(acts.size(), 2u * m);
          std::vector<int> fwd_at(m, -1), bwd_at(m, -1);
          for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
            int& at = (acts[i].op == PipeOp::kForward ? fwd_at : bwd_at)[acts[i].microbatch];
            ASSERT_EQ(at, -1) << "duplicate " << to_string(acts);
            at = i;
          }
          for (int mb = 0; mb < m; ++mb) ASSERT_LT(fwd_at[mb], bwd_at[mb]) << to_string(acts);
          if (name == "1f1b") {
            const auto warmup = std::count_if(acts.begin(), acts.end(), [](const PipeAction& a) {
              return a.phase == PipePhase::kWarmup;
            });
            EXPECT_EQ(warmup, std::min(stages - stage - 1, m));
          }
          // The plan carries the same actions; each call has its step's phase.
          const std::vector<StageStep> plan = communication_plan(*schedule, stage, stages, m);
          ASSERT_EQ(plan.size(), acts.size());
          for (size_t i = 0; i < plan.size(); ++i) {
            EXPECT_EQ(plan[i].action, acts[i]);
            for (const auto* calls : {&plan[i].before, &plan[i].after}) {
              for (const P2PCall& c : *calls) EXPECT_EQ(c.phase, acts[i].phase);
            }
          }
        }
        const SimulationResult sim = simulate(*schedule, stages, m);
        ASSERT_TRUE(sim.ok()) << sim.summary();
        for (int stage = 0; stage < stages; ++stage) {
          EXPECT_EQ(sim.peak_in_flight[stage], name == "1f1b" ? std::min(stages - stage, m) : m);
        }
      }
    }
  }
}

TEST(Schedule, OneFOneBActionsByHand) {
  EXPECT_EQ(actions_of("1f1b", 0, 4, 6),
            "warmup: F0 F1 F2 | steady: F3 B0 F4 B1 F5 B2 | cooldown: B3 B4 B5");
  EXPECT_EQ(actions_of("1f1b", 2, 4, 6),
            "warmup: F0 | steady: F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 | cooldown: B5");
  EXPECT_EQ(actions_of("1f1b", 3, 4, 6), "steady: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(Schedule, FewerMicrobatchesThanStages) {  // BR-12: warm-up is capped at m
  EXPECT_EQ(actions_of("1f1b", 0, 4, 2), "warmup: F0 F1 | cooldown: B0 B1");
  EXPECT_EQ(actions_of("1f1b", 1, 4, 2), "warmup: F0 F1 | cooldown: B0 B1");
  EXPECT_EQ(actions_of("1f1b", 2, 4, 2), "warmup: F0 | steady: F1 B0 | cooldown: B1");
  EXPECT_EQ(actions_of("1f1b", 3, 4, 2), "steady: F0 B0 F1 B1");
  for (int stage = 0; stage < 3; ++stage) {
    EXPECT_EQ(actions_of("1f1b", stage, 4, 1), "warmup: F0 | cooldown: B0");
  }
  EXPECT_EQ(actions_of("1f1b", 3, 4, 1), "steady: F0 B0");
  EXPECT_EQ(plan_of("1f1b", 2, 4, 2),
            "{rf0} F0 {sf0} | {rf1} F1 {sf1 rb0} | B0 {sb0!} | {rb1!} B1 {sb1!}");
}

TEST(Schedule, GPipeActionsAndPlanByHand) {
  EXPECT_EQ(actions_of("gpipe", 1, 4, 3), "warmup: F0 F1 F2 | cooldown: B0 B1 B2");
  EXPECT_EQ(plan_of("gpipe", 1, 3, 2),
            "{rf0} F0 {sf0} | {rf1} F1 {sf1} | {rb0!} B0 {sb0!} | {rb1!} B1 {sb1!}");
  EXPECT_EQ(plan_of("gpipe", 0, 1, 2), "F0 | F1 | B0 | B1");  // one stage: no communication
}

TEST(Schedule, OneFOneBPlanFollowsMegatronCalls) {
  // Middle stage: warm-up recv/send, standalone recv before the steady state, fused exchanges,
  // flush on the last steady send and all of the cool-down.
  EXPECT_EQ(plan_of("1f1b", 1, 4, 3),
            "{rf0} F0 {sf0} | {rf1} F1 {sf1} | {rf2} F2 {sf2 rb0} | B0 {sb0!} | "
            "{rb1!} B1 {sb1!} | {rb2!} B2 {sb2!}");
  // First stage: no previous stage, so SEND_BWD_RECV_FWD and every send_backward vanish.
  EXPECT_EQ(plan_of("1f1b", 0, 4, 6),
            "F0 {sf0} | F1 {sf1} | F2 {sf2} | F3 {sf3 rb0} | B0 | F4 {sf4 rb1} | B1 | "
            "F5 {sf5 rb2} | B2 | {rb3!} B3 | {rb4!} B4 | {rb5!} B5");
  // Last stage: no next stage, so SEND_FWD_RECV_BWD vanishes.
  EXPECT_EQ(plan_of("1f1b", 3, 4, 3),
            "{rf0} F0 | B0 {sb0 rf1} | F1 | B1 {sb1 rf2} | F2 | B2 {sb2!}");
  const auto plan = communication_plan(OneFOneBSchedule(), 1, 4, 3);
  EXPECT_EQ(plan[2].after[0].messages[0].peer_stage, 2);  // SEND_FWD_RECV_BWD: both with stage 2
  EXPECT_EQ(plan[2].after[0].messages[1].peer_stage, 2);
  EXPECT_EQ(plan[0].before[0].messages[0].peer_stage, 0);
}

TEST(Schedule, EpilogueOnlyMatchesSpecTableForFourStages) {
  for (int m = 3; m <= 16; ++m) {
    SCOPED_TRACE(m);
    EXPECT_EQ(epilogue_sends(3, 4, m), std::vector<int>({m - 1}));
    EXPECT_EQ(epilogue_sends(2, 4, m), std::vector<int>({m - 2, m - 1}));
    EXPECT_EQ(epilogue_sends(1, 4, m), std::vector<int>({m - 3, m - 2, m - 1}));
    EXPECT_EQ(epilogue_sends(0, 4, m), std::vector<int>());
    size_t total = 0;
    for (int k = 0; k < 4; ++k) total += epilogue_sends(k, 4, m).size();
    EXPECT_EQ(total, 6u);  // p(p-1)/2
  }
}

TEST(Schedule, EpilogueFlagsAgreeBetweenSenderAndReceiver) {
  OneFOneBSchedule s;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (int k = 1; k < p; ++k) {
        SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m << " k=" << k);
        // docs/design.md §4: the last p-k sends are compressed; all m of them when m < p-k.
        EXPECT_EQ(epilogue_sends(k, p, m), range(std::max(0, m - (p - k)), m));
        for (int mb = 0; mb < m; ++mb) {
          EXPECT_EQ(backward_send_is_epilogue(s, k, p, m, mb),
                    backward_recv_is_epilogue(s, k - 1, p, m, mb));
        }
      }
      EXPECT_FALSE(backward_recv_is_epilogue(s, p - 1, p, m, 0));  // the last stage receives none
    }
  }
}

TEST(Schedule, SimulatorReportsDeadlockOfBrokenPlan) {
  // Stage 0 waits for the gradient of mb 0 before sending the activation stage 1 needs to make it.
  auto plans = plans_of(4, 6);
  const std::vector<P2PCall*> calls = calls_of(plans[0]);
  ASSERT_EQ(to_string(*calls[0]), "{sf0}");
  ASSERT_EQ(to_string(*calls[3]), "{sf3 rb0}");
  std::swap(*calls[0], *calls[3]);
  const SimulationResult sim = simulate(plans);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_FALSE(sim.ok());
  EXPECT_THAT(sim.blocked, Contains(AllOf(HasSubstr("stage 0: blocked in call {sf3 rb0}"),
                                          HasSubstr("recv_backward mb 0 from stage 1"))))
      << sim.summary();
}

TEST(Schedule, SimulatorReportsMismatchedEpilogueAndMicrobatch) {
  auto plans = plans_of(4, 6);
  calls_of(plans[2]).back()->messages[0].epilogue = false;  // cool-down send_backward of mb 5 loses its flag
  SimulationResult sim = simulate(plans);
  EXPECT_FALSE(sim.deadlock);
  EXPECT_THAT(sim.errors, Contains(HasSubstr("stage 1 recv_backward (mb 5, chunk 0 to 0, epilogue true) matched "
                                             "stage 2's message (mb 5, chunk 0 to 0, epilogue false)")))
      << sim.summary();

  plans = plans_of(4, 6);
  calls_of(plans[1])[0]->messages[0].microbatch = 1;  // recv_forward labelled with the wrong mb
  sim = simulate(plans);
  EXPECT_THAT(sim.errors, Contains(HasSubstr("recv_forward (mb 1, chunk 0 to 0, epilogue false) matched "
                                             "stage 0's message (mb 0, chunk 0 to 0, epilogue false)")))
      << sim.summary();
}

// 1F1B and GPipe: a gradient is in the epilogue exactly when the calls on both of its ends are
// flush calls (what epilogue-only CB compressed before the flag moved to the message); forward
// messages never are.
TEST(Schedule, EpilogueIsTheFlushCallOfOneFOneBAndGPipe) {
  for (const std::string name : {"1f1b", "gpipe"}) {
    const auto schedule = make_schedule(name);
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        SCOPED_TRACE(::testing::Message() << name << " p=" << p << " m=" << m);
        for (int k = 0; k < p; ++k) {
          for (const StageStep& step : communication_plan(*schedule, k, p, m)) {
            for (const auto* calls : {&step.before, &step.after}) {
              for (const P2PCall& c : *calls) {
                for (const P2PMessage& msg : c.messages) {
                  const bool backward = msg.dir == P2PDir::kSendBackward || msg.dir == P2PDir::kRecvBackward;
                  EXPECT_EQ(msg.epilogue, backward && c.flush) << to_string(c);
                  EXPECT_EQ(msg.chunk, 0);
                  EXPECT_EQ(msg.peer_chunk, 0);
                }
              }
            }
          }
        }
      }
    }
  }
}

// ---- Interleaved 1F1B ----

// Megatron's order for p = 2, v = 2, m = 4, worked by hand: forwards of virtual micro-batches j =
// 0..7 run chunks 0 0 1 1 0 0 1 1 with micro-batches 0 1 0 1 2 3 2 3, backwards the chunks reversed;
// stage 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, stage 1 with 2.
TEST(InterleavedSchedule, ActionsByHand) {
  InterleavedOneFOneBSchedule s(2);
  EXPECT_EQ(s.name(), "interleaved_1f1b");
  EXPECT_EQ(s.chunks(), 2);
  EXPECT_EQ(to_string(s.actions(0, 2, 4)),
            "warmup: F0 F1 F0@1 F1@1 | steady: F2 B0@1 F3 B1@1 F2@1 B0 F3@1 B1 | cooldown: B2@1 B3@1 B2 B3");
  EXPECT_EQ(to_string(s.actions(1, 2, 4)),
            "warmup: F0 F1 | steady: F0@1 B0@1 F1@1 B1@1 F2 B0 F3 B1 F2@1 B2@1 F3@1 B3@1 | cooldown: B2 B3");
  // m == p: every forward first (Megatron's rule), on every stage.
  EXPECT_EQ(to_string(s.actions(1, 2, 2)), "warmup: F0 F1 F0@1 F1@1 | cooldown: B0@1 B1@1 B0 B1");
}

// The ring: the last stage's chunk c feeds stage 0's chunk c + 1, and gets its gradient back from it.
TEST(InterleavedSchedule, PlanCrossesTheRingBetweenChunks) {
  InterleavedOneFOneBSchedule s(2);
  EXPECT_EQ(to_string(communication_plan(s, 1, 2, 2)),
            "{rf0} F0 {sf0 rf1} | F1 {sf1 rf0@1} | F0@1 {rf1@1} | F1@1 | B0@1 {sb0@1!} | B1@1 {sb1@1! rb0!} | "
            "B0 {sb0! rb1!} | B1 {sb1!}");
  const auto plan = communication_plan(s, 1, 2, 2);
  const P2PMessage& to_chunk1 = plan[0].after[0].messages[0];  // stage 1 chunk 0 -> stage 0 chunk 1
  EXPECT_EQ(to_chunk1.peer_stage, 0);
  EXPECT_EQ(to_chunk1.chunk, 0);
  EXPECT_EQ(to_chunk1.peer_chunk, 1);
  const P2PMessage& from_chunk1 = plan[5].after[0].messages[1];  // gradient of chunk 0 from stage 0 chunk 1
  EXPECT_EQ(from_chunk1.dir, P2PDir::kRecvBackward);
  EXPECT_EQ(from_chunk1.peer_stage, 0);
  EXPECT_EQ(from_chunk1.peer_chunk, 1);
  EXPECT_EQ(next_virtual_stage(1, 1, 2, 2).exists(), false);  // the last virtual stage
  EXPECT_EQ(previous_virtual_stage(0, 0, 2, 2).exists(), false);
  EXPECT_EQ(previous_virtual_stage(0, 1, 2, 2).stage, 1);
}

TEST(InterleavedSchedule, EveryChunkAndMicrobatchOnceAndSimulationCompletesWithMegatronsPeak) {
  for (int v = 2; v <= 4; ++v) {
    InterleavedOneFOneBSchedule s(v);
    for (int p = 2; p <= 6; ++p) {
      for (int m = p; m <= 4 * p; m += p) {
        SCOPED_TRACE(::testing::Message() << "v=" << v << " p=" << p << " m=" << m);
        const int total = m * v;
        for (int k = 0; k < p; ++k) {
          const std::vector<PipeAction> acts = s.actions(k, p, m);
          ASSERT_EQ(acts.size(), 2u * total);
          std::vector<int> fwd_at(total, -1), bwd_at(total, -1);
          for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
            ASSERT_GE(acts[i].chunk, 0);
            ASSERT_LT(acts[i].chunk, v);
            int& at = (acts[i].op == PipeOp::kForward ? fwd_at : bwd_at)[acts[i].chunk * m + acts[i].microbatch];
            ASSERT_EQ(at, -1) << "duplicate " << to_string(acts);
            at = i;
          }
          for (int x = 0; x < total; ++x) ASSERT_LT(fwd_at[x], bwd_at[x]) << to_string(acts);
          const auto warmup = std::count_if(acts.begin(), acts.end(),
                                            [](const PipeAction& a) { return a.phase == PipePhase::kWarmup; });
          EXPECT_EQ(warmup, m == p ? total : std::min((p - k - 1) * 2 + (v - 1) * p, total));
        }
        const SimulationResult sim = simulate(s, p, m);
        ASSERT_TRUE(sim.ok()) << sim.summary();
        for (int k = 0; k < p; ++k) {
          const int w = std::min((p - k - 1) * 2 + (v - 1) * p, total);
          EXPECT_EQ(sim.peak_in_flight[k], m == p ? total : std::min(w + 1, total)) << k;
        }
      }
    }
  }
}

// The epilogue of an interleaved stage: the backward sends after its last forward. The receiver's
// flag is the sender's (simulate() checks both ends of every message above); here its count.
TEST(InterleavedSchedule, EpilogueIsTheSendsAfterTheLastForward) {
  for (int v = 2; v <= 3; ++v) {
    InterleavedOneFOneBSchedule s(v);
    for (int p = 2; p <= 4; ++p) {
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE(::testing::Message() << "v=" << v << " p=" << p << " m=" << m);
        for (int k = 0; k < p; ++k) {
          const std::vector<PipeAction> acts = s.actions(k, p, m);
          size_t last_forward = 0;
          for (size_t i = 0; i < acts.size(); ++i) {
            if (acts[i].op == PipeOp::kForward) last_forward = i;
          }
          for (size_t i = 0; i < acts.size(); ++i) {
            const PipeAction& a = acts[i];
            if (a.op != PipeOp::kBackward) continue;
            const bool sends = previous_virtual_stage(k, a.chunk, p, v).exists();
            EXPECT_EQ(backward_send_is_epilogue(s, k, p, m, a.microbatch, a.chunk), sends && i > last_forward)
                << "stage " << k << " B" << a.microbatch << "@" << a.chunk;
            const VirtualStage from = next_virtual_stage(k, a.chunk, p, v);
            if (from.exists()) {
              EXPECT_EQ(backward_recv_is_epilogue(s, k, p, m, a.microbatch, a.chunk),
                        backward_send_is_epilogue(s, from.stage, p, m, a.microbatch, from.chunk));
            }
          }
        }
      }
    }
  }
  // By hand, p = 2, v = 2, m = 4 (actions in ActionsByHand): stage 0's last forward is F3@1, after
  // it B1 B2@1 B3@1 B2 B3, of which chunk 0's send nothing (first virtual stage); stage 1's is F3@1,
  // after it B3@1 B2 B3.
  InterleavedOneFOneBSchedule s(2);
  auto sends = [&](int k) {
    std::vector<std::string> out;
    for (int c = 0; c < 2; ++c) {
      for (int mb = 0; mb < 4; ++mb) {
        if (backward_send_is_epilogue(s, k, 2, 4, mb, c)) out.push_back(fmt::format("B{}@{}", mb, c));
      }
    }
    return out;
  };
  EXPECT_EQ(sends(0), std::vector<std::string>({"B2@1", "B3@1"}));
  EXPECT_EQ(sends(1), std::vector<std::string>({"B2@0", "B3@0", "B3@1"}));
}

// ---- ZB-H1 ----

// p = 4, m = 6 by hand: stage 0 delays nothing (B j then W j), stage 3 delays W by 3 micro-batches.
TEST(ZeroBubbleH1Schedule, ActionsByHand) {
  ZeroBubbleH1Schedule s;
  EXPECT_EQ(s.name(), "zb_h1");
  EXPECT_TRUE(s.splits_backward());
  EXPECT_EQ(to_string(s.actions(0, 4, 6)),
            "warmup: F0 F1 F2 | steady: F3 B0 W0 F4 B1 W1 F5 B2 W2 | cooldown: B3 W3 B4 W4 B5 W5");
  EXPECT_EQ(to_string(s.actions(3, 4, 6)),
            "steady: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 | cooldown: W3 W4 W5");
  EXPECT_EQ(to_string(s.actions(1, 4, 2)), "warmup: F0 F1 | cooldown: B0 B1 W0 W1");  // m < p - k
  // The last of 2 stages: W has no message (its B received the gradient), a B's send is posted
  // without waiting ("~": W runs while the previous stage catches up), and only B2 follows the
  // last forward (the epilogue).
  EXPECT_EQ(to_string(communication_plan(s, 1, 2, 3)),
            "{rf0} F0 | B0 {sb0}~ | {rf1} F1 | B1 {sb1}~ | W0 | {rf2} F2 | B2 {sb2!}~ | W1 | W2");
}

// Every B before its W, the simulation completes, and every stage holds at most p activations until
// their W: 1F1B's peak on stage 0, so the largest stage's memory is 1F1B's.
TEST(ZeroBubbleH1Schedule, SimulationCompletesAtOneFOneBsPeak) {
  ZeroBubbleH1Schedule s;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
      for (int k = 0; k < p; ++k) {
        const std::vector<PipeAction> acts = s.actions(k, p, m);
        ASSERT_EQ(acts.size(), 3u * m);
        std::vector<int> at[3] = {std::vector<int>(m, -1), std::vector<int>(m, -1), std::vector<int>(m, -1)};
        for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
          int& x = at[static_cast<int>(acts[i].op)][acts[i].microbatch];
          ASSERT_EQ(x, -1) << to_string(acts);
          x = i;
        }
        for (int mb = 0; mb < m; ++mb) {
          ASSERT_LT(at[0][mb], at[1][mb]) << to_string(acts);
          ASSERT_LT(at[1][mb], at[2][mb]) << to_string(acts);
        }
        // The same forwards and backwards (B) in the same order as 1F1B.
        std::vector<PipeAction> fb;
        for (const PipeAction& a : acts) {
          if (a.op != PipeOp::kWeight) fb.push_back({a.op, a.microbatch, PipePhase::kWarmup});
        }
        std::vector<PipeAction> ref;
        for (const PipeAction& a : OneFOneBSchedule().actions(k, p, m)) ref.push_back({a.op, a.microbatch, PipePhase::kWarmup});
        EXPECT_EQ(fb, ref) << to_string(acts);
      }
      const SimulationResult sim = simulate(s, p, m);
      ASSERT_TRUE(sim.ok()) << sim.summary();
      const SimulationResult one = simulate(OneFOneBSchedule(), p, m);
      for (int k = 0; k < p; ++k) {
        EXPECT_EQ(sim.peak_in_flight[k], std::min(p, m)) << k;
        EXPECT_LE(sim.peak_in_flight[k], *std::max_element(one.peak_in_flight.begin(), one.peak_in_flight.end()));
      }
    }
  }
}

// ZB-H1's epilogue: the B sends after the stage's last forward, exactly 1F1B's (same F/B order).
TEST(ZeroBubbleH1Schedule, EpilogueIsOneFOneBs) {
  ZeroBubbleH1Schedule zb;
  OneFOneBSchedule one;
  for (int p = 2; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (int k = 1; k < p; ++k) {
        for (int mb = 0; mb < m; ++mb) {
          EXPECT_EQ(backward_send_is_epilogue(zb, k, p, m, mb), backward_send_is_epilogue(one, k, p, m, mb))
              << "p=" << p << " m=" << m << " k=" << k << " mb=" << mb;
        }
      }
    }
  }
}

// The timed simulation gives each schedule's textbook makespan, F = B = W = 1 time unit (a whole
// backward 2; a chunk's actions 1/v): 1F1B and GPipe 3(m + p - 1), interleaved 3m + 3(p - 1)/v, ZB-H1
// 3m + (p - 1) for m >= p, a third of 1F1B's bubble, and never longer than 1F1B.
TEST(ScheduleTime, MakespansAndBubblesOfEverySchedule) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
      const SimulationResult one = simulate(OneFOneBSchedule(), p, m);
      EXPECT_DOUBLE_EQ(one.makespan, 3.0 * (m + p - 1));
      EXPECT_NEAR(one.bubble_fraction(), (p - 1.0) / (m + p - 1.0), 1e-12);
      EXPECT_DOUBLE_EQ(simulate(GPipeSchedule(), p, m).makespan, 3.0 * (m + p - 1));
      const SimulationResult zb = simulate(ZeroBubbleH1Schedule(), p, m);
      if (m >= p) {  // fewer micro-batches leave too few W's to fill the cool-down
        EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + (p - 1));
        EXPECT_NEAR(zb.bubble_fraction(), (p - 1.0) / (3.0 * m + p - 1.0), 1e-12);
      }
      EXPECT_LE(zb.makespan, one.makespan);
      for (int v = 2; v <= 3 && p >= 2; ++v) {
        if (m % p != 0) continue;
        EXPECT_NEAR(simulate(InterleavedOneFOneBSchedule(v), p, m).makespan, 3.0 * m + 3.0 * (p - 1) / v, 1e-9) << v;
      }
    }
  }
  // Other costs (F 1, B 1, W 2): 1F1B stays (m + p - 1)(F + B + W); ZB-H1's delay-by-k order is
  // the paper's for equal costs and leaves some bubble here, but less than 1F1B's.
  const ActionCosts heavy_w{1, 1, 2};
  EXPECT_DOUBLE_EQ(simulate(OneFOneBSchedule(), 4, 8, heavy_w).makespan, 4.0 * (8 + 3));
  EXPECT_LT(simulate(ZeroBubbleH1Schedule(), 4, 8, heavy_w).makespan, 4.0 * (8 + 3));
}

// A send posted without waiting that nobody receives is reported, not lost.
TEST(Schedule, SimulatorReportsAnUnreceivedSend) {
  std::vector<std::vector<StageStep>> plans = {communication_plan(ZeroBubbleH1Schedule(), 0, 2, 2),
                                               communication_plan(ZeroBubbleH1Schedule(), 1, 2, 2)};
  // Stage 0 stops receiving the gradient of micro-batch 1: stage 1's unwaited send is left over.
  for (StageStep& step : plans[0]) {
    for (P2PCall& c : step.before) {
      if (c.messages[0].dir == P2PDir::kRecvBackward && c.messages[0].microbatch == 1) c.messages.clear();
    }
    step.before.erase(std::remove_if(step.before.begin(), step.before.end(),
                                     [](const P2PCall& c) { return c.messages.empty(); }),
                      step.before.end());
  }
  const SimulationResult sim = simulate(plans);
  EXPECT_THAT(sim.errors, Contains(HasSubstr("stage 1: a backward message (mb 1) to stage 0 was never received")))
      << sim.summary();
}

TEST(InterleavedSchedule, RefusalsNameTheRuleAndTheFix) {
  try {
    InterleavedOneFOneBSchedule(4).actions(0, 4, 6);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("6 micro-batches"), HasSubstr("4 pipeline stages"),
                                HasSubstr("multiple of the stages"), HasSubstr("gives 4 or 8 micro-batches")));
  }
  try {
    InterleavedOneFOneBSchedule(2).actions(0, 4, 2);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("2 micro-batches"), HasSubstr("gives 4 micro-batches")));
  }
  EXPECT_THROW(InterleavedOneFOneBSchedule(2).actions(0, 1, 4), std::invalid_argument);  // pp = 1
  try {
    InterleavedOneFOneBSchedule(1);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("parallel.virtual_stages = 1"), HasSubstr("at least 2")));
  }
  EXPECT_EQ(make_schedule("interleaved_1f1b", 3)->chunks(), 3);
  EXPECT_EQ(make_schedule("1f1b", 1)->chunks(), 1);
  EXPECT_THROW(make_schedule("1f1b", 2), std::invalid_argument);
  EXPECT_THROW(make_schedule("interleaved_1f1b"), std::invalid_argument);  // needs its chunks
}

TEST(Schedule, NamesAndArgumentChecks) {
  EXPECT_EQ(make_schedule("1f1b")->name(), "1f1b");
  EXPECT_EQ(make_schedule("gpipe")->name(), "gpipe");
  try {
    make_schedule("interleaved");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'interleaved'"), HasSubstr("1f1b"), HasSubstr("gpipe"), HasSubstr("zb_h1")));
  }
  OneFOneBSchedule s;
  EXPECT_THROW(s.actions(4, 4, 2), std::invalid_argument);
  EXPECT_THROW(s.actions(0, 4, 0), std::invalid_argument);
  EXPECT_THROW(backward_send_is_epilogue(s, 1, 4, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace optcc
