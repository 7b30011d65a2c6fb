// DynamicLossScaler (harness/train/loss_scaler.h): the scale's schedule in closed form, and its
// checkpoint round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "harness/train/loss_scaler.h"

namespace optcc {
namespace {

TEST(LossScaler, BacksOffOnOverflowGrowsAfterTheIntervalWithinItsBounds) {
  DynamicLossScaler s(true, LossScaleOptions{1024.0, 3, 0.5, 128.0, 4096.0});
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(true);  // overflow: 512, growth count reset
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.skipped_in_a_row(), 1);
  s.update(false), s.update(false);
  EXPECT_EQ(s.scale(), 512.0);  // 2 of 3 clean steps
  EXPECT_EQ(s.skipped_in_a_row(), 0);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);  // the third doubles it
  EXPECT_EQ(s.clean_steps(), 0);
  for (int i = 0; i < 4; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 128.0);  // 1024 / 2^4 = 64, floored at min_scale
  EXPECT_EQ(s.skipped_in_a_row(), 4);
  for (int i = 0; i < 3 * 10; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 4096.0);  // 128 · 2^10, capped at max_scale
}

TEST(LossScaler, DisabledKeepsOneAndStillCountsSkips) {
  DynamicLossScaler s(false, LossScaleOptions{});
  s.update(true), s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.skipped_in_a_row(), 2);
  s.update(false);
  EXPECT_EQ(s.skipped_in_a_row(), 0);
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, CheckpointRoundTripContinuesTheSameSchedule) {
  DynamicLossScaler a(true, LossScaleOptions{65536.0, 2, 0.5, 1.0, 16777216.0});
  a.update(true), a.update(false);  // 32768, one clean step
  torch::serialize::OutputArchive out;
  a.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  DynamicLossScaler b(true, LossScaleOptions{65536.0, 2, 0.5, 1.0, 16777216.0});
  b.load(in);
  EXPECT_EQ(b.scale(), 32768.0);
  EXPECT_EQ(b.clean_steps(), 1);
  a.update(false), b.update(false);
  EXPECT_EQ(a.scale(), 65536.0);
  EXPECT_EQ(b.scale(), a.scale());
}

}  // namespace
}  // namespace optcc
