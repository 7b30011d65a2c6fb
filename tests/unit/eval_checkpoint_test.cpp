// optcc eval (harness/checkpoints/eval_checkpoint.h): a TP2 x PP2 x DP2 run's checkpoint evaluated on one
// process gives the run's last validation loss (to 1e-5), and so does every other eval layout; the
// last-word accuracy of a hand-made "copy the current token" model on hand-made documents is the
// known 3 of 6 on every layout; bad inputs are refused with the key and the fix. Ranks as threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "harness/parallel/distributed.h"
#include "harness/records/checkpoint.h"
#include "harness/records/results_reader.h"
#include "harness/checkpoints/eval_checkpoint.h"
#include "harness/train/optimizer.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr double kLossTol = 1e-5;  // parity bar across a save and load; measured differences are printed

// A SentencePiece-style .vocab for ids [0, vocab): <unk>, </s>, then words "▁wN" (even N) and
// continuation pieces "pN" (odd N).
void write_vocab(const std::string& prefix, int64_t vocab) {
  std::ofstream out(prefix + ".vocab");
  out << "<unk>\t0\n</s>\t0\n";
  for (int64_t i = 2; i < vocab; ++i) out << (i % 2 == 0 ? fmt::format("\u2581w{}", i) : fmt::format("p{}", i)) << "\t-1\n";
}

Config run_config(const testing::TempDir& dir) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "85,15,0";
  c.log.dir = dir / "results";
  c.log.run_name = "tp2pp2dp2";
  c.checkpoint.dir = dir / "ckpt";
  c.checkpoint.save_final = true;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_size = 64;
  c.model.vocab_divisor = 24;  // padded 72 on one TP rank, 96 on two: the merge must fit the rows
  // No dropout: ranks as threads share LibTorch's one default generator, so the TP ranks of a stage
  // would draw different hidden-dropout masks (separate processes seeded alike draw the same), train
  // different copies of the replicated LayerNorms, and the merged model (TP rank 0's copies) would
  // not be the model training evaluated (merge_checkpoint's max_tp_copy_difference shows it).
  c.model.hidden_dropout = 0.0;
  c.parallel.tp = 2, c.parallel.pp = 2, c.parallel.dp = 2;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;
  c.train.train_steps = 4;
  c.train.warmup_steps = 1;
  c.train.eval_interval = 2;
  c.train.eval_iters = 3;
  c.train.lr = 3e-3;
  c.train.threads = 1;
  return c;
}

EvalResult eval_on(ParallelDims dims, const EvalOptions& o) {
  std::vector<EvalResult> out(dims.world());
  testing::run_layout(dims, [&](int rank, Distributed& d) { out[rank] = run_eval(o, d); });
  for (const auto& r : out) EXPECT_EQ(r.loss, out[0].loss) << "every rank knows the same loss";
  return out[0];
}

