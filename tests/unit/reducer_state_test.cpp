// Compressor state belongs to named tensors (DP reducers): state saved for one tensor list is refused
// by a reducer declared for another, naming the first difference, and tensor lists round-trip through
// an archive. The reducers' arithmetic is tested in grad_reducer_test.cpp (same executable).
#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "compression/grad_reducer.h"
#include "compression/state_manifest.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/reducer_support.h"

namespace optcc {
namespace {

using testing::clone_all;
using testing::make_grads;
using testing::RankContext;
using testing::run_ranks;

std::vector<TensorSpec> specs_of(const std::vector<std::string>& names, const std::vector<torch::Tensor>& ts) {
  std::vector<TensorSpec> out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back({names[i], ts[i].sizes().vec()});
  return out;
}

// Every stateful reducer: state saved for (w1, b, t, w2) is refused by a reducer declared for
// another list (a tensor left out, or renamed), naming the first difference; an undeclared one
// takes the saved list and refuses a reduce() over other tensors without touching its state.
TEST(ReducerState, SavedForOtherTensorsIsRefusedNamingTheFirstDifference) {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  const std::vector<std::string> names{"w1", "b", "t", "w2"};
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (const std::string kind : {"powersgd", "topk", "randomk", "qsgd", "signsgd"}) {
      SCOPED_TRACE(kind);
      const YAML::Node o = YAML::Load(kind == "qsgd" ? "{error_feedback: true}" : "{}");
      auto fresh = [&](std::optional<std::vector<TensorSpec>> declared) {
        auto r = reg.create(kind, o);
        if (declared) r->set_tensors(*declared);
        return r;
      };
      const auto g0 = make_grads(ctx.rank, 0);
      auto a = fresh(specs_of(names, g0));
      for (int64_t step = 0; step < 2; ++step) {
        auto g = make_grads(ctx.rank, step);
        a->reduce(g, *comm, step);
      }
      std::stringstream blob;
      {
        torch::serialize::OutputArchive out;
        a->save(out);
        out.save_to(blob);
      }
      auto load_into = [&](GradReducer& r) {
        blob.clear();
        blob.seekg(0);
        torch::serialize::InputArchive in;
        in.load_from(blob);
        r.load(in);
      };
      auto expect_refused = [&](GradReducer& r, const std::string& what) {
        try {
          load_into(r);
          ADD_FAILURE() << "loaded state of other tensors";
        } catch (const StateMismatch& e) {
          EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
      };
      auto dropped = fresh(std::vector<TensorSpec>{{"w1", {32, 16}}, {"t", {8, 4, 3}}, {"w2", {64, 48}}});
      expect_refused(*dropped, "tensor 1: 'b' [16] in the checkpoint, 't' [8, 4, 3] in this run");
      auto renamed = fresh(specs_of({"x1", "b", "t", "w2"}, g0));
      expect_refused(*renamed, "tensor 0: 'w1' [32, 16] in the checkpoint, 'x1' [32, 16] in this run");
      auto same = fresh(specs_of(names, g0));
      EXPECT_NO_THROW(load_into(*same));
      // Undeclared: the saved list binds; other tensors are refused, then the right ones continue
      // exactly as the saving reducer does (state untouched by the refused call).
      auto undeclared = fresh(std::nullopt);
      load_into(*undeclared);
      std::vector<torch::Tensor> wrong{g0[0].clone(), g0[2].clone(), g0[3].clone()};
      try {
        undeclared->reduce(wrong, *comm, 2);
        ADD_FAILURE() << "reduced other tensors";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("tensor 1: 'b' [16] in the state's list, [8, 4, 3] in this call"),
                  std::string::npos)
            << e.what();
      }
      auto ga = make_grads(ctx.rank, 2), gb = clone_all(ga);
      a->reduce(ga, *comm, 2);
      undeclared->reduce(gb, *comm, 2);
      for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(torch::equal(ga[i], gb[i])) << "tensor " << i;
    }
  });
}

TEST(ReducerState, TensorListsRoundTripThroughAnArchive) {
  const std::vector<TensorSpec> specs{{"embedding.weight", {64, 32}}, {"b", {}}, {"blocks.0.ln1.weight", {32}}};
  torch::serialize::OutputArchive out;
  write_tensor_specs(out, "x", specs);
  write_tensor_specs(out, "empty", {});
  std::stringstream blob;
  out.save_to(blob);
  torch::serialize::InputArchive in;
  in.load_from(blob);
  EXPECT_EQ(read_tensor_specs(in, "x"), std::optional<std::vector<TensorSpec>>(specs));
  EXPECT_EQ(read_tensor_specs(in, "empty"), std::optional<std::vector<TensorSpec>>(std::vector<TensorSpec>{}));
  EXPECT_EQ(read_tensor_specs(in, "missing"), std::nullopt);
  EXPECT_EQ(first_difference(specs, specs), "");
  EXPECT_EQ(first_difference(specs, {specs[0]}), "tensor 1: 'b' [] in the checkpoint, none (1 tensors) in this run");
}

}  // namespace
}  // namespace optcc
