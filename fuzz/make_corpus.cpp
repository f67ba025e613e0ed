// Writes the fuzzers' seed corpora, built with the project's own encoders (the generated
// FlatBuffers builders, protocol::to_wire, protocol::make_frame, the plan file writer and
// PageCodec::encode), so that the seeds follow the schema and the page format as they
// change and nothing binary is committed.
//
// Usage: statepool_fuzz_make_corpus OUT_DIR MODEL_CONFIG_JSON
//   OUT_DIR/frame/        one session per request type, ending in a request of that type
//                         (Hello and whatever it needs first), the whole session, and each
//                         request type alone as the first frame (refused: not_hello)
//   OUT_DIR/page_decode/  a page encoded by PageCodec for every codec, arch and staged
//                         dtype, behind its parameter bytes (page_input.hpp)
//   OUT_DIR/shared_memory/ the same parameters with a KV stream and values to encode
//                         (fuzz_shared_memory.cpp)
// Seeds are rewritten, never appended to: the same build writes the same bytes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "page_input.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/protocol/messages.hpp"

namespace {

namespace fs = std::filesystem;
namespace kernels = statepool::kernels;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using Bytes = std::vector<std::uint8_t>;

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// One request as a whole frame, from a function that builds its body.
template <class Request, class Build>
Bytes frame(std::uint64_t id, Build&& build) {
  flatbuffers::FlatBufferBuilder b;
  const flatbuffers::Offset<Request> body = build(b);
  b.Finish(wire::CreateRequest(b, id, protocol::kRequestType<Request>, body.Union()));
  const std::string f = protocol::make_frame(protocol::FrameType::request, protocol::kFlagNone,
                                             {b.GetBufferPointer(), b.GetSize()});
  return {f.begin(), f.end()};
}

kernels::StateLayout int8_layout() {
  kernels::StateLayout l;
  l.name = "fuzz-int8";
  l.arch = kernels::Arch::gdn;
  l.num_layers = 2;
  l.num_heads = 2;
  l.key_dim = 16;
  l.value_dim = 16;
  l.conv_channels = 8;
  l.conv_width = 3;
  l.conv_dtype = kernels::DType::bf16;
  l.codec.id = kernels::CodecId::int8;
  l.codec.group_size = 64;
  return l;
}

kernels::stepquant::Plan small_plan() {
  kernels::stepquant::Plan p;
  p.arch = kernels::Arch::gdn;
  p.num_layers = 1;
  p.num_heads = 2;
  p.key_dim = 16;
  p.value_dim = 16;
  p.budget_bits = 6;
  p.widths = {6, kernels::stepquant::kPivotWidth};
  p.impact.assign(32, 1.0f);
  p.source = "fuzz seed";
  return p;
}

/// Named request frames of one session, in the order a client would send them; the ids
/// the daemon hands out are predictable (layouts and arenas from 1, slots from 0, staging
/// buffers from 1).
struct Step {
  std::string name;  ///< protocol::request_name of its type (seeds are named after it)
  Bytes bytes;
};

std::vector<Step> session_steps(const std::string& model_config) {
  const kernels::StateLayout layout = int8_layout();
  const kernels::PageCodec codec(layout);
  const std::uint64_t state = codec.staged_bytes(kernels::DType::f32);
  const kernels::stepquant::Plan plan = small_plan();
  const std::vector<std::byte> plan_bytes = kernels::stepquant::to_bytes(plan);
  const std::string digest = kernels::stepquant::digest(plan);
  kernels::StateLayout sq;
  sq.name = "fuzz-stepquant6";
  sq.num_layers = plan.num_layers;
  sq.num_heads = plan.num_heads;
  sq.key_dim = plan.key_dim;
  sq.value_dim = plan.value_dim;
  sq.codec.id = kernels::CodecId::stepquant6;

  std::vector<Step> steps;
  std::uint64_t id = 1;
  const auto add = [&](Bytes bytes) {
    const auto* request =
        flatbuffers::GetRoot<wire::Request>(bytes.data() + protocol::kHeaderBytes);
    steps.push_back({protocol::request_name(request->body_type()), std::move(bytes)});
    ++id;
  };
  add(frame<wire::Hello>(id, [](auto& b) {
    return wire::CreateHelloDirect(b, protocol::kMinProtocolVersion, protocol::kMaxProtocolVersion,
                                   "", "", "fuzz-seed");
  }));
  add(frame<wire::InstallPlan>(id, [&](auto& b) {
    return wire::CreateInstallPlan(
        b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(plan_bytes.data()),
                          plan_bytes.size()));
  }));
  add(frame<wire::RegisterLayout>(id, [&](auto& b) {
    return wire::CreateRegisterLayout(b, protocol::to_wire(b, layout, ""));
  }));
  add(frame<wire::RegisterLayout>(id, [&](auto& b) {
    return wire::CreateRegisterLayout(b, protocol::to_wire(b, sq, digest));
  }));
  add(frame<wire::OpenArena>(id, [](auto& b) { return wire::CreateOpenArena(b, 1, 4); }));
  add(frame<wire::OpenArena>(id, [](auto& b) { return wire::CreateOpenArena(b, 2, 2); }));
  add(frame<wire::Allocate>(id, [](auto& b) { return wire::CreateAllocate(b, 1, 2); }));
  add(frame<wire::Allocate>(id, [](auto& b) { return wire::CreateAllocate(b, 2, 1); }));
  add(frame<wire::OpenStaging>(id, [&](auto& b) { return wire::CreateOpenStaging(b, 2 * state); }));
  add(frame<wire::Compress>(
      id, [](auto& b) { return wire::CreateCompress(b, 1, 0, 1, 0, wire::DType::f32); }));
  add(frame<wire::Decompress>(
      id, [&](auto& b) { return wire::CreateDecompress(b, 1, 0, 1, state, wire::DType::f32); }));
  add(frame<wire::Compress>(
      id, [](auto& b) { return wire::CreateCompress(b, 2, 0, 1, 0, wire::DType::bf16); }));
  add(frame<wire::Decompress>(
      id, [](auto& b) { return wire::CreateDecompress(b, 2, 0, 1, 0, wire::DType::bf16); }));
  add(frame<wire::Copy>(id, [](auto& b) { return wire::CreateCopy(b, 1, 0, 1); }));
  const auto key = [](auto& b) {
    const std::string prefix = "seed/system-prompt";
    return wire::CreateSnapshotKey(
        b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(prefix.data()), prefix.size()),
        128);
  };
  add(frame<wire::PutSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreatePutSnapshot(b, 1, 0, k);
  }));
  add(frame<wire::GetSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreateGetSnapshot(b, 1, 1, k);
  }));
  add(frame<wire::PinSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreatePinSnapshot(b, k, true);
  }));
  add(frame<wire::ListSnapshots>(id, [](auto& b) {
    const std::string start = "seed/";
    return wire::CreateListSnapshots(
        b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(start.data()), start.size()), 10);
  }));
  add(frame<wire::CloseArena>(id, [](auto& b) { return wire::CreateCloseArena(b, 1); }));
  add(frame<wire::DeleteSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreateDeleteSnapshot(b, k);
  }));
  // A hybrid entry: KV blocks read from the decompressed state's values (finite f32),
  // decoded on a hit into the staging buffer's start as f16.
  add(frame<wire::PutSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    const auto kv = wire::CreateKvBlocks(b, wire::KvCodec::kivi2, 1, 32, 32, 8);
    const auto where = wire::CreateKvStaging(b, 1, state, wire::DType::f32);
    return wire::CreatePutSnapshot(b, 1, 0, k, kv, where);
  }));
  add(frame<wire::GetSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    const auto where = wire::CreateKvStaging(b, 1, 0, wire::DType::f16);
    return wire::CreateGetSnapshot(b, 1, 1, k, where);
  }));
  // The entry out as one value (the size, then into the staging buffer) and back in (a
  // range longer than the value: refused as trailing bytes).
  add(frame<wire::ExportSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreateExportSnapshot(b, k, 0, 0, 0);
  }));
  add(frame<wire::ExportSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreateExportSnapshot(b, k, 0, 1, 0);
  }));
  add(frame<wire::ImportSnapshot>(
      id, [](auto& b) { return wire::CreateImportSnapshot(b, 1, 0, 4096); }));
  add(frame<wire::DeleteSnapshot>(id, [&](auto& b) {
    const auto k = key(b);
    return wire::CreateDeleteSnapshot(b, k);
  }));
  add(frame<wire::FitsNow>(id, [](auto& b) {
    const std::vector<wire::CodecId> codecs = {wire::CodecId::int8, wire::CodecId::fp32,
                                               wire::CodecId::stepquant6};
    return wire::CreateFitsNow(b, 1, 2, b.CreateVector(codecs));
  }));
  add(frame<wire::PlanCapacity>(id, [&](auto& b) {
    const std::vector<wire::CodecId> codecs = {wire::CodecId::int6, wire::CodecId::stepquant6};
    return wire::CreatePlanCapacityDirect(b, model_config.c_str(), 8, "fp8", &codecs, 2, 4096,
                                          80ull << 30, 0.2, 1, 8);
  }));
  add(frame<wire::Stats>(id, [](auto& b) { return wire::CreateStats(b); }));
  add(frame<wire::Ping>(id, [](auto& b) { return wire::CreatePing(b); }));
  add(frame<wire::Free>(id, [](auto& b) {
    const std::vector<std::uint32_t> slots = {0, 1};
    return wire::CreateFreeDirect(b, 1, &slots);
  }));
  // Protocol version 2: batches over the staging buffer (packed and value-major states, KV
  // rows by stride), a lookup with a second pool's keys, and RegisterMemory (its descriptor
  // cannot travel in a seed: refused).
  const auto keys = [&](auto& b, int n) {
    std::vector<flatbuffers::Offset<wire::SnapshotKey>> out;
    for (int i = 0; i < n; ++i) {
      const std::string prefix = "seed/page-" + std::to_string(i);
      out.push_back(wire::CreateSnapshotKey(
          b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(prefix.data()), prefix.size()),
          static_cast<std::uint64_t>(64 * (i + 1))));
    }
    return out;
  };
  add(frame<wire::PutSnapshots>(id, [&](auto& b) {
    const auto k = keys(b, 3);
    std::vector<flatbuffers::Offset<wire::SnapshotPutEntry>> entries;
    entries.push_back(wire::CreateSnapshotPutEntry(
        b, k[0], wire::CreateStateRange(b, 1, 0, wire::DType::f32, false, 0, 0)));
    entries.push_back(wire::CreateSnapshotPutEntry(
        b, k[1], wire::CreateStateRange(b, 1, 0, wire::DType::f32, true, 1, state / 2)));
    const auto kv = wire::CreateKvBlocks(b, wire::KvCodec::bf16, 2, 16, 16, 4);
    const auto rows =
        wire::CreateKvRange(b, 1, wire::DType::f32, 0, 0, 4 * 16 * 2 * 4, 16 * 4, 2 * 16 * 4);
    entries.push_back(wire::CreateSnapshotPutEntry(b, k[2], 0, 0, kv, rows));
    return wire::CreatePutSnapshots(b, 1, b.CreateVector(entries));
  }));
  add(frame<wire::LookupSnapshots>(id, [&](auto& b) {
    const auto k = keys(b, 3);
    const auto other = keys(b, 2);
    const std::vector<flatbuffers::Offset<wire::LookupAlso>> also = {
        wire::CreateLookupAlso(b, 2, b.CreateVector(other))};
    return wire::CreateLookupSnapshots(b, 1, b.CreateVector(k), true, true, b.CreateVector(also));
  }));
  add(frame<wire::GetSnapshots>(id, [&](auto& b) {
    const auto k = keys(b, 3);
    std::vector<flatbuffers::Offset<wire::SnapshotGetEntry>> entries;
    entries.push_back(wire::CreateSnapshotGetEntry(
        b, k[0], wire::CreateStateRange(b, 1, state, wire::DType::bf16, true, 0, 0)));
    entries.push_back(wire::CreateSnapshotGetEntry(
        b, k[2], 0, wire::CreateKvRange(b, 1, wire::DType::f16, state)));
    return wire::CreateGetSnapshots(b, 1, b.CreateVector(entries), true);
  }));
  add(frame<wire::RegisterMemory>(
      id, [](auto& b) { return wire::CreateRegisterMemoryDirect(b, 1 << 20, "fuzz-seed"); }));
  add(frame<wire::CloseStaging>(id, [](auto& b) { return wire::CreateCloseStaging(b, 1); }));
  add(frame<wire::Drain>(id, [](auto& b) { return wire::CreateDrain(b); }));
  return steps;
}