TEST(EvalCheckpoint, Tp2Pp2Dp2CheckpointOnOneProcessGivesTheRunsLastValidationLoss) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  write_vocab(dir / "corpus", 64);
  const Config cfg = run_config(dir);
  TrainOptions topt;
  topt.quiet = true;
  std::vector<TrainSummary> runs(8);
  testing::run_layout({2, 2, 2}, [&](int rank, Distributed& d) { runs[rank] = run_training(cfg, topt, d); });
  ASSERT_EQ(runs[0].eval_losses.size(), 3u);  // steps 0, 2, 4
  const double trained = runs[0].eval_losses.back();

  EvalOptions o;
  o.checkpoint = dir / "ckpt";
  o.documents = 1000;  // more than the split holds: every document
  o.quiet = true;
  const EvalResult one = eval_on({1, 1, 1}, o);
  std::printf("training's last validation loss %.8f, eval on one process %.8f, difference %.3g\n", trained, one.loss,
              one.loss - trained);
  EXPECT_EQ(one.step, 4);
  EXPECT_NEAR(one.loss, trained, kLossTol);
  EXPECT_NE(one.loss, runs[0].eval_losses.front());  // not the untrained model's
  ASSERT_TRUE(one.training_loss.has_value());
  EXPECT_EQ(*one.training_loss, trained);  // read back from the run's own results file
  EXPECT_EQ(one.training_results, dir / "results/tp2pp2dp2.h5");
  EXPECT_EQ(one.samples, 3 * 2 * 2);       // eval_iters * micro_batch_size * training dp
  EXPECT_EQ(one.max_replica_difference, 0.0);
  EXPECT_EQ(one.max_tied_difference, 0.0);
  EXPECT_EQ(one.max_tp_copy_difference, 0.0);
  EXPECT_EQ(one.trained_layout, "tp=2 pp=2 dp=2");
  EXPECT_EQ(one.eval_layout, "tp=1 pp=1 dp=1");
  EXPECT_GT(one.lastword_documents, 20);  // 45 validation documents, some without context
  EXPECT_EQ(one.lastword_documents + one.lastword_skipped, 45);
  EXPECT_TRUE(one.note.empty());

  // The results file: a new one next to the run's, one row.
  EXPECT_EQ(one.results_path, dir / "results/tp2pp2dp2.eval-4.h5");
  const TableData t = read_results_table(one.results_path, "eval_checkpoint");
  ASSERT_EQ(t.rows, 1u);
  EXPECT_EQ(t.double_column("loss")[0], one.loss);
  EXPECT_EQ(t.int_column("lastword_correct")[0], one.lastword_correct);
  EXPECT_EQ(t.double_column("training_loss")[0], trained);
  EXPECT_EQ(read_root_attribute(one.results_path, "kind"), "eval_checkpoint");
  EXPECT_EQ(read_root_attribute(one.results_path, "eval_layout"), "tp=1 pp=1 dp=1");

  // Re-sharded into other layouts: the same loss and the same last-word answers.
  for (const auto& [layout, dims] : std::vector<std::pair<std::string, ParallelDims>>{{"2,1,2", {2, 1, 2}},
                                                                                      {"1,2,1", {1, 2, 1}}}) {
    SCOPED_TRACE(layout);
    EvalOptions other = o;
    other.layout = layout;
    const EvalResult r = eval_on(dims, other);
    std::printf("eval on %s: %.8f, difference to one process %.3g\n", layout.c_str(), r.loss, r.loss - one.loss);
    EXPECT_NEAR(r.loss, one.loss, kLossTol);
    EXPECT_EQ(r.lastword_correct, one.lastword_correct);
    EXPECT_EQ(r.lastword_documents, one.lastword_documents);
  }
  // Every later eval of the same checkpoint writes a file of its own.
  EXPECT_TRUE(std::filesystem::exists(dir / "results/tp2pp2dp2.eval-4.attempt-3.h5"));

  // Other samples than the run's evaluations: not compared with them, and said why.
  EvalOptions fewer = o;
  fewer.overrides = {"train.eval_iters=2"};
  fewer.documents = 0;
  const EvalResult r = eval_on({1, 1, 1}, fewer);
  EXPECT_EQ(r.samples, 2 * 2 * 2);
  EXPECT_FALSE(r.training_loss.has_value());
  EXPECT_THAT(r.not_comparable, HasSubstr("train.eval_iters"));
  EXPECT_THAT(eval_report(r), HasSubstr("not compared (train.eval_iters"));
  EXPECT_TRUE(one.not_comparable.empty());
}

// ---- a hand-made model with a known answer --------------------------------------------------------

// Pieces: 0 <unk>, 1 </s>, 2 ▁a, 3 ▁b, 4 ▁c, 5 d (continuation), 6 ".", 7-15 ▁x7..▁x15.
void write_copy_data(const testing::TempDir& dir) {
  data::IndexedDatasetBuilder b(dir / "docs", data::DType::kUInt16);
  // The copy model predicts next = current. Right: A, C, H; wrong: B, D, E; skipped: F, G.
  for (const std::vector<int64_t>& doc : std::vector<std::vector<int64_t>>{
           {2, 3, 3, 1},     // A: "▁a ▁b | ▁b": after ▁b comes ▁b: right
           {2, 3, 4, 1},     // B: target ▁c after ▁b: wrong
           {2, 4, 4, 6, 1},  // C: "." and EOD dropped, target ▁c after ▁c: right
           {3, 4, 5, 1},     // D: target "▁c d" after ▁b: wrong at once
           {4, 4, 5, 1},     // E: target "▁c d" after ▁c: ▁c right, then ▁c for d: wrong
           {2, 1},           // F: the word has no context: skipped
           {6, 1},           // G: no word: skipped
           {5, 2, 2, 1}}) {  // H: target ▁a after ▁a: right
    b.add_sequence(doc);
    b.end_document();
  }
  b.finalize();
  std::ofstream(dir / "docs.json") << "{\"vocab_size\": 16, \"eod_id\": 1}\n";
  std::ofstream v(dir / "docs.vocab");
  v << "<unk>\t0\n</s>\t0\n\u2581a\t-1\n\u2581b\t-1\n\u2581c\t-1\nd\t-1\n.\t-1\n";
  for (int i = 7; i < 16; ++i) v << "\u2581x" << i << "\t-1\n";
}

Config copy_config(const testing::TempDir& dir) {
  Config c;
  c.data.prefix = dir / "docs";
  c.data.dir = dir / "data";
  c.data.split = "0,100,0";  // every document held out
  c.log.dir = dir / "results";
  c.log.run_name = "copy";
  c.model.num_layers = 2;
  c.model.hidden_size = 16;
  c.model.num_heads = 2;
  c.model.seq_len = 8;
  c.model.vocab_size = 16;
  c.model.vocab_divisor = 16;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 2;
  c.train.eval_iters = 2;
  c.train.threads = 1;
  return c;
}

