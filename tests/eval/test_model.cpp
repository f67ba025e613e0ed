// statepool::eval::Model and Decoder: the committed models load, every kind of damage to
// a model directory is refused with a message that names the file, and the FP32-state
// C++ inference reproduces PyTorch's logits (eval/train.py wrote them).
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include "statepool/eval/model.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace ev = statepool::eval;
namespace kn = statepool::kernels;
namespace fs = std::filesystem;
using statepool::testing::read_bytes;
using statepool::testing::TempDir;
using statepool::testing::write_bytes;

namespace {

const std::string kEval = STATEPOOL_EVAL_DIR;

std::string model_dir(const std::string& arch) {
  return kEval + "/models/" + arch;
}

// The model's evaluation text (its manifest names it; the KJV's John by default).
std::string heldout(const ev::Model& model) {
  return read_bytes(kEval + "/" + model.heldout_text());
}

class ModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelTest, LoadsWithItsConfiguration) {
  const auto model = ev::Model::load(model_dir(GetParam()));
  const ev::ModelConfig& c = model->config();
  EXPECT_EQ(c.arch, GetParam().starts_with("gdn") ? kn::Arch::gdn : kn::Arch::kda);
  EXPECT_EQ(c.vocab, 256u);
  EXPECT_GE(c.layers, 2u);
  EXPECT_GE(c.key_dim, 64u);
  EXPECT_LE(c.key_dim, 128u);
  EXPECT_EQ(model->layers().size(), c.layers);
  EXPECT_NE(model->training().find("heldout_loss"), std::string::npos);
}

// The C++ inference with the state in an fp32 page is the PyTorch model: same logits
// (up to the order of floating-point sums), same most likely byte everywhere.
TEST_P(ModelTest, Fp32StateInferenceMatchesPyTorch) {
  const auto model = ev::Model::load(model_dir(GetParam()));
  const ev::Reference ref = ev::load_reference(*model);
  const std::string text = heldout(*model);
  ASSERT_GE(text.size(), ref.tokens);
  const kn::PageCodec codec(model->layout(kn::CodecSpec{kn::CodecId::fp32}));
  ev::Decoder decoder(model, codec);
  const std::size_t vocab = model->config().vocab;
  double worst = 0;
  std::size_t same_argmax = 0;
  for (std::uint64_t t = 0; t < ref.tokens; ++t) {
    const auto logits = decoder.step(static_cast<std::uint8_t>(text[t]));
    const float* want = ref.logits.data() + t * vocab;
    for (std::size_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(logits[i] - want[i])));
    }
    same_argmax += std::max_element(logits.begin(), logits.end()) - logits.begin() ==
                           std::max_element(want, want + vocab) - want
                       ? 1
                       : 0;
  }
  EXPECT_LT(worst, 2e-3) << "largest logit difference over " << ref.tokens << " tokens";
  EXPECT_EQ(same_argmax, ref.tokens);
  EXPECT_EQ(decoder.rejected_heads(), 0u);
}

// The state really goes through the codec: an int4 page changes the logits, fp32 does not
// drift from a second fp32 decoder, and reset() brings back the zero state.
TEST_P(ModelTest, StateIsStoredThroughTheCodec) {
  const auto model = ev::Model::load(model_dir(GetParam()));
  const kn::PageCodec exact(model->layout(kn::CodecSpec{kn::CodecId::fp32}));
  const kn::PageCodec int4(model->layout(kn::CodecSpec{kn::CodecId::int4}));
  ev::Decoder a(model, exact), b(model, int4);
  const std::string text = heldout(*model);
  double diff = 0;
  for (std::size_t t = 0; t < 64; ++t) {
    const auto la = a.step(static_cast<std::uint8_t>(text[t]));
    const std::vector<float> copy(la.begin(), la.end());
    const auto lb = b.step(static_cast<std::uint8_t>(text[t]));
    for (std::size_t i = 0; i < copy.size(); ++i) diff += std::fabs(copy[i] - lb[i]);
  }
  EXPECT_GT(diff, 0.0);
  std::vector<float> state(a.state_values());
  a.state(state);
  EXPECT_TRUE(std::any_of(state.begin(), state.end(), [](float v) { return v != 0.0f; }));
  a.reset();
  a.state(state);
  EXPECT_TRUE(std::all_of(state.begin(), state.end(), [](float v) { return v == 0.0f; }));
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTest,
                         ::testing::Values("gdn", "kda", "gdn-long", "kda-long", "gdn-fast",
                                           "gdn-fortunes"));

// --- validation: a copy of the GDN model, damaged one way at a time ---------------------

class DamagedModel : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(model_dir("gdn"), dir_.path(),
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }
  void edit_manifest(const std::function<void(boost::json::object&)>& edit) {
    boost::json::value v = boost::json::parse(read_bytes(file("manifest.json")));
    edit(v.as_object());
    write_bytes(file("manifest.json"), boost::json::serialize(v));
  }
  /// The ModelError message of loading the copy ("" if it loads).
  std::string load_error() const {
    try {
      (void)ev::Model::load(dir_.path());
    } catch (const ev::ModelError& e) {
      return e.what();
    }
    return "";
  }
  TempDir dir_{(fs::temp_directory_path() / "statepool-eval-model").string()};
};