void write_frame_corpus(const fs::path& dir, const std::string& model_config) {
  fs::create_directories(dir);
  const std::vector<Step> steps = session_steps(model_config);
  Bytes session;
  std::map<std::string, int> seen;
  for (const Step& step : steps) {
    session.insert(session.end(), step.bytes.begin(), step.bytes.end());
    const int n = seen[step.name]++;
    const std::string suffix = n == 0 ? "" : "-" + std::to_string(n + 1);
    // The session up to and including this request.
    write_file(dir / ("session-" + step.name + suffix), session);
    // This request alone (before Hello: refused with not_hello, except Hello itself).
    if (n == 0) write_file(dir / ("alone-" + step.name), step.bytes);
  }
  // Hello for the other configured tenants (dispatch_harness.cpp), then a request.
  for (const char* tenant : {"small", "locked", "nobody"}) {
    Bytes bytes = frame<wire::Hello>(
        1, [&](auto& b) { return wire::CreateHelloDirect(b, 1, 1, tenant, "", "fuzz-seed"); });
    const Bytes open = steps.at(2).bytes;  // RegisterLayout
    bytes.insert(bytes.end(), open.begin(), open.end());
    write_file(dir / (std::string("hello-tenant-") + tenant), bytes);
  }
  std::size_t types = 0;
  protocol::for_each_request([&]<class Request>() {
    if (seen.count(protocol::request_name(protocol::kRequestType<Request>)) != 0) ++types;
  });
  if (types != static_cast<std::size_t>(wire::RequestBody::MAX)) {
    throw std::logic_error("the seed session lacks a request type: add it to session_steps()");
  }
}

