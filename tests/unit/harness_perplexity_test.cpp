// A NaN validation loss is never shown with a finite perplexity, and a perplexity
// above the cap is marked as capped (in the value, the eval table's ppl_capped column and the log).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/train/run_records.h"

namespace optcc {
namespace {

TEST(Perplexity, NanInNanOut) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Perplexity p = perplexity(nan);
  EXPECT_TRUE(std::isnan(p.value));  // exp(min(20, NaN)) gave exp(20) = 485165195.41
  EXPECT_FALSE(p.capped);
  EXPECT_EQ(eval_text(nan, p), "valid loss nan | ppl nan");
}

TEST(Perplexity, BelowTheCapIsExactAboveIsMarked) {
  EXPECT_DOUBLE_EQ(perplexity(2.0).value, std::exp(2.0));
  EXPECT_FALSE(perplexity(2.0).capped);
  EXPECT_FALSE(perplexity(kPerplexityLossCap).capped);
  const Perplexity big = perplexity(25.0);
  EXPECT_TRUE(big.capped);
  EXPECT_DOUBLE_EQ(big.value, std::exp(kPerplexityLossCap));
  EXPECT_EQ(eval_text(25.0, big), "valid loss 25.0000 | ppl > 485165195.41 (capped)");
  EXPECT_EQ(eval_text(std::log(10.0), perplexity(std::log(10.0))), "valid loss 2.3026 | ppl 10.00");
  const Perplexity inf = perplexity(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(inf.capped);
}

TEST(Perplexity, EvalTableHasTheCappedColumn) {
  const auto tables = result_tables();
  const auto eval = std::find_if(tables.begin(), tables.end(), [](const TableSpec& t) { return t.group == "eval"; });
  ASSERT_NE(eval, tables.end());
  std::vector<std::string> names;
  for (const auto& c : eval->columns) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"step", "loss", "ppl", "ppl_capped"}));
}

}  // namespace
}  // namespace optcc
