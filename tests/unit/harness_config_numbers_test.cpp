// Every numeric value of every config section and of every compressor's options
// is read by one strict parser (compression/options.h): integers are decimal (`010` = 10, YAML 1.2),
// hex/octal spellings are refused, and no float key accepts NaN or an infinity.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "compression/act_codec.h"
#include "compression/options.h"
#include "compression/powersgd.h"
#include "compression/qsgd_reducer.h"
#include "compression/randomk_reducer.h"
#include "compression/signsgd_reducer.h"
#include "compression/topk_reducer.h"
#include "harness/config/config.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string load_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  testing::TempDir dir;
  const std::string path = dir / "exp.yaml";
  std::ofstream(path) << yaml;
  try {
    load_config(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Every (section.key) of the config whose field has type T.
template <class T> std::vector<std::string> keys_of_type() {
  Config c;
  std::vector<std::string> out;
  for_each_section(c, [&](const char* sec, auto& section) {
    section.visit([&](const char* key, auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) out.push_back(std::string(sec) + "." + key);
    });
  });
  return out;
}

TEST(ConfigNumbers, LeadingZerosAreDecimalInFilesAndOverrides) {
  testing::TempDir dir;
  const std::string path = dir / "exp.yaml";
  std::ofstream(path) << "train:\n  warmup_steps: 010\n  eval_iters: 08\n";
  Config c = load_config(path);
  EXPECT_EQ(c.train.warmup_steps, 10);  // yaml-cpp alone reads 8 (octal)
  EXPECT_EQ(c.train.eval_iters, 8);     // yaml-cpp alone refuses it ("not an integer")
  c = load_config("", {"train.warmup_steps=010", "train.seed=0042", "parallel.stage_layers=[01, 010]"});
  EXPECT_EQ(c.train.warmup_steps, 10);
  EXPECT_EQ(c.train.seed, 42);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int64_t>{1, 10}));
}

TEST(ConfigNumbers, HexOctalAndOtherSpellingsAreRefusedForEveryIntegerKey) {
  const auto keys = keys_of_type<int64_t>();
  ASSERT_GE(keys.size(), 20u);
  for (const auto& key : keys) {
    for (const std::string bad : {"0x10", "0o10", "1e3", "1_000", "+0x1"}) {
      const auto msg = load_error("", {key + "=" + bad});
      EXPECT_THAT(msg, AllOf(HasSubstr(key + " = '" + bad + "' is not an integer"), HasSubstr("Fix:"))) << key << bad;
    }
  }
  EXPECT_THAT(load_error("", {"train.seed=0x10"}), HasSubstr("hexadecimal is not accepted"));
  EXPECT_THAT(load_error("", {"train.seed=99999999999999999999"}), HasSubstr("outside the 64-bit integer range"));
  EXPECT_THAT(load_error("parallel:\n  stage_layers: [1, 0x2]\n"),
              AllOf(HasSubstr("parallel.stage_layers"), HasSubstr("element 1 = '0x2'"), HasSubstr("hexadecimal")));
}

TEST(ConfigNumbers, NonFiniteIsRefusedForEveryFloatKeyWithKeyRuleAndFix) {
  const auto keys = keys_of_type<double>();
  ASSERT_GE(keys.size(), 12u);  // lr, min_lr, weight_decay, adam_*, clip_grad, init_std, timeout_seconds, ...
  for (const auto& key : keys) {
    for (const std::string bad : {".nan", ".NaN", ".inf", "-.inf", "+.Inf", "nan", "inf", "-Infinity", "1e999"}) {
      const auto msg = load_error("", {key + "=" + bad});
      EXPECT_THAT(msg, AllOf(HasSubstr(key + " = '" + bad + "' is not a number"), HasSubstr("finite"),
                             HasSubstr("Fix:")))
          << key << " " << bad;
    }
  }
  // In a file too, with the file named.
  EXPECT_THAT(load_error("train:\n  clip_grad: .nan\n"),
              AllOf(HasSubstr("exp.yaml"), HasSubstr("train.clip_grad = '.nan'"), HasSubstr("NaN and infinity")));
  // Finite spellings still work.
  const Config c = load_config("", {"train.lr=3e-4", "train.clip_grad=.5", "train.min_lr=0", "train.adam_eps=1E-8",
                                    "model.init_std=2.e-2"});
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.train.clip_grad, 0.5);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.02);
}

