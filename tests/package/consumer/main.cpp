// What an engine does with the installed client package, without a daemon: builds the
// page format of a layout and round-trips a state through it locally, runs the fused
// decode step on the page, and gets a clear ConnectionError (not a hang, not a crash)
// when no daemon listens.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/decode_step.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"

int main(int argc, char** argv) {
  namespace sc = statepool::client;
  namespace k = statepool::kernels;
  k::StateLayout layout;
  layout.name = "consumer";
  layout.num_layers = 2;
  layout.num_heads = 4;
  layout.key_dim = 16;
  layout.value_dim = 16;
  layout.codec.id = k::CodecId::int8;
  const k::PageCodec codec(layout);
  std::vector<std::byte> state(codec.staged_bytes(k::DType::f32));
  for (std::size_t i = 0; i < state.size() / 4; ++i) {
    const float v = static_cast<float>(i % 17) / 17.0f;
    std::memcpy(state.data() + 4 * i, &v, 4);
  }
  std::vector<std::byte> page(codec.page_bytes());
  codec.encode(state, k::DType::f32, page);
  std::vector<std::byte> back(state.size());
  codec.decode(page, k::DType::f32, back);
  float first = 0;
  std::memcpy(&first, back.data() + 4, 4);
  if (first < 0.05f || first > 0.07f) {
    std::fprintf(stderr, "consumer: decoded %g, expected about 1/17\n", first);
    return 1;
  }

  // One fused step of layer 0 on the page, and the client's form of it refusing an arena
  // that is not mapped.
  std::vector<float> q(4 * 16, 0.25f), keys(4 * 16, 0.25f), v(4 * 16, 1.0f), g(4, -0.1f),
      beta(4, 0.5f), out(4 * 16, 0.0f);
  std::byte* pages[] = {page.data()};
  const k::StepResult stepped = k::fused_step(codec, 0, pages,
                                              {.batch = 1, .q = q, .k = keys, .v = v,
                                               .log_decay = g, .beta = beta, .out = out});
  if (!stepped.ok() || out[0] == 0.0f) {
    std::fprintf(stderr, "consumer: the fused step failed (output %g)\n", out[0]);
    return 1;
  }
  try {
    const sc::Arena unmapped;
    const sc::DecodeStep step(unmapped);
    std::fprintf(stderr, "consumer: DecodeStep accepted an unmapped arena\n");
    return 1;
  } catch (const std::logic_error&) {
  }

  sc::Options options;
  options.socket_path = argc > 1 ? argv[1] : "/nonexistent/statepool.sock";
  options.timeout = std::chrono::milliseconds(2000);
  try {
    (void)sc::Connection::connect(options);
    std::fprintf(stderr, "consumer: connected to %s, expected no daemon there\n",
                 options.socket_path.c_str());
    return 1;
  } catch (const sc::ConnectionError& e) {
    if (e.kind() != sc::ConnectionError::Kind::connect_failed) {
      std::fprintf(stderr, "consumer: %s: %s\n", sc::to_string(e.kind()), e.what());
      return 1;
    }
  }
  std::printf("consumer: page of %zu bytes (%.2fx), no daemon at %s: ok\n", codec.page_bytes(),
              codec.compression_ratio(), options.socket_path.c_str());
  return 0;
}