/// Parameter bytes (page_input.hpp) for a small layout of `codec`.
Bytes page_params(unsigned codec, bool kda, bool bf16_staged, unsigned variant) {
  Bytes p(statepool::fuzz::kPageParamBytes);
  p[0] = static_cast<std::uint8_t>(codec);
  p[1] = static_cast<std::uint8_t>((kda ? 1u : 0u) | (bf16_staged ? 2u : 0u) | (1u << 2) |
                                   (variant << 4));
  p[2] = 4;                                                    // 2 layers, 2 heads
  p[3] = 15;                                                   // key_dim 16
  p[4] = static_cast<std::uint8_t>(codec % 2 == 0 ? 15 : 22);  // value_dim 16 or 23
  p[5] = 3 | (2 << 3);                                         // 3 conv channels, width 2
  p[6] = static_cast<std::uint8_t>(codec % 3 == 0 ? 0 : 8);    // group 128 or 32
  p[7] = static_cast<std::uint8_t>(codec * 7 + variant);
  return p;
}

/// Calls f(params, name) for every codec, arch and staged dtype: page_input.hpp's parameter
/// bytes and a file name ("int6-kda-bf16").
template <class F>
void for_each_page_params(F&& f) {
  for (unsigned codec = 0; codec < 10; ++codec) {
    for (const bool kda : {false, true}) {
      for (const bool bf16 : {false, true}) {
        const unsigned variant = (codec + (kda ? 1u : 0u)) % 3;
        const std::string name =
            std::string(kernels::to_string(static_cast<kernels::CodecId>(codec))) + "-" +
            (kda ? "kda" : "gdn") + "-" + (bf16 ? "bf16" : "f32");
        f(page_params(codec, kda, bf16, variant), name);
      }
    }
  }
}