TEST(ConfigNumbers, ValidateRefusesNonFiniteSetInCode) {
  for (const auto& key : keys_of_type<double>()) {
    Config c;
    c.model.vocab_size = 100;
    for_each_section(c, [&](const char* sec, auto& section) {
      section.visit([&](const char* k, auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, double>) {
          if (std::string(sec) + "." + k == key) field = std::numeric_limits<double>::quiet_NaN();
        }
      });
    });
    try {
      c.validate(1);
      ADD_FAILURE() << key << " = NaN passed validation";
    } catch (const ConfigError& e) {
      EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr(key + " = nan"), HasSubstr("must be a finite number")));
    }
  }
}

TEST(ConfigNumbers, ScalarRules) {
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string why;
  EXPECT_TRUE(parse_integer_text("-007", i, why));
  EXPECT_EQ(i, -7);
  EXPECT_TRUE(parse_integer_text("+12", i, why));
  EXPECT_EQ(i, 12);
  for (const std::string bad : {"", "-", "1.0", "0x1", "0b1", "1 ", " 1", "one", "1e2"}) {
    EXPECT_FALSE(parse_integer_text(bad, i, why)) << bad;
  }
  for (const auto& [text, value] : std::vector<std::pair<std::string, double>>{
           {"1", 1.0}, {"010", 10.0}, {".5", 0.5}, {"5.", 5.0}, {"-2.5E+3", -2500.0}, {"1e-400", 0.0}}) {
    ASSERT_TRUE(parse_number_text(text, d, why)) << text;
    EXPECT_DOUBLE_EQ(d, value) << text;
  }
  for (const std::string bad : {"0x1p3", ".", "e5", "1e", "1.2.3", "nan", ".Inf", "1e309", "--1"}) {
    EXPECT_FALSE(parse_number_text(bad, d, why)) << bad;
  }
  EXPECT_TRUE(parse_boolean_text("TRUE", b, why));
  EXPECT_TRUE(b);
  for (const std::string bad : {"yes", "on", "1", "tru"}) EXPECT_FALSE(parse_boolean_text(bad, b, why)) << bad;
}

TEST(ConfigNumbers, CompressorOptionsUseTheSameRules) {
  EXPECT_EQ(PowerSgdOptions::from_yaml(YAML::Load("{rank: 010}")).rank, 10);
  EXPECT_THAT([] { PowerSgdOptions::from_yaml(YAML::Load("{rank: 0x10}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("powersgd: option 'rank' has a bad value '0x10': not an integer"), HasSubstr("hexadecimal"))));
  EXPECT_THAT([] { PowerSgdOptions::from_yaml(YAML::Load("{min_compression_rate: .inf}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("NaN and infinity are not accepted")));
  EXPECT_THAT([] { TopKOptions::from_yaml(YAML::Load("{fraction: .nan}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("topk: option 'fraction' has a bad value '.nan'")));
  EXPECT_THAT([] { QsgdOptions::from_yaml(YAML::Load("{levels: 0o7}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("octal is not accepted")));
  EXPECT_THAT([] { make_act_codec("lowrank", YAML::Load("{hidden: 64, rank: 0x4}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("lowrank codec: option 'rank' has a bad value '0x4'")));
  EXPECT_THAT([] { make_act_codec("topk", YAML::Load("{fraction: -.inf}")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("topk codec: option 'fraction'")));
  // Through the config: the key of the section is named with the compressor's message.
  Config c = load_config("", {"compression.dp={name: randomk, fraction: .nan}"});
  c.model.vocab_size = 100;
  try {
    c.validate(1);
    ADD_FAILURE() << "randomk fraction .nan accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("compression.dp"), HasSubstr("'fraction' has a bad value '.nan'")));
  }
  // dp_stages: the integer way follows the same rules.
  c = load_config("", {"parallel.pp=2", "model.num_layers=2", "compression.dp_stages=01"});
  EXPECT_EQ(sc_way(c), 1);
  EXPECT_THROW(load_config("", {"compression.dp_stages=0x1"}), ConfigError);
}

}  // namespace
}  // namespace optcc