// Blocks that add nothing (every linear weight zero), no position embedding, word embedding E = I:
// logits_j = LayerNorm(e_t) . e_j, largest at j = t: the model predicts the current token again.
void write_copy_checkpoint(const testing::TempDir& dir) {
  const Config c = copy_config(dir);
  GptModel model(gpt_options(c));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      if (p.key().find("ln") != std::string::npos && p.key().find("weight") != std::string::npos) {
        p.value().fill_(1.0);
      } else {
        p.value().zero_();
      }
    }
    model->embedding->weight.narrow(0, 0, 16).copy_(torch::eye(16));
  }
  auto opt = make_adamw(*model, c.train);
  save_checkpoint(dir / "ckpt", TrainState{3, 6}, *model, *opt, {1, 1, 1, 0}, to_yaml(c), 0);
}

TEST(EvalCheckpoint, LastWordAccuracyOfACopyModelIsTheKnownAnswerOnEveryLayout) {
  testing::TempDir dir;
  write_copy_data(dir);
  write_copy_checkpoint(dir);
  EvalOptions o;
  o.checkpoint = dir / "ckpt";
  o.quiet = true;
  for (const auto& [layout, dims] : std::vector<std::pair<std::string, ParallelDims>>{
           {"", {1, 1, 1}}, {"2,2,1", {2, 2, 1}}, {"1,1,2", {1, 1, 2}}}) {
    SCOPED_TRACE(layout);
    EvalOptions on = o;
    on.layout = layout;
    const EvalResult r = eval_on(dims, on);
    EXPECT_EQ(r.step, 3);
    EXPECT_EQ(r.lastword_documents, 6);
    EXPECT_EQ(r.lastword_skipped, 2);
    EXPECT_EQ(r.lastword_correct, 3);
    EXPECT_DOUBLE_EQ(r.lastword_accuracy, 0.5);
  }
  // --documents limits the items: the first two (A right, B wrong).
  o.documents = 2;
  const EvalResult two = eval_on({1, 1, 1}, o);
  EXPECT_EQ(two.lastword_documents, 2);
  EXPECT_EQ(two.lastword_correct, 1);
}

TEST(EvalCheckpoint, BadInputsAreRefusedWithTheFix) {
  testing::TempDir dir;
  write_copy_data(dir);
  EvalOptions o;
  o.quiet = true;
  o.checkpoint = dir / "ckpt";
  auto eval_one = [&](const EvalOptions& opts) { eval_on({1, 1, 1}, opts); };
  EXPECT_THAT([&] { eval_one(o); }, ThrowsMessage<std::runtime_error>(HasSubstr("no checkpoint at")));

  write_copy_checkpoint(dir);
  const Config trained = copy_config(dir);
  EvalOptions test_split = o;
  test_split.split = "test";
  EXPECT_THAT([&] { eval_one(test_split); },
              ThrowsMessage<std::runtime_error>(AllOf(HasSubstr("data.split = \"0,100,0\""), HasSubstr("--set data.split="))));

  EvalOptions layout = o;
  layout.layout = "3,1,1";  // 2 heads do not split over 3 TP ranks
  EXPECT_THAT([&] { eval_config(trained, layout, 3); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("model.num_heads"), HasSubstr("parallel.tp"))));
  layout.layout = "1,3,1";  // 2 layers do not split over 3 stages
  EXPECT_THAT([&] { eval_config(trained, layout, 3); }, ThrowsMessage<ConfigError>(HasSubstr("parallel.pp = 3")));
  layout.layout = "2,1,1";  // two ranks' layout on one process
  EXPECT_THAT([&] { eval_one(layout); }, ThrowsMessage<ConfigError>(HasSubstr("must equal the number of ranks, 1")));
  layout.layout = "2x1x1";
  EXPECT_THAT([&] { eval_config(trained, layout, 2); }, ThrowsMessage<ConfigError>(HasSubstr("tp,pp,dp")));

  EvalOptions model_key = o;
  model_key.overrides = {"model.hidden_size=32"};
  EXPECT_THAT([&] { eval_config(trained, model_key, 1); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("'model.hidden_size' cannot be changed"), HasSubstr("train.eval_iters"))));
  EvalOptions split = o;
  split.split = "train";
  EXPECT_THAT([&] { eval_config(trained, split, 1); }, ThrowsMessage<ConfigError>(HasSubstr("valid or test")));

  std::filesystem::remove(dir / "docs.vocab");
  EXPECT_THAT([&] { eval_one(o); },
              ThrowsMessage<std::runtime_error>(AllOf(HasSubstr("docs.vocab does not exist"), HasSubstr("--documents 0"))));
  EvalOptions no_words = o;
  no_words.documents = 0;
  no_words.output = dir / "out.h5";
  const EvalResult r = eval_on({1, 1, 1}, no_words);
  EXPECT_EQ(r.lastword_documents, 0);
  EXPECT_TRUE(std::isnan(r.lastword_accuracy));
  EXPECT_EQ(r.results_path, dir / "out.h5");
  EXPECT_THAT([&] { eval_one(no_words); }, ThrowsMessage<std::runtime_error>(HasSubstr("the file exists")));
}

}  // namespace
}  // namespace optcc