void write_page_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  for_each_page_params([&](const Bytes& params, const std::string& name) {
    const auto input = statepool::fuzz::parse_page_input(params);
    const kernels::PageCodec page_codec(input->layout);
    // A deterministic state of moderate values, a few outliers among them.
    std::vector<float> state(page_codec.staged_bytes(kernels::DType::f32) / sizeof(float));
    std::uint64_t x = 0x243F6A8885A308D3ull + params[0];
    for (std::size_t i = 0; i < state.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(x >> 40) / static_cast<float>(1u << 24) - 0.5f;
      state[i] = i % 97 == 0 ? 40.0f * u : u;
    }
    std::vector<std::byte> staged(page_codec.staged_bytes(kernels::DType::f32));
    std::memcpy(staged.data(), state.data(), staged.size() - staged.size() % sizeof(float));
    std::vector<std::byte> page(page_codec.page_bytes());
    page_codec.encode(staged, kernels::DType::f32, page);
    Bytes seed = params;
    for (const std::byte b : page) seed.push_back(std::to_integer<std::uint8_t>(b));
    write_file(dir / name, seed);
  });
}

// Seeds of the shared-memory fuzzer: the page corpus's parameters for every codec, arch and
// staged dtype, a KV stream of each codec, role and dtype, and moderate values to encode
// (fuzz_shared_memory.cpp flips some of them while they are encoded).
void write_shared_memory_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  unsigned kv = 0;
  for_each_page_params([&](const Bytes& params, const std::string& name) {
    Bytes seed = params;
    ++kv;
    seed.push_back(static_cast<std::uint8_t>(kv % 5 | (kv % 2) << 3 | (kv % 3) << 4));
    seed.push_back(static_cast<std::uint8_t>(kv));       // flipped values
    seed.push_back(static_cast<std::uint8_t>(kv * 13));  // their seed
    std::uint64_t x = 0x13198A2E03707344ull + kv;
    for (int i = 0; i < 64; ++i) {  // 64 f32 values in [-2, 2), repeated to fill
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const float v = static_cast<float>(x >> 40) / static_cast<float>(1u << 22) - 2.0f;
      std::uint8_t b[4];
      std::memcpy(b, &v, 4);
      seed.insert(seed.end(), b, b + 4);
    }
    write_file(dir / name, seed);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR MODEL_CONFIG_JSON\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out = argv[1];
    write_frame_corpus(out / "frame", read_text(argv[2]));
    write_page_corpus(out / "page_decode");
    write_shared_memory_corpus(out / "shared_memory");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "statepool_fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