TEST_F(DamagedModel, UndamagedCopyLoads) {
  EXPECT_EQ(load_error(), "");
}

TEST_F(DamagedModel, FlippedByteFailsTheChecksum) {
  std::string bytes = read_bytes(file("layers.1.q.npy"));
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  write_bytes(file("layers.1.q.npy"), bytes);
  const std::string e = load_error();
  EXPECT_NE(e.find("layers.1.q.npy: CRC-32 is"), std::string::npos) << e;
}

TEST_F(DamagedModel, MissingFile) {
  fs::remove(file("layers.0.v.npy"));
  const std::string e = load_error();
  EXPECT_NE(e.find("layers.0.v.npy"), std::string::npos) << e;
}

TEST_F(DamagedModel, MissingManifestSaysWhatADirectoryNeeds) {
  fs::remove(file("manifest.json"));
  const std::string e = load_error();
  EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
  EXPECT_NE(e.find("eval/train.py"), std::string::npos) << e;
}

TEST_F(DamagedModel, ManifestThatIsNotJson) {
  write_bytes(file("manifest.json"), "{\"format\": ");
  EXPECT_NE(load_error().find("not valid JSON"), std::string::npos) << load_error();
}

TEST_F(DamagedModel, WrongFormat) {
  edit_manifest([](auto& m) { m["format"] = "statepool-eval-model-0"; });
  EXPECT_NE(load_error().find("this build reads \"statepool-eval-model-1\""), std::string::npos)
      << load_error();
}

TEST_F(DamagedModel, ShapeThatTheConfigurationDoesNotImply) {
  edit_manifest([](auto& m) { m["heads"] = 2; });
  EXPECT_NE(load_error().find("this configuration needs"), std::string::npos) << load_error();
}

TEST_F(DamagedModel, WrongDtype) {
  edit_manifest(
      [](auto& m) { m["tensors"].as_object()["embed"].as_object()["dtype"] = "float16"; });
  EXPECT_NE(load_error().find("tensor \"embed\": dtype is \"float16\""), std::string::npos)
      << load_error();
}

TEST_F(DamagedModel, MissingAndUnknownTensors) {
  edit_manifest([](auto& m) { m["tensors"].as_object().erase("final_norm"); });
  EXPECT_NE(load_error().find("tensor \"final_norm\" is missing"), std::string::npos)
      << load_error();
  SetUp();
  edit_manifest([](auto& m) {
    m["tensors"].as_object()["layers.9.q"] = m["tensors"].as_object()["layers.0.q"];
  });
  EXPECT_NE(load_error().find("lists tensor \"layers.9.q\""), std::string::npos) << load_error();
}

TEST_F(DamagedModel, FileSwappedForAnotherOfTheSameSizeFailsTheChecksum) {
  fs::copy_file(file("layers.0.k.npy"), file("layers.0.q.npy"),
                fs::copy_options::overwrite_existing);
  EXPECT_NE(load_error().find("layers.0.q.npy: CRC-32"), std::string::npos) << load_error();
}

TEST_F(DamagedModel, PathOutsideTheDirectoryIsRefused) {
  edit_manifest(
      [](auto& m) { m["tensors"].as_object()["embed"].as_object()["file"] = "../gdn/embed.npy"; });
  EXPECT_NE(load_error().find("must be a plain file name"), std::string::npos) << load_error();
}

TEST_F(DamagedModel, TextsOutsideTheDataFolderAreRefused) {
  edit_manifest([](auto& m) { m["calibration_text"] = "data/../../README.md"; });
  EXPECT_NE(load_error().find("\"calibration_text\" must name a file in eval/data/"),
            std::string::npos)
      << load_error();
  SetUp();
  edit_manifest([](auto& m) { m["reference"].as_object()["text"] = "/etc/passwd"; });
  EXPECT_NE(load_error().find("reference: \"text\" must name a file in eval/data/"),
            std::string::npos)
      << load_error();
  SetUp();
  edit_manifest([](auto& m) { m["calibration_text"] = "data/fortunes-calibration.txt"; });
  ASSERT_EQ(load_error(), "");
  EXPECT_EQ(ev::Model::load(dir_.path())->calibration_text(), "data/fortunes-calibration.txt");
  EXPECT_EQ(ev::Model::load(dir_.path())->heldout_text(), "data/heldout.txt");
}

TEST_F(DamagedModel, BadConfigurationValues) {
  edit_manifest([](auto& m) { m["arch"] = "mamba"; });
  EXPECT_NE(load_error().find("\"arch\" must be \"gdn\" or \"kda\""), std::string::npos)
      << load_error();
  SetUp();
  edit_manifest([](auto& m) { m["vocab"] = 50000; });
  EXPECT_NE(load_error().find("\"vocab\" must be an integer between 256 and 256"),
            std::string::npos)
      << load_error();
  SetUp();
  edit_manifest([](auto& m) { m["extra"] = 1; });
  EXPECT_NE(load_error().find("unknown key \"extra\""), std::string::npos) << load_error();
}

}  // namespace
